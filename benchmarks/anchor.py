"""Reproduce El Mrini, Cyffers & Bellet (ICML 2024, "Privacy Attacks in Decentralized
Learning", §5 and Fig. 4–6) on their small D-GD settings, with this project's gossip algebra —
and, given their code, beside it.

Their setting (the decAttack repository's ``exp_fig_4a.py``/``exp_fig6.py``): one fixed
example per agent, full-batch gradient steps of step size η (D-GD, adapt-then-combine:
x̃_t = W x̃_{t-1} − η ∇f_k(x^k_{t-1}), every agent sends x̃_t), a line graph with the
attacker at an end, the "Laplacian" gossip matrix W = I − L / d_max, T = n rounds, a model
whose first layer is linear (one linear layer on 3×32×32 images) and the gradient inverted
in closed form. The attack rests on their gradient-similarity approximation: every
non-attacker's gradient is taken to be the same in every round, so the neighbours' T
messages are linear in n − |A| unknown gradients.

Here: the same recursion (:func:`privaudit.core.recursion.dpsgd`), the tied knowledge system
with the coalition's own values subtracted (:func:`privaudit.attacks.gossip_algebra.knowledge` with
``tied`` and ``cut``; the tie's error is stated in :func:`privaudit.attacks.gossip_algebra.tie`),
solved two ways —

- ``ours`` (privaudit's default): the float identifiability (row-scaled QR rank at the
  rounding of K itself, leverage), the solve of every identifiable victim around x_0, and
  each victim's estimated rounding error (a victim whose error reaches its own size is
  ``hidden``); up to ten more solves with the drift forecast subtracted (:class:`Forecast`:
  the run re-simulated from the recovered gradients, through
  :func:`privaudit.attacks.gossip_drift.solve_tied`, which checks every solve by that
  re-run against the messages and uses a forecast only where it explains them 10× better
  than the tie); the gradient inverted by the reliable-rows rule
  (:func:`attacks.analytic.combine`);
- ``lstsq``: the anchor's solver, the min-norm least squares of the same tied system
  (NumPy ``lstsq``, default cut-off), which returns a value for every victim, inverted by
  their largest-|∂b| row —

scored by PSNR against the images, per hop distance from the coalition (one table per run).

``--decattack PATH`` instead runs **the anchor's own code** (a checkout of
github.com/AbdellahElmrini/decAttack: its ``Decentralized`` simulation, its
``ReconstructOptim.reconstruct_LS_target_only`` least squares and its
``invert_gradient_FC_Model`` inversion, unchanged; only its data loading is replaced) in a
subprocess, beside **privaudit's command line**: for each image set (``--seed``), graph and
η, a run trained by ``privaudit train --model linear --examples-per-agent 1 --sampling full
--precision float64 --gossip laplacian`` (:func:`train_run`), attacked as ``privaudit
attack -a tie=true --attack analytic`` does (:func:`run_attack`: the tied system, its drift
forecast, the closed-form inversion). The anchor's code gets the run's own examples
(normalised by the dataset's mean and std, as the anchor's data loading normalises), graph,
W = I − L/d_max, η, T = n and initial weights, with the attackers relabelled first, as its
code assumes. It prints the victims recovered at ≥ ``--good`` dB over ``--sets`` image sets
for a line of n (attacker at an end), a ring (two attackers) and an Erdős–Rényi graph
(one), how far the run's messages are from the anchor's, and each side's D-GD simulation
time (the anchor's against :func:`dgd`); ``--markdown`` writes the table the docs show
(``python benchmarks/figures.py --only anchor``). Its requirements (numpy, networkx, scipy,
matplotlib, torch, torchvision) are not privaudit's: install the missing ones into a
folder of their own and name it with ``--decattack-deps`` (docs/threat-models.md).

    python benchmarks/anchor.py [--agents 16] [--lrs 1e-5,1e-4,1e-3,1e-2]
        [--gossip laplacian|mh] [--settings line:0,ring:0+4] [--rounds T]
        [--dataset photos|mnist|cifar10 --data-root DIR] [--json FILE]
    python benchmarks/anchor.py --decattack PATH [--decattack-deps DIR] [--agents 35]
        [--sets 3] [--markdown FILE]

Fig. 6's setting: ``--agents 35 --lrs 1e-5 --settings line:0``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: small dense LAPACK calls

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from privaudit.api.gossip import identifiable_victims, observe_beyond  # noqa: E402
from privaudit.attacks.analytic import recover  # noqa: E402
from privaudit.attacks.gossip_algebra import (  # noqa: E402
    dpsgd,
    gossip_messages,
    identifiability,
    knowledge,
    tie,
)
from privaudit.attacks.gossip_drift import PASSES, TRUSTS, solve_tied  # noqa: E402
from privaudit.cli import main as cli  # noqa: E402
from privaudit.core.messages import CaptureSpec  # noqa: E402
from privaudit.core.observation import Observation  # noqa: E402
from privaudit.scenario.data import load_dataset  # noqa: E402
from privaudit.scenario.topology import build_topology, distances  # noqa: E402
from privaudit.scenario.topology import gossip_matrix as topology_gossip  # noqa: E402
from privaudit.sim.run import Run  # noqa: E402


def gossip_matrix(adj: Tensor, kind: str) -> np.ndarray:
    """``laplacian``: the anchor's W = I − L / d_max (decAttack's ``LaplacianGossipMatrix``);
    ``mh``: this project's Metropolis–Hastings weights (:data:`~privaudit.scenario.topology.
    GOSSIP_MATRICES`, a run's ``--gossip``)."""
    return topology_gossip(kind, adj).numpy()


def linear_model(input_shape: tuple[int, ...], classes: int, seed: int) -> nn.Module:
    """The anchor's model of Fig. 4a/6: one linear layer on the flattened image (float64)."""
    torch.manual_seed(seed)
    numel = int(np.prod(input_shape))
    return nn.Sequential(nn.Flatten(), nn.Linear(numel, classes)).double()


def flat(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def unflat(model: nn.Module, v: Tensor) -> dict[str, Tensor]:
    out, i = {}, 0
    for name, p in model.named_parameters():
        out[name] = v[i : i + p.numel()].reshape(p.shape)
        i += p.numel()
    return out


def dgd(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    W: np.ndarray,
    lr: float,
    rounds: int,
    hold: dict[int, Tensor] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run D-GD, adapt-then-combine, every agent from the model's x_0 on its one example:
    x̃_1 = x_0 − η g_1, x̃_t = W x̃_{t-1} − η g_t with g^k_t = ∇ CE(x^k_{t-1}; example k) at
    x^k_{t-1} = (W x̃_{t-1})_k. Returns the sent half-steps (T + 1, n, d) (index 0: x_0, the
    shared initial model) and the gradients (T, n, d).

    ``model`` is the anchor's (:func:`linear_model`: Flatten, then one Linear layer). Per
    round, every agent's logits are one batched product with its own weights (n × C × D
    against n × D) and every agent's gradient one backward pass of the summed losses — each
    agent's loss depends on its own parameters only, so the sum's gradient is each agent's
    own (autograd, no hand-derived formula); the states are one (T + 1, n, d) buffer.
    ``hold``: agents whose gradient is the given vector in every round instead (their
    example is not read)."""
    layer = model[1]
    if not isinstance(layer, nn.Linear) or len(model) != 2:
        raise ValueError("dgd simulates the anchor's model: Flatten, then one Linear layer")
    n = len(images)
    C, D = layer.out_features, layer.in_features
    x0 = flat(model)
    X = images.reshape(n, -1).to(x0.dtype)
    Wt = torch.from_numpy(W)
    sent = torch.empty(rounds + 1, n, x0.numel(), dtype=x0.dtype)
    grads = torch.empty(rounds, n, x0.numel(), dtype=x0.dtype)
    sent[0] = x0
    for t in range(1, rounds + 1):
        at = (sent[0] if t == 1 else Wt @ sent[t - 1]).requires_grad_(True)
        weight, bias = at[:, : C * D].view(n, C, D), at[:, C * D :]
        logits = torch.bmm(weight, X[:, :, None])[:, :, 0] + bias
        loss = nn.functional.cross_entropy(logits, labels, reduction="sum")
        (grads[t - 1],) = torch.autograd.grad(loss, at)
        for k, g in (hold or {}).items():
            grads[t - 1, k] = g
        with torch.no_grad():
            torch.sub(at, grads[t - 1], alpha=lr, out=sent[t])
    return sent.numpy(), grads.numpy()


def attack(
    sent: np.ndarray,
    adj: Tensor,
    W: np.ndarray,
    lr: float,
    members: list[int],
    solver: str = "ours",
    rtol: float | None = None,
    max_error: float | None = 1.0,
    report: dict[int, float] | None = None,
    drift: Forecast | None = None,
    passes: int = PASSES,
) -> dict[int, np.ndarray]:
    """Each non-member's round-1 gradient from the coalition's recorded messages, on the tied
    system with the coalition's own values subtracted (``cut``: one unknown gradient per
    non-member over the rounds, the members' states known). ``ours``: identifiable victims
    only (row-scaled QR rank at ``rtol``, None: :func:`~privaudit.attacks.gossip_algebra.
    default_rtol`), solved around x_0; a victim whose estimated rounding error
    (:func:`~privaudit.attacks.gossip_algebra.float_error`) is at least ``max_error`` times its RMS
    is left out as lost to rounding (None: kept). With a ``drift`` :class:`Forecast`, up to
    ``passes`` re-solves with the drift it forecasts subtracted
    (:func:`~privaudit.attacks.gossip_drift.solve_tied`: each solve checked by re-running the
    training from it against the messages, a forecast used only while that misfit falls and
    where it explains the messages 10× better than the tie). ``report``: filled
    with each returned victim's relative rounding error. ``lstsq``: min-norm least squares
    of the same system, every victim (the anchor's ``np.linalg.lstsq``)."""
    T, n = sent.shape[0] - 1, sent.shape[1]
    rec = dpsgd(W, lr)
    inside = set(members)
    others = [k for k in range(n) if k not in inside]
    rows = gossip_messages(adj, members, range(1, T + 1), own=("x",))
    untied = knowledge(
        rec, members, rows, rounds=T, known=lambda k: k[0] in rec.public or k[1] in inside, cut=True
    )
    system = tie(untied, others)
    x0 = sent[0, 0]
    observed = system.observed(sent)
    known = system.known_from(sent, lambda key: x0)
    if solver == "lstsq":
        y = system.rhs(observed, known, reference=x0)
        sol = np.linalg.lstsq(system.K.toarray(), y, rcond=None)[0]
        return {v: sol[system.index(("g", v, 1))] for v in others}
    if solver != "ours":
        raise ValueError(f"unknown solver {solver!r}; use ours or lstsq")
    analysis = identifiability(system, rtol=rtol)
    keys = [("g", v, 1) for v in others if analysis.status(("g", v, 1)) == "identifiable"]
    if not keys:
        return {}
    out = solve_tied(
        system,
        untied,
        observed,
        known,
        analysis,
        keys,
        reference=x0,
        forecast=drift,
        trusts=TRUSTS if drift is None else drift.trusts,
        passes=passes,
        max_error=max_error,
    )
    if report is not None:
        report.update(out.errors)
    return out.got


@dataclass
class Forecast:
    """What the coalition predicts of the others' gradients from those it recovered, in the
    anchor's setting (:func:`linear_model`, one example per agent, D-GD from x_0): the run
    re-simulated with every non-member's recovered gradient held at its tied value, except
    that an agent the coalition can forecast — a member (its own example) or a victim whose
    recovered gradient is within a ``trust`` of one example's (:func:`rank_one`; its image by
    :func:`invert`, its label the negative entry of ∂b) — computes its gradient afresh at its
    simulated model each round. Its drift then comes from its own example and the models
    the recovered gradients imply, never from another victim's inversion."""

    model: nn.Module
    images: Tensor  # only the members' rows are read
    labels: Tensor
    members: list[int]
    W: np.ndarray
    lr: float
    rounds: int
    trusts: tuple[float, ...] = TRUSTS

    def __call__(self, got: dict[int, np.ndarray], trust: float) -> tuple[np.ndarray, np.ndarray]:
        """Every agent's gradient in every round (T, n, d) as forecast at ``trust`` (class
        docstring; an agent neither forecast nor in ``got`` keeps a zero gradient) and the
        re-simulated half-steps (T + 1, n, d): a
        :data:`~privaudit.attacks.gossip_drift.Forecast`."""
        C = self.model[1].out_features
        shape = tuple(self.images.shape[1:])
        x0 = flat(self.model)
        x = torch.zeros_like(self.images, dtype=torch.float64)
        y = torch.zeros_like(self.labels)
        for k in self.members:
            x[k], y[k] = self.images[k].double(), self.labels[k]
        hold = {k: torch.zeros_like(x0) for k in range(len(x)) if k not in self.members}
        for v, g in got.items():
            if rank_one(g, C) <= trust:
                x[v] = invert(self.model, x0.numpy(), g, shape).reshape(shape)
                y[v] = int(np.argmin(g[-C:]))
                del hold[v]
            else:
                hold[v] = torch.from_numpy(np.ascontiguousarray(g))
        sent, grads = dgd(self.model, x, y, self.W, self.lr, self.rounds, hold)
        return grads, sent


def rank_one(g: np.ndarray, classes: int) -> float:
    """How far a recovered gradient of :func:`linear_model` is from one example's:
    ‖∂W − ∂b xᵀ‖² / ‖∂W‖² at the best x (0 for a true one: ∂W = ∂b xᵀ)."""
    db = g[-classes:]
    dw = g[:-classes].reshape(classes, -1)
    x = db @ dw / max(float(db @ db), 1e-300)
    return float(((dw - np.outer(db, x)) ** 2).sum() / max(float((dw**2).sum()), 1e-300))


def psnr(a: Tensor, b: Tensor) -> float:
    mse = float(((a - b) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


def invert(
    model: nn.Module, x0: np.ndarray, g: np.ndarray, shape: tuple[int, ...], rule: str = "reliable"
) -> Tensor:
    """The analytic attack on one recovered gradient (first Linear layer, one example), its
    rows combined by ``rule`` (:func:`attacks.analytic.combine`; ``row``: the anchor's)."""
    classes = model[1].out_features
    obs = Observation(
        model=model,
        params=unflat(model, torch.from_numpy(x0)),
        target=unflat(model, torch.from_numpy(np.ascontiguousarray(g))),
        batch_size=1,
        input_shape=shape,
        num_classes=classes,
        mean=(0.0,) * shape[0],
        std=(1.0,) * shape[0],
    )
    return recover(obs, rule=rule)[0][0]


def setting(
    graph: str,
    n: int,
    members: list[int],
    lr: float,
    images: Tensor,
    labels: Tensor,
    gossip: str,
    rounds: int | None,
    good: float,
    seed: int,
    rtol: float | None = None,
) -> dict[str, Any]:
    """One row: D-GD on ``graph``, the coalition ``members``, step ``lr``; PSNR per victim
    (both solvers), the relative error of the recovered gradients, by hop distance."""
    t0 = time.perf_counter()
    adj = build_topology(graph, n)
    W = gossip_matrix(adj, gossip)
    model = linear_model(tuple(images.shape[1:]), int(labels.max()) + 1, seed)
    T = n if rounds is None else rounds
    sent, grads = dgd(model, images, labels, W, lr, T)
    hops = distances(adj)[members].min(0).values.tolist()
    row: dict[str, Any] = dict(graph=f"{graph} {n}", attackers=members, lr=lr, rounds=T)
    drift = Forecast(model, images, labels, members, W, lr, T)
    for solver in ("ours", "lstsq"):
        got = attack(sent, adj, W, lr, members, solver, rtol, drift=drift)
        per: dict[int, list[float]] = {}
        errs: dict[int, list[float]] = {}
        for v in range(n):
            if v in members:
                continue
            d = hops[v]
            per.setdefault(d, [])
            errs.setdefault(d, [])
            if v not in got:
                per[d].append(float("nan"))  # hidden: not identifiable in float
                errs[d].append(float("nan"))
                continue
            g1 = grads[0, v]
            errs[d].append(float(np.linalg.norm(got[v] - g1) / np.linalg.norm(g1)))
            rule = "reliable" if solver == "ours" else "row"
            img = invert(model, sent[0, 0], got[v], tuple(images.shape[1:]), rule)
            per[d].append(psnr(img, images[v].double()))
        row[f"psnr_{solver}"] = {d: per[d] for d in sorted(per)}
        row[f"err_{solver}"] = {d: errs[d] for d in sorted(errs)}
        row[f"recovered_{solver}"] = sum(p >= good for ps in per.values() for p in ps)
    row["victims"] = n - len(members)
    row["beyond"] = sum(1 for v in range(n) if v not in members and hops[v] >= 2)
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def data(name: str, root: str | None, n: int, seed: int) -> tuple[Tensor, Tensor]:
    """n distinct training images in [0, 1] (float64) and their labels, one per agent."""
    d = load_dataset(name, root=root)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(d.train_y), generator=g)[:n]
    return d.train_x[idx].double(), d.train_y[idx]


def default_settings(n: int) -> list[tuple[str, list[int]]]:
    """The anchor's axes on a line and a ring of n: the attacker's position (an end, the
    middle) and the number of attackers (1, 2, 3; spread out, unevenly on the ring)."""
    mid = n // 2
    return [
        ("line", [0]),
        ("line", [mid]),
        ("line", [0, n - 1]),
        ("line", [0, mid, n - 1]),
        ("ring", [0]),
        ("ring", [0, n // 3]),
        ("ring", [0, n // 4, (7 * n) // 12]),
    ]


def parse_settings(spec: str) -> list[tuple[str, list[int]]]:
    """``graph:a+b,graph:c`` (e.g. ``line:0,ring:0+4``) as (graph, coalition) pairs."""
    out = []
    for item in spec.split(","):
        graph, _, members = item.partition(":")
        out.append((graph, [int(a) for a in members.split("+")]))
    return out


def cell(values: list[float]) -> str:
    ok = [v for v in values if np.isfinite(v)]
    if not ok:
        return "hidden"
    s = f"{np.mean(ok):.1f}"
    return s if len(ok) == len(values) else f"{s} ({len(values) - len(ok)} hidden)"


def table(rows: list[dict[str, Any]], good: float) -> str:
    far = max(max(r["psnr_ours"]) for r in rows)
    head = ["graph", "attackers", "η"] + [f"d={d}" for d in range(1, far + 1)]
    head += [f"≥{good:g} dB ours / lstsq", "s"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["graph"], ",".join(map(str, r["attackers"])), f"{r['lr']:g}"]
        for d in range(1, far + 1):
            a, b = r["psnr_ours"].get(d), r["psnr_lstsq"].get(d)
            cells.append("" if a is None else f"{cell(a)} / {cell(b)}")
        cells.append(f"{r['recovered_ours']} / {r['recovered_lstsq']} of {r['victims']}")
        cells.append(f"{r['seconds']:.1f}")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


# -- the anchor's own code, beside ours ------------------------------------------------------
SIDE = (("line", "end"), ("ring", "two"), ("erdos-renyi", "one"))  # the side-by-side's graphs


def side_graphs(n: int) -> list[tuple[str, str, Tensor, list[int]]]:
    """The side-by-side's settings (label, topology, graph, coalition): a line of n with the
    attacker at an end, a ring with two attackers a third of the way apart, an Erdős–Rényi
    graph (this project's draw, seed 0) with one."""
    return [
        (f"line {n}, attacker 0", "line", build_topology("line", n), [0]),
        (f"ring {n}, attackers 0,{n // 3}", "ring", build_topology("ring", n), [0, n // 3]),
        (f"Erdős–Rényi {n}, attacker 0", "erdos-renyi", build_topology("erdos-renyi", n), [0]),
    ]


def train_run(
    folder: Path, topology: str, n: int, lr: float, rounds: int, seed: int, dataset: str
) -> Run:
    """``privaudit train`` in the anchor's setting, from the command line: D-PSGD without
    noise (= D-GD) on one example per agent, full batches, the linear model, float64,
    W = I − L/d_max, every message captured."""
    argv = ["train", "--defense", "dsgd", "--out", str(folder), "--agents", str(n)]
    argv += ["--topology", topology, "--rounds", str(rounds), "--lr", repr(lr)]
    argv += ["--model", "linear", "--examples-per-agent", "1", "--sampling", "full"]
    argv += ["--precision", "float64", "--gossip", "laplacian", "--seed", str(seed)]
    argv += ["--dataset", dataset, "--capture", "all", "--checkpoint-every", str(rounds)]
    with contextlib.redirect_stdout(io.StringIO()):
        if cli([*argv, "--no-progress"]) != 0:
            raise RuntimeError(f"privaudit train failed: {' '.join(argv)}")
    return Run.open(folder)


def run_data(run: Run) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """A run's per-agent example (its normalised input, as its model reads it), label, pixel
    image in [0, 1], and the normalisation's mean and std."""
    ctx = run.ctx
    idx = torch.cat(list(ctx.parts)).cpu()
    x, y = ctx.train_x.cpu()[idx].double(), ctx.train_y.cpu()[idx]
    mean = torch.tensor(run.data.mean, dtype=torch.float64).view(-1, 1, 1)
    std = torch.tensor(run.data.std, dtype=torch.float64).view(-1, 1, 1)
    return x, y, (x * std + mean).clamp(0, 1), mean, std


def run_messages(run: Run) -> np.ndarray:
    """Every agent's sent half-steps (T + 1, n, d) from the run's captured messages (index 0:
    x_0), as :func:`dgd` returns them."""
    T, n = run.cfg.rounds, run.cfg.agents
    msgs = run.messages(CaptureSpec.of(rounds=range(1, T + 1)), progress=False)
    sent = np.empty((T + 1, n, run.ctx.x0.numel()))
    sent[0] = run.ctx.x0.cpu().double().numpy()
    for (t, src, _, _), m in msgs.items():
        sent[t, src] = m.double().numpy()
    return sent


def run_attack(run: Run, members: list[int]) -> tuple[dict[int, Tensor], int]:
    """What ``privaudit attack --attack analytic -a tie=true --attacker A --victim …`` does
    with every victim it finds identifiable: :func:`~privaudit.api.gossip.observe_beyond`
    with the tie and its drift forecast, each update inverted in closed form. Returns each
    recovered victim's image and how many were hidden (not identifiable, or lost to the
    messages' rounding: estimated error at least its own size, which the command refuses)."""
    victims = identifiable_victims(run, "dsgd-half-model", 1, members, tie=True)
    got = {}
    obs = observe_beyond(
        run, "dsgd-half-model", 1, members, victims, tie=True, progress=False, max_error=None
    )
    for o in obs:
        if o.meta["float_error_rel"] < 1.0:
            got[o.meta["src"]] = recover(o)[0][0]
    return got, run.cfg.agents - len(members) - len(got)


class _Shards:
    """A stand-in for the anchor's torchvision dataset: hands agent k its image k, in the
    order its ``Decentralized.build`` asks for them (whatever index it draws)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images, self.labels, self.next = images, labels, 0

    def __getitem__(self, idx: int) -> tuple[Tensor, int]:
        k, self.next = self.next, self.next + 1
        return torch.from_numpy(self.images[k]), int(self.labels[k])


def _worker(path: str, deps: str | None, inp: str, out: str) -> None:
    """In a subprocess: the anchor's code (decAttack's ``src``) on the arrays of ``inp``, its
    Decentralized simulation, least squares and inversion unchanged; only its dataset is
    replaced by ours (a stand-in for torchvision's that hands agent k its image k)."""
    for extra in (deps, str(Path(path) / "src")):
        if extra:
            sys.path.insert(0, extra)
    import decentralized as dec  # the anchor's own modules
    import networkx as nx
    from models import FC_Model, Model, invert_gradient_FC_Model
    from optim import ReconstructOptim

    torch.set_num_threads(1)
    z = np.load(inp)
    images, labels, x0 = z["images"], z["labels"], z["x0"]
    n, a, T = len(images), int(z["attackers"]), int(z["rounds"])
    G = nx.Graph()
    G.add_nodes_from(range(n))
    G.add_edges_from(z["edges"].tolist())
    setup = dict(device=torch.device("cpu"), dtype=torch.double)
    R = ReconstructOptim(G, T, list(range(a)))
    fc = FC_Model(images[0].size, int(z["classes"]))
    model = Model(fc, invert_gradient_FC_Model, setup)
    w = fc.seq[0].weight
    model.update(
        [torch.from_numpy(x0[: w.numel()]).reshape(w.shape), torch.from_numpy(x0[w.numel() :])]
    )
    res: dict[str, Any] = {}
    for i, lr in enumerate(z["lrs"].tolist()):
        shards = _Shards(images, labels)
        dec.datasets["privaudit"] = lambda setup, root, shards=shards: shards
        D = dec.Decentralized(R, model, setup, data_name="privaudit", targets_only=True)
        t0 = time.perf_counter()
        D.run(lr)
        res[f"sim{i}"] = time.perf_counter() - t0
        x_hat = R.reconstruct_LS_target_only(D.sent_params, D.attackers_params)
        res[f"img{i}"] = np.stack([model.invert(x_hat[j], lr).numpy() for j in range(n - a)])
        res[f"sent{i}"] = D.sent_params.numpy()
    np.savez(out, **res)


def run_anchor(
    path: str,
    deps: str | None,
    images: Tensor,
    labels: Tensor,
    adj: Tensor,
    members: list[int],
    x0: Tensor,
    lrs: list[float],
    rounds: int,
) -> tuple[list[dict[int, Tensor]], list[float], list[np.ndarray], list[int]]:
    """The anchor's code on our data, in a subprocess (:func:`_worker`), the attackers
    relabelled 0..a−1 as it assumes. Returns per η: each victim's image (by our agent
    index), its simulation's seconds, its recorded messages, and the relabelling."""
    n = len(images)
    perm = members + [k for k in range(n) if k not in members]
    pos = {k: i for i, k in enumerate(perm)}
    edges = np.array([(pos[i], pos[j]) for i, j in np.argwhere(np.triu(adj.numpy(), 1))])
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.npz")
        np.savez(
            inp,
            images=images[perm].numpy().astype(np.float64),
            labels=labels[perm].numpy(),
            edges=edges,
            x0=x0.numpy(),
            attackers=len(members),
            lrs=np.array(lrs),
            rounds=rounds,
            classes=int(labels.max()) + 1,
        )
        cmd = [sys.executable, __file__, "--worker", inp, out, "--decattack", path]
        cmd += ["--decattack-deps", deps] if deps else []
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"the anchor's code failed:\n{done.stderr[-3000:]}")
        z = np.load(out)
        imgs = [
            {perm[len(members) + j]: torch.from_numpy(im) for j, im in enumerate(z[f"img{i}"])}
            for i in range(len(lrs))
        ]
        return (
            imgs,
            [float(z[f"sim{i}"]) for i in range(len(lrs))],
            [z[f"sent{i}"] for i in range(len(lrs))],
            perm,
        )


def anchor_messages(sent: np.ndarray, adj: Tensor, perm: list[int], a: int) -> np.ndarray:
    """Our simulation's messages in the anchor's recording order: the attackers' first
    half-steps, then every round's non-attacker neighbours (by its labels), each minus x_0."""
    pos = {k: i for i, k in enumerate(perm)}
    heard = sorted({pos[j] for m in perm[:a] for j in torch.nonzero(adj[m]).flatten().tolist()})
    heard = [perm[j] for j in heard if j >= a]
    rows = [sent[1, m] for m in perm[:a]]
    rows += [sent[t, j] for t in range(1, sent.shape[0]) for j in heard]
    return np.stack(rows) - sent[0, 0]


def side_by_side(args: argparse.Namespace) -> dict[str, Any]:
    """The anchor's code beside privaudit's command line on the same data (module
    docstring): for each image set, graph and η a run is trained by ``privaudit train``
    (:func:`train_run`) and attacked as ``privaudit attack -a tie=true`` does
    (:func:`run_attack`); the anchor's code gets the run's examples, graph, W, η, T and x_0.
    Victims at ≥ ``args.good`` dB per (graph, η), summed over ``args.sets`` image sets; the
    largest difference between the run's messages and the anchor's; and the D-GD
    simulations' time (the anchor's against :func:`dgd`)."""
    n, lrs = args.agents, [float(x) for x in args.lrs.split(",")]
    T = args.rounds or n
    counts: dict[tuple[str, float], list[int]] = {}
    sim = {"ours": 0.0, "anchor": 0.0}
    worst = 0.0  # largest difference between the run's messages and the anchor's
    hidden: dict[tuple[str, float], int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for s in range(args.seed, args.seed + args.sets):
            for name, topology, adj, members in side_graphs(n):
                runs = [
                    train_run(
                        Path(tmp) / f"{s}-{topology}-{i}", topology, n, lr, T, s, args.dataset
                    )
                    for i, lr in enumerate(lrs)
                ]
                x, y, pixels, mean, std = run_data(runs[0])
                x0 = runs[0].ctx.x0.cpu().double()
                W = gossip_matrix(adj, "laplacian")
                imgs, secs, msgs, perm = run_anchor(
                    args.decattack, args.decattack_deps, x, y, adj, members, x0, lrs, T
                )
                model = linear_model(tuple(x.shape[1:]), int(y.max()) + 1, s)
                torch.nn.utils.vector_to_parameters(x0, model.parameters())
                for i, lr in enumerate(lrs):
                    t0 = time.perf_counter()
                    dgd(model, x, y, W, lr, T)
                    sim["ours"] += time.perf_counter() - t0
                    sim["anchor"] += secs[i]
                    ours = anchor_messages(run_messages(runs[i]), adj, perm, len(members))
                    worst = max(worst, float(np.abs(ours - msgs[i]).max() / np.abs(msgs[i]).max()))
                    got, lost = run_attack(runs[i], members)
                    c = counts.setdefault((name, lr), [0, 0, 0])
                    hidden[(name, lr)] = hidden.get((name, lr), 0) + lost
                    for v, im in imgs[i].items():
                        theirs = (im.reshape(x.shape[1:]) * std + mean).clamp(0, 1)
                        c[0] += psnr(theirs, pixels[v]) >= args.good
                        c[1] += v in got and psnr(got[v], pixels[v]) >= args.good
                        c[2] += 1
                    print(
                        f"set {s}, {name}, η = {lr:g}: anchor {c[0]}, ours {c[1]} so far",
                        flush=True,
                    )
    print(
        f"\nVictims recovered at ≥ {args.good:g} dB over {args.sets} image sets "
        f"({args.dataset}, W = I − L/d_max, T = {T}), the anchor's code / privaudit's command "
        "line (train --precision float64 --gossip laplacian …, attack -a tie=true):"
    )
    print("| graph | η | anchor's code | privaudit | victims | privaudit hidden |")
    print("|---|---|---|---|---|---|")
    for (name, lr), (a, o, tot) in counts.items():
        print(f"| {name} | {lr:g} | {a} | {o} | {tot} | {hidden[(name, lr)]} |")
    ratio = sim["anchor"] / max(sim["ours"], 1e-9)
    print(
        f"D-GD simulation: privaudit {sim['ours']:.1f} s, the anchor's {sim['anchor']:.1f} s "
        f"(anchor / privaudit = {ratio:.2f}); largest difference between the run's messages "
        f"and the anchor's {worst:.1e} (relative)"
    )
    return dict(
        counts={f"{k[0]} | {k[1]:g}": v for k, v in counts.items()},
        hidden={f"{k[0]} | {k[1]:g}": v for k, v in hidden.items()},
        lrs=lrs,
        sets=args.sets,
        rounds=T,
        good=args.good,
        sim=sim,
        ratio=ratio,
        message_difference=worst,
    )


def side_markdown(out: dict[str, Any]) -> str:
    """The side-by-side as the docs show it: per graph, victims recovered at ≥ ``good`` dB
    by the anchor's code / privaudit's command line at each η, and the victims; then what
    was run and the simulations' agreement and time."""
    lrs = out["lrs"]
    graphs = list(dict.fromkeys(k.split(" | ")[0] for k in out["counts"]))
    head = ["graph, attackers", *[f"η = {lr:g}" for lr in lrs], "victims"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in graphs:
        cells = [out["counts"][f"{g} | {lr:g}"] for lr in lrs]
        row = [g, *[f"{a} / {o}" for a, o, _ in cells], str(cells[0][2])]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        f"Victims recovered at ≥ {out['good']:g} dB, the anchor's code / privaudit's command "
        f"line, summed over {out['sets']} image sets (T = {out['rounds']} rounds). The two "
        f"simulations' messages agree to {out['message_difference']:.1e} (relative); D-GD "
        f"simulation {out['sim']['ours']:.1f} s (privaudit) against {out['sim']['anchor']:.1f} "
        f"s (the anchor's), {out['ratio']:.1f}× faster.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=16)
    p.add_argument("--lrs", default="1e-5,1e-4,1e-3,1e-2", help="step sizes η, comma-separated")
    p.add_argument("--rounds", type=int, default=None, help="rounds T (default: n, as theirs)")
    p.add_argument("--gossip", default="laplacian", choices=["laplacian", "mh"])
    p.add_argument("--dataset", default="photos", help="photos (offline), mnist, cifar10")
    p.add_argument("--data-root", default=None)
    p.add_argument("--good", type=float, default=20.0, help="PSNR (dB) counted as recovered")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--rtol",
        type=float,
        default=None,
        help="float rank cut-off of ours (default: K's rounding)",
    )
    p.add_argument(
        "--settings", default=None, help="graph:a+b,… (line:0 is Fig. 6); default: both axes"
    )
    p.add_argument("--json", default=None, help="write the rows to this file")
    p.add_argument("--markdown", default=None, help="with --decattack: the table, as published")
    p.add_argument(
        "--decattack", default=None, metavar="PATH", help="a decAttack checkout: run it beside ours"
    )
    p.add_argument("--decattack-deps", default=None, metavar="DIR", help="its extra packages")
    p.add_argument("--sets", type=int, default=3, help="image sets of the side-by-side")
    p.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.worker:
        _worker(args.decattack, args.decattack_deps, *args.worker)
        return []
    if args.decattack:
        out = side_by_side(args)
        if args.markdown:
            Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
            Path(args.markdown).write_text(side_markdown(out))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1, default=str)
        return [out]
    n = args.agents
    images, labels = data(args.dataset, args.data_root, n, args.seed)
    rows = []
    for lr in [float(x) for x in args.lrs.split(",")]:
        chosen = parse_settings(args.settings) if args.settings else default_settings(n)
        for graph, members in chosen:
            rows.append(
                setting(
                    graph,
                    n,
                    members,
                    lr,
                    images,
                    labels,
                    args.gossip,
                    args.rounds,
                    args.good,
                    args.seed,
                    args.rtol,
                )  # fmt: skip
            )
            print(f"{graph} {members} η={lr:g}: {rows[-1]['seconds']} s", flush=True)
    print(f"\nPSNR (dB) per hop distance d from the coalition, ours / the anchor's lstsq "
          f"({args.dataset}, {args.gossip} W, T = {args.rounds or n}, "
          f"rtol {'default' if args.rtol is None else f'{args.rtol:g}'})")  # fmt: skip
    print(table(rows, args.good))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return rows


if __name__ == "__main__":
    main()
