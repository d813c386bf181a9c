"""privaudit.attacks.lbfgs: the compact-representation L-BFGS follows torch's (fast, CPU)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from privaudit.attacks.lbfgs import LBFGS, History

Objective = Callable[[torch.Tensor], torch.Tensor]


def rosenbrock(x: torch.Tensor) -> torch.Tensor:
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def least_squares(n: int = 200, k: int = 150) -> tuple[Objective, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    A = torch.randn(n, k, generator=g, dtype=torch.float64) * torch.logspace(0, 1.5, k).double()
    b = torch.randn(n, generator=g, dtype=torch.float64)
    return (lambda x: 0.5 * (A @ x - b).square().sum()), torch.zeros(k, dtype=torch.float64)


def logistic(n: int = 200, k: int = 150) -> tuple[Objective, torch.Tensor]:
    """Ridge logistic regression: smooth, convex and not quadratic (so ``SᵀY`` is not
    symmetric, unlike on least squares)."""
    g = torch.Generator().manual_seed(2)
    A = torch.randn(n, k, generator=g, dtype=torch.float64)
    b = torch.randn(n, generator=g, dtype=torch.float64).sign()
    return (
        lambda x: torch.nn.functional.softplus(-b * (A @ x)).sum() + 0.05 * x.square().sum()
    ), torch.zeros(k, dtype=torch.float64)


def run(
    cls: type, f: Objective, x0: torch.Tensor, steps: int, **kw
) -> tuple[list[torch.Tensor], dict]:
    x = x0.clone().requires_grad_(True)
    opt = cls([x], **kw)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = f(x)
        loss.backward()
        return loss

    path = []
    for _ in range(steps):
        opt.step(closure)
        path.append(x.detach().clone())
    return path, opt.state[x]


def assert_same_path(f: Objective, x0: torch.Tensor, steps: int, rtol: float, **kw) -> None:
    ref, ref_state = run(torch.optim.LBFGS, f, x0, steps, **kw)
    ours, state = run(LBFGS, f, x0, steps, **kw)
    for a, b in zip(ref, ours, strict=True):
        assert (a - b).norm() <= rtol * a.norm()
    assert (state["func_evals"], state["n_iter"]) == (ref_state["func_evals"], ref_state["n_iter"])
    assert ref_state["n_iter"] > 2 * kw["history_size"]  # the FIFO dropped pairs
    assert ref[-1].ne(x0).any()


@pytest.mark.parametrize("line_search_fn", ["strong_wolfe", None])
def test_rosenbrock_iterates_equal_torchs(line_search_fn):
    # Rosenbrock amplifies rounding (torch against itself from x0 + 1e-15 differs by 1e-10
    # after 40 iterations, 1e-3 after 80), so two steps of 20 iterations.
    x0 = torch.rand(300, generator=torch.Generator().manual_seed(0), dtype=torch.float64) / 2
    lr = 1.0 if line_search_fn else 2e-4
    kw = {"history_size": 5, "max_iter": 20, "line_search_fn": line_search_fn, "lr": lr}
    assert_same_path(rosenbrock, x0, 2, 1e-9, **kw)


@pytest.mark.parametrize("problem", [least_squares, logistic])
@pytest.mark.parametrize("line_search_fn", ["strong_wolfe", None])
def test_convex_iterates_equal_torchs(problem, line_search_fn):
    f, x0 = problem()
    lr = 1.0 if line_search_fn else 0.1
    kw = {"history_size": 7, "max_iter": 10, "line_search_fn": line_search_fn, "lr": lr}
    assert_same_path(f, x0, 6, 1e-9, **kw)


def two_loop(g: torch.Tensor, steps: list, diffs: list, gamma: torch.Tensor) -> torch.Tensor:
    """torch.optim.LBFGS's recursion (Nocedal & Wright 2006, Algorithm 7.4), for ``−H g``."""
    ro = [1.0 / y.dot(s) for s, y in zip(steps, diffs, strict=True)]
    al = [None] * len(steps)
    q = g.neg()
    for i in range(len(steps) - 1, -1, -1):
        al[i] = steps[i].dot(q) * ro[i]
        q.add_(diffs[i], alpha=-al[i])
    r = torch.mul(q, gamma)
    for i in range(len(steps)):
        be_i = diffs[i].dot(r) * ro[i]
        r.add_(steps[i], alpha=al[i] - be_i)
    return r


@pytest.mark.parametrize("pushes", [1, 4, 6, 8, 11])  # 8, 11: the ring has wrapped
def test_direction_equals_two_loop(pushes):
    gen = torch.Generator().manual_seed(pushes)
    n, m = 40, 6
    Q = torch.randn(n, n, generator=gen, dtype=torch.float64)
    A = Q @ Q.T / n + 0.1 * torch.eye(n, dtype=torch.float64)  # SPD, so sᵀy > 0
    hist = History.empty(torch.zeros(n, dtype=torch.float64))
    steps, diffs = [], []
    for _ in range(pushes):
        s = torch.randn(n, generator=gen, dtype=torch.float64)
        y = A @ s + 0.01 * torch.randn(n, generator=gen, dtype=torch.float64)
        hist.push(s, y, m)
        steps, diffs = (steps + [s])[-m:], (diffs + [y])[-m:]
    gamma = steps[-1].dot(diffs[-1]) / diffs[-1].dot(diffs[-1])
    g = torch.randn(n, generator=gen, dtype=torch.float64)
    ref = two_loop(g, steps, diffs, gamma)
    torch.testing.assert_close(hist.direction(g, gamma), ref, rtol=1e-10, atol=1e-12)
    assert hist.num == min(pushes, m)
    torch.testing.assert_close(hist.window()[:, 0], torch.stack(steps), rtol=0, atol=0)


def test_reaches_rosenbrock_minimum():
    x0 = torch.full((30,), -1.0, dtype=torch.float64)
    x0[::2] = -1.2  # the classic start, far from the valley floor
    kw = {"line_search_fn": "strong_wolfe", "tolerance_change": 1e-15, "tolerance_grad": 1e-12}
    path, state = run(LBFGS, rosenbrock, x0, 20, **kw)
    assert rosenbrock(path[-1]) < 1e-14
    torch.testing.assert_close(path[-1], torch.ones(30, dtype=torch.float64), rtol=0, atol=1e-7)
    assert state["n_iter"] < 400


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_state_dict_round_trip_continues_the_same_path(dtype):
    f, x0 = logistic()
    objective = (lambda x: f(x.double())) if dtype == torch.float32 else f
    kw = {"history_size": 4, "max_iter": 5, "line_search_fn": "strong_wolfe"}

    def closure_for(x: torch.Tensor, opt: LBFGS):
        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = objective(x)
            loss.backward()
            return loss

        return closure

    a = x0.to(dtype).requires_grad_(True)
    opt = LBFGS([a], **kw)
    for _ in range(3):
        opt.step(closure_for(a, opt))
    b = a.detach().clone().requires_grad_(True)
    opt_b = LBFGS([b], **kw)
    opt_b.load_state_dict(copy.deepcopy(opt.state_dict()))  # as torch.save/load would
    # load_state_dict casts float64 Gram matrices to float32 params' dtype: rebuilt from pairs
    assert opt_b.state[b]["gram"].dtype == dtype
    for _ in range(3):
        opt.step(closure_for(a, opt))
        opt_b.step(closure_for(b, opt_b))
    assert opt_b.state[b]["gram"].dtype == torch.float64
    rtol = 1e-12 if dtype == torch.float64 else 1e-4
    assert (a - b).norm() <= rtol * a.norm()
    assert opt.state[a]["func_evals"] == opt_b.state[b]["func_evals"]
