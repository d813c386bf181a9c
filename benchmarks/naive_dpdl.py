"""DPDL written as a straightforward per-agent Python loop: the simulator's speed baseline.

The equations are those of ``defenses/dpdl.py`` (the paper's eqs. (8)–(22)),
written the way one would from the paper: every agent in turn, every neighbour in turn,
every example in turn (one ``torch.autograd.grad`` per example, the micro-batch form of
per-example clipping in Abadi et al. 2016), one ``nn.Module`` whose parameters are loaded
from whichever model is needed. ``per_example="vmap"`` is a stronger loop: the agents and
pairs are still looped over in Python, but each pair's per-example gradients are one
``torch.func`` call.

It shares no code with the simulator beyond the model definition, ``DPDLParams`` and the
batch sampling (:mod:`privaudit.core.sampling`): the batches come in as arguments (the indices the
simulator recorded as secrets, or :func:`privaudit.core.sampling.poisson` draws), so both engines
can be fed the same batches and their messages compared (``benchmarks/run.py``,
``tests/test_benchmarks.py``). A batch holds only its real examples (Poisson: any number, 0
included); every batch mean divides by the expected size B, as the simulator's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

Messages = dict[tuple[int, int, str], Tensor]  # (src, dst, kind) -> payload


class NaiveDPDL:
    """N agents, each with its own flat model ``xs[i]`` and momentum ``vs[i]``.

    ``W`` is the (N, N) mixing matrix (self weights on the diagonal), ``p`` a ``DPDLParams``,
    ``batch_size`` the expected batch size B (the denominator of every batch mean).
    ``noise(j, i, D)`` draws z^{ji} ~ N(0, I) for the pair (model j, data i); omit it (or
    set ``p.sigma = 0``) for the un-noised messages.
    """

    def __init__(
        self,
        model: nn.Module,
        x0: Tensor,
        W: Tensor,
        p,
        batch_size: int,
        per_example: str = "loop",
        noise: Callable[[int, int, int], Tensor] | None = None,
    ):
        self.model, self.p, self.noise, self.batch_size = model, p, noise, batch_size
        self.n = W.shape[0]
        self.W = W.to(x0.dtype)
        self.neighbours = [
            [j for j in range(self.n) if j != i and self.W[i, j] > 0] for i in range(self.n)
        ]
        self.xs = [x0.clone() for _ in range(self.n)]
        self.vs = [torch.zeros_like(x0) for _ in range(self.n)]
        self.params = [q for q in model.parameters()]
        self.names = [name for name, _ in model.named_parameters()]
        self.per_example = per_example
        if per_example == "vmap":

            def loss(named, x, y):
                return F.cross_entropy(functional_call(model, named, (x[None],)), y[None])

            self._vmapped = vmap(grad(loss), in_dims=(None, 0, 0))

    # -- one agent's local computation -------------------------------------------------
    def _load(self, flat: Tensor) -> None:
        torch.nn.utils.vector_to_parameters(flat, self.params)

    def example_grads(self, flat: Tensor, x: Tensor, y: Tensor) -> list[Tensor]:
        """∇F(x^j; ξ_b) for every example b of the batch, (8): one flat tensor each."""
        if x.shape[0] == 0:
            return []
        if self.per_example == "vmap":
            named = {n: q for n, q in zip(self.names, self._split(flat), strict=True)}
            g = self._vmapped(named, x, y)
            rows = torch.cat([g[n].reshape(x.shape[0], -1) for n in self.names], dim=1)
            return list(rows)
        self._load(flat)
        out = []
        for b in range(x.shape[0]):
            loss = F.cross_entropy(self.model(x[b : b + 1]), y[b : b + 1])
            gs = torch.autograd.grad(loss, self.params)
            out.append(torch.cat([g.reshape(-1) for g in gs]))
        return out

    def _split(self, flat: Tensor) -> list[Tensor]:
        out, k = [], 0
        for q in self.params:
            out.append(flat[k : k + q.numel()].view_as(q))
            k += q.numel()
        return out

    def clipped_sum(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """Σ_b clip_C(∇F(x^j; ξ_b)), (9); the plain sum when ``clip`` is None."""
        total = torch.zeros_like(flat)
        for g in self.example_grads(flat, x, y):
            if self.p.clip is not None:
                g = g * min(1.0, float(self.p.clip / (g.norm() + 1e-12)))
            total = total + g
        return total

    def coef(self, i: int, j: int) -> float:
        """Weight of a received (or the self) cross-gradient in (17)."""
        w = float(self.W[i, j])
        if self.p.cross_coef == "sqrt":
            return 1.0 / (w**0.5 * self.n)
        if self.p.cross_coef == "w":
            return w
        return 1.0 / (len(self.neighbours[i]) + 1)

    # -- one round ----------------------------------------------------------------------
    def round(self, batches: list[tuple[Tensor, Tensor]]) -> Messages:
        """Advance every agent one round on its batch ``batches[i]``; returns the messages."""
        p, n = self.p, self.n
        msgs: Messages = {}
        noisy: dict[tuple[int, int], Tensor] = {}  # (model owner j, data owner i) -> g̈^{ji}
        clean_self: list[Tensor] = []
        B = self.batch_size
        for i in range(n):
            x, y = batches[i]
            for j in self.neighbours[i]:
                msgs[(i, j, "model")] = self.xs[i].clone()  # 1. send the model
            for j in [i, *self.neighbours[i]]:  # (8)–(10) at x^j, on i's batch
                s = self.clipped_sum(self.xs[j], x, y)
                if j == i:
                    clean_self.append(s / B)  # (14)
                if p.sigma > 0 and self.noise is not None:
                    s = s + self.noise(j, i, s.numel()) * (p.sigma * p.clip)
                noisy[(j, i)] = s / B
                if j != i:
                    msgs[(i, j, "cg")] = noisy[(j, i)]  # 3. exchange
        v_half, x_half = [], []
        for i in range(n):
            g_tilde = torch.zeros_like(self.xs[i])
            calib = 0.0
            for j in [i, *self.neighbours[i]]:
                received = noisy[(i, j)]  # j's batch at i's model (g̈^{ij})
                c = torch.sigmoid(-F.cosine_similarity(received, clean_self[i], dim=0))  # (16)
                g_tilde = g_tilde + self.coef(i, j) * received  # (17)(18)
                calib = calib + float(self.W[i, j]) * c
            g_tilde = g_tilde + p.calib_alpha * calib * clean_self[i]
            v_half.append(p.momentum * self.vs[i] + g_tilde)  # (19)
            x_half.append(self.xs[i] - p.lr * v_half[i])  # (20)
            for j in self.neighbours[i]:
                msgs[(i, j, "mm")] = v_half[i].clone()
                msgs[(i, j, "half-model")] = x_half[i].clone()
        for i in range(n):  # (21)(22)
            self.vs[i] = sum(self.W[i, j] * v_half[j] for j in [i, *self.neighbours[i]])
            self.xs[i] = sum(self.W[i, j] * x_half[j] for j in [i, *self.neighbours[i]])
        return msgs


# --------------------------------------------------------------------------- checks


def _dpdl_run(root, agents: int, rounds: int, sigma: float | None, device: str, seed: int = 0):
    """A DPDL run (default model and data) with every message of every round captured."""
    from privaudit.core.config import RunConfig
    from privaudit.core.messages import CaptureSpec
    from privaudit.sim.run import Run

    eps = None if sigma is not None else 1.0
    cfg = RunConfig(
        defense="dpdl",
        agents=agents,
        rounds=rounds,
        epsilon=eps,
        sigma=sigma,
        seed=seed,
        device=device,
        checkpoint_every=rounds,
    )
    run = Run.create(cfg, root)
    spec = CaptureSpec.of(rounds=range(1, rounds + 1))
    run.train(capture=spec, progress=False)
    return run, run.messages(spec, progress=False)


def _batches(run, t: int) -> list[tuple[Tensor, Tensor]]:
    """The simulator's recorded batches of round ``t`` (its secrets), one per agent: only
    the real examples."""
    idx = [run.secret_index(t, i).to(run.ctx.device) for i in range(run.cfg.agents)]
    return [(run.ctx.train_x[row], run.ctx.train_y[row]) for row in idx]


def naive_for(run, per_example: str = "loop", noise=None) -> NaiveDPDL:
    import copy

    return NaiveDPDL(
        copy.deepcopy(run.ctx.model),
        run.ctx.x0,
        run.ctx.W,
        run.params,
        run.cfg.batch_size,
        per_example=per_example,
        noise=noise,
    )


def compare_clean(root, agents: int, rounds: int, device: str = "cpu") -> dict:
    """Simulator vs naive loop on the same batches with clipping on and no noise (σ = 0):
    every message of every round and link. Returns the count and the worst relative error
    ``max|naive − sim| / max|sim|`` over messages."""
    run, sim = _dpdl_run(root, agents, rounds, 0.0, device)
    naive = naive_for(run)
    worst, count = 0.0, 0
    for t in range(1, rounds + 1):
        ours = naive.round(_batches(run, t))
        theirs = {k[1:]: v for k, v in sim.items() if k[0] == t}
        if set(ours) != set(theirs):
            raise AssertionError(
                f"round {t}: message sets differ ({len(ours)} naive, {len(theirs)} simulator)"
            )
        for key, v in ours.items():
            ref = theirs[key].to(v.device)
            err = float((v - ref).abs().max()) / max(float(ref.abs().max()), 1e-30)
            worst, count = max(worst, err), count + 1
    return {"messages": count, "max_rel_err": worst}


def noise_residual(root, agents: int, rounds: int, device: str = "cpu") -> dict:
    """With noise on (σ from ε = 1): each captured cross-gradient minus the naive loop's
    clean clipped mean of the sender's recorded batch at the receiver's model (the ``model``
    message on the reverse link) is the noise z/B alone; its std should be σC/B."""
    run, sim = _dpdl_run(root, agents, rounds, None, device)
    naive, p = naive_for(run), run.params
    res = []
    for t in range(1, rounds + 1):
        batches = _batches(run, t)
        for (tt, i, j, kind), msg in sim.items():
            if tt != t or kind != "cg":
                continue
            x, y = batches[i]
            model_j = sim[(t, j, i, "model")].to(x.device)
            res.append(msg.to(x.device) - naive.clipped_sum(model_j, x, y) / naive.batch_size)
    z = torch.cat(res)
    expected = p.sigma * p.clip / run.cfg.batch_size
    return {
        "std": float(z.std()),
        "mean": float(z.mean()),
        "expected_std": expected,
        "std_ratio": float(z.std()) / expected,
        "values": z.numel(),
        "sigma": p.sigma,
    }
