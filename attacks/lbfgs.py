"""torch's L-BFGS with the search direction from the compact representation of ``H_k``.

:class:`LBFGS` is ``torch.optim.LBFGS`` — same constructor and defaults, stopping rules,
memory rule (a pair is kept when ``sᵀy > 1e-10``; FIFO of ``history_size``), scaling
``γ = sᵀy / yᵀy`` of the newest pair, strong-Wolfe line search (torch's own
``_strong_wolfe``) and per-step state — with one change: ``d = −H_k g`` comes from the compact
form of the inverse L-BFGS matrix (Byrd, Nocedal & Schnabel 1994, "Representations of
quasi-Newton matrices and their use in limited memory methods", Math. Prog. 63, eq. 3.1/3.2;
Nocedal & Wright 2006, *Numerical Optimization*, eq. 7.24)::

    H = γI + [S  γY] M [Sᵀ; γYᵀ],   M = [[R⁻ᵀ(D + γYᵀY)R⁻¹, −R⁻ᵀ], [−R⁻¹, 0]],

with ``S``, ``Y`` the stored steps and gradient differences, ``R`` the upper triangle of
``SᵀY`` and ``D`` its diagonal, instead of the two-loop recursion. Why: the recursion costs
``4m`` Python-level ``dot``/``add_`` calls per iteration, which dominate on small problems
(DLG on one 32×32 image, ``m = 100``, where the closure itself is cheap); here a direction
is one product with the stacked ``[S Y]``, two ``m × m`` triangular solves and one product
back, and ``SᵀY``, ``YᵀY`` gain a row and a column in ``O(mn)`` when a pair enters (the
oldest's are dropped). ``H`` is the same matrix, so iterates equal torch's up to
floating-point rounding (which, as for any change of summation order, grows along
ill-conditioned paths: on Rosenbrock torch against itself from a start moved by 1e-15 drifts
as much).

The pairs live in a ring buffer of at most ``history_size`` rows ``(s, y)`` in the
parameters' dtype and device (the memory of torch's lists); ``SᵀY`` and ``YᵀY`` are kept in
float64, oldest first, for the small algebra. No host sync is added to torch's step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.optim.lbfgs import _strong_wolfe

__all__ = ["LBFGS"]


class History:
    """The L-BFGS memory: ``pairs[k] = (s, y)`` in a ring (``first`` is the oldest slot) and
    ``gram = (SᵀY, YᵀY)`` (float64, oldest first), so ``gram[0][i, j] = sᵢᵀyⱼ``."""

    def __init__(self, pairs: Tensor, num: int, first: int, gram: Tensor) -> None:
        self.pairs, self.num, self.first, self.gram = pairs, num, first, gram

    @classmethod
    def empty(cls, like: Tensor) -> History:
        gram = torch.zeros(2, 0, 0, dtype=torch.float64, device=like.device)
        return cls(like.new_empty(1, 2, like.numel()), 0, 0, gram)

    @classmethod
    def from_state(cls, state: dict) -> History:
        h = cls(state["pairs"], state["num_old"], state["first_old"], state["gram"])
        if h.gram.dtype != torch.float64:  # cast to the parameters' dtype by load_state_dict
            s, y = h.window().double().unbind(1)
            h.gram = torch.stack((s @ y.T, y @ y.T))
        return h

    def to_state(self, state: dict) -> None:
        state.update(pairs=self.pairs, num_old=self.num, first_old=self.first, gram=self.gram)

    def window(self) -> Tensor:
        """The pairs, oldest first (a copy when the ring has wrapped)."""
        w = self.pairs[: self.num]
        return w.roll(-self.first, 0) if self.first else w

    def push(self, s: Tensor, y: Tensor, history_size: int) -> None:
        """Append ``(s, y)``, dropping the oldest pair when ``history_size`` are kept; the new
        row and column of ``SᵀY`` and ``YᵀY`` cost one ``2 × n`` by ``n × 2m`` product."""
        if self.num == history_size:
            slot = self.first
            self.first = (self.first + 1) % history_size
            keep = slice(1, None)
        else:
            if self.num == self.pairs.shape[0]:  # grow geometrically up to history_size
                grown = self.pairs.new_empty(min(2 * self.num, history_size), *self.pairs.shape[1:])
                grown[: self.num] = self.pairs
                self.pairs = grown
            slot = self.num
            self.num += 1
            keep = slice(None)
        torch.stack((s, y), out=self.pairs[slot])
        m = self.num
        # p[b, k, a] = (s, y)_new[b] · (s, y)_k[a], oldest first (this operand order is the
        # fast one for MKL's thin products)
        p = torch.mm(self.pairs[slot], self.pairs[:m].view(2 * m, -1).T).view(2, m, 2).double()
        if self.first:
            p = p.roll(-self.first, 1)
        gram = self.gram.new_empty(2, m, m)
        gram[:, :-1, :-1] = self.gram[:, keep, keep]
        gram[:, :, -1] = p[1].T  # sₖᵀy_new, yₖᵀy_new
        gram[:, -1, :] = p[:, :, 1]  # s_newᵀyₖ, y_newᵀyₖ
        self.gram = gram

    def direction(self, g: Tensor, gamma: Tensor | float) -> Tensor:
        """``−H g`` by the compact representation (Byrd et al. 1994, eq. 3.1/3.2)."""
        m = self.num
        if m == 0:
            return g.mul(-gamma)
        W = self.pairs[:m].view(2 * m, -1)  # rows s₀, y₀, s₁, y₁, … in slot order
        v = torch.mv(W, g).view(m, 2).double()
        if self.first:
            v = v.roll(-self.first, 0)
        a, b = v[:, :1], v[:, 1:]  # Sᵀg, Yᵀg
        SY, YY = self.gram
        gamma64 = torch.as_tensor(gamma, dtype=torch.float64, device=g.device)
        u = torch.linalg.solve_triangular(SY, a, upper=True)  # R⁻¹Sᵀg (R: SY's upper half)
        z = torch.addcmul(u * SY.diagonal()[:, None], torch.addmm(b, YY, u, beta=-1), gamma64)
        w = torch.linalg.solve_triangular(SY.mT, z, upper=False)  # R⁻ᵀ((D + γYᵀY)u − γYᵀg)
        c = torch.cat((w, u * -gamma64), 1)  # −Hg = −γg − (S w − γ Y u)
        if self.first:
            c = c.roll(self.first, 0)
        return torch.addmv(g.mul(gamma), W.T, c.view(-1).to(g.dtype), beta=-1, alpha=-1)


class LBFGS(torch.optim.LBFGS):
    """``torch.optim.LBFGS`` with ``−H_k g`` from the compact representation (see the module
    docstring). State: torch's ``func_evals``, ``n_iter``, ``d``, ``t``, ``H_diag``,
    ``prev_flat_grad``, ``prev_loss``; the memory is ``pairs``, ``num_old``, ``first_old`` and
    ``gram`` instead of ``old_dirs``, ``old_stps``, ``ro`` and ``al`` (a state without them,
    such as torch's, restarts the memory). As with torch's, ``load_state_dict`` shares the
    tensors of the dict it is given, which later steps update in place."""

    def _gather_flat_grad(self) -> Tensor:
        """torch's flat gradient, by ``reshape``: a gradient that autograd returns in
        channels-last layout (:mod:`.compiled`'s convolutions, several images at once) has
        no flat view, and torch's ``view(-1)`` raises on it."""
        flat = [
            p.new_zeros(p.numel()) if p.grad is None else p.grad.reshape(-1) for p in self._params
        ]
        return torch.cat(flat, 0)

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor]) -> Tensor:  # type: ignore[override]
        """One L-BFGS step: torch's ``LBFGS.step`` line for line, but for the direction
        (:meth:`_descent`); its line search or fixed step is :meth:`_move` and its stopping
        rules :meth:`_converged`."""
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")
        closure = torch.enable_grad()(closure)
        if len(self._params) == 0:
            return closure()

        group = self.param_groups[0]
        lr = group["lr"]
        if isinstance(lr, Tensor) and lr.dim() != 0:
            lr = lr.squeeze()
        max_iter = group["max_iter"]
        max_eval = group["max_eval"]
        tolerance_grad = group["tolerance_grad"]
        tolerance_change = group["tolerance_change"]
        maximize = group.get("maximize", False)

        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        orig_loss = closure()
        loss = -float(orig_loss) if maximize else float(orig_loss)
        current_evals = 1
        state["func_evals"] += 1

        flat_grad = self._gather_flat_grad()
        opt_cond = flat_grad.abs().max() <= tolerance_grad
        if opt_cond:
            return orig_loss

        d = state.get("d")
        t = state.get("t")
        H_diag = state.get("H_diag")
        prev_flat_grad = state.get("prev_flat_grad")
        prev_loss = state.get("prev_loss")
        hist = History.from_state(state) if "pairs" in state else None

        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1

            # compute the descent direction
            if state["n_iter"] == 1 or hist is None:
                d, H_diag, hist = flat_grad.neg(), 1, History.empty(flat_grad)
            else:
                d, H_diag = self._descent(hist, flat_grad, prev_flat_grad, d, t, H_diag)

            if prev_flat_grad is None:
                prev_flat_grad = flat_grad.clone(memory_format=torch.contiguous_format)
            else:
                prev_flat_grad.copy_(flat_grad)
            prev_loss = loss

            # compute the step length
            if state["n_iter"] == 1:
                t = min(1.0, 1.0 / flat_grad.abs().sum()) * lr
            else:
                t = lr

            gtd = flat_grad.dot(d)
            if gtd > -tolerance_change:
                break

            last = n_iter == max_iter
            budget = max_eval - current_evals
            loss, flat_grad, t, opt_cond, ls_func_evals = self._move(
                closure, loss, flat_grad, t, d, gtd, budget, last
            )
            current_evals += ls_func_evals
            state["func_evals"] += ls_func_evals

            if self._converged(n_iter, current_evals, opt_cond, d, t, loss, prev_loss):
                break

        state["d"] = d
        state["t"] = t
        state["H_diag"] = H_diag
        state["prev_flat_grad"] = prev_flat_grad
        state["prev_loss"] = prev_loss
        hist.to_state(state)
        return orig_loss

    def _descent(
        self,
        hist: History,
        flat_grad: Tensor,
        prev_flat_grad: Tensor,
        d: Tensor,
        t: Tensor | float,
        H_diag: Tensor | float,
    ) -> tuple[Tensor, Tensor | float]:
        """torch's memory update and direction after the first iteration: the pair
        ``(s, y) = (t d, g − g_prev)`` of the last step enters the memory when
        ``sᵀy > 1e-10`` (and then ``γ = sᵀy / yᵀy``); the direction ``−H g`` comes from the
        compact representation (:meth:`History.direction`) instead of the two-loop
        recursion. Returns ``(d, γ)``."""
        y = flat_grad.sub(prev_flat_grad)
        s = d.mul(t)
        ys = y.dot(s)
        if ys > 1e-10:
            hist.push(s, y, self.param_groups[0]["history_size"])
            H_diag = ys / y.dot(y)
        return hist.direction(flat_grad, H_diag), H_diag

    def _move(
        self,
        closure: Callable[[], Tensor],
        loss: float,
        flat_grad: Tensor,
        t: Tensor | float,
        d: Tensor,
        gtd: Tensor,
        budget: int,
        last: bool,
    ) -> tuple[float, Tensor, Tensor | float, Tensor | bool, int]:
        """torch's step along ``d``: with ``line_search_fn="strong_wolfe"`` torch's strong-Wolfe
        search from step ``t`` (at most ``budget`` evaluations), else the fixed step ``t`` and,
        unless this is the ``last`` iteration, one evaluation at the new point (torch skips it
        there: in a stochastic setting it is of no use). Returns ``(loss, flat_grad, t,
        opt_cond, evaluations)``; ``opt_cond`` (the gradient within ``tolerance_grad``) is
        False when nothing was evaluated, as torch's is then (a True one ended the loop)."""
        group = self.param_groups[0]
        line_search_fn = group["line_search_fn"]
        if line_search_fn is not None:
            if line_search_fn != "strong_wolfe":
                raise RuntimeError("only 'strong_wolfe' is supported")
            x_init = self._clone_param()

            def obj_func(x, t, d):
                return self._directional_evaluate(closure, x, t, d)

            loss, flat_grad, t, ls_func_evals = _strong_wolfe(
                obj_func, x_init, t, d, loss, flat_grad, gtd, max_ls=budget
            )
            self._add_grad(t, d)
            opt_cond = flat_grad.abs().max() <= group["tolerance_grad"]
            return loss, flat_grad, t, opt_cond, ls_func_evals
        self._add_grad(t, d)
        if last:
            return loss, flat_grad, t, False, 0
        with torch.enable_grad():
            loss = closure()
        loss = -float(loss) if group.get("maximize", False) else float(loss)
        flat_grad = self._gather_flat_grad()
        return loss, flat_grad, t, flat_grad.abs().max() <= group["tolerance_grad"], 1

    def _converged(
        self,
        n_iter: int,
        current_evals: int,
        opt_cond: Tensor | bool,
        d: Tensor,
        t: Tensor | float,
        loss: float,
        prev_loss: float,
    ) -> bool:
        """torch's stopping conditions, in torch's order: ``max_iter`` iterations or
        ``max_eval`` evaluations spent, the gradient within ``tolerance_grad``, or no progress
        (the step ``t d`` or the change of the loss within ``tolerance_change``)."""
        group = self.param_groups[0]
        tolerance_change = group["tolerance_change"]
        if n_iter == group["max_iter"]:
            return True
        if current_evals >= group["max_eval"]:
            return True
        if opt_cond:
            return True
        if d.mul(t).abs().max() <= tolerance_change:
            return True
        return abs(loss - prev_loss) < tolerance_change
