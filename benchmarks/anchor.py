"""Reproduce El Mrini, Cyffers & Bellet (ICML 2024, "Privacy Attacks in Decentralized
Learning", §5 and Fig. 4–6) on their small D-GD settings, with this project's gossip algebra.

Their setting (the decAttack repository's ``exp_fig_4a.py``/``exp_fig6.py``): one fixed
example per agent, full-batch gradient steps of step size η (D-GD, adapt-then-combine:
x̃_t = W x̃_{t-1} − η ∇f_k(x^k_{t-1}), every agent sends x̃_t), a line graph with the
attacker at an end, the "Laplacian" gossip matrix W = I − L / d_max, T = n rounds, a model
whose first layer is linear (one linear layer on 3×32×32 images) and the gradient inverted
in closed form. The attack rests on their gradient-similarity approximation: every
non-attacker's gradient is taken to be the same in every round, so the neighbours' T
messages are linear in n − |A| unknown gradients.

Here: the same recursion (:func:`privaudit.core.recursion.dpsgd`), the tied knowledge system
(:func:`privaudit.attacks.gossip.knowledge` with ``tied``; its error is stated in
:func:`privaudit.attacks.gossip.tie`), solved two ways —

- ``ours``: the float identifiability (QR rank, leverage) and the exact solve of every
  identifiable victim; a victim outside the numerical row space is reported ``hidden``;
- ``lstsq``: the anchor's solver, the min-norm least squares of the whole tied system
  (NumPy ``lstsq``, default cut-off), which returns a value for every victim —

then each victim's recovered round-1 gradient is inverted by the analytic attack
(:func:`attacks.analytic.recover`) and scored by PSNR against its image, per hop distance
from the coalition. Settings: a line (attacker at an end, in the middle, 2 and 3 attackers)
and a ring (1, 2, 3 attackers), at several step sizes η (the approximation's error is first
order in η).

    python benchmarks/anchor.py [--agents 16] [--lrs 1e-5,1e-4,1e-3,1e-2]
        [--gossip laplacian|mh] [--settings line:0,ring:0+4] [--rounds T]
        [--dataset photos|mnist|cifar10 --data-root DIR] [--json FILE]

Fig. 6's setting: ``--agents 35 --lrs 1e-5 --settings line:0``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: small dense LAPACK calls

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from torch.func import functional_call, grad  # noqa: E402

from privaudit.attacks.analytic import recover  # noqa: E402
from privaudit.attacks.gossip import (  # noqa: E402
    dpsgd,
    gossip_messages,
    identifiability,
    knowledge,
    solve,
)
from privaudit.core.observation import Observation  # noqa: E402
from privaudit.scenario.data import load_dataset  # noqa: E402
from privaudit.scenario.topology import build_topology, distances, metropolis_hastings  # noqa: E402


def gossip_matrix(adj: Tensor, kind: str) -> np.ndarray:
    """``laplacian``: the anchor's W = I − L / d_max (decAttack's ``LaplacianGossipMatrix``);
    ``mh``: this project's Metropolis–Hastings weights."""
    if kind == "mh":
        return metropolis_hastings(adj).numpy()
    if kind != "laplacian":
        raise ValueError(f"unknown gossip matrix {kind!r}; use laplacian or mh")
    a = adj.double().numpy().copy()
    np.fill_diagonal(a, 0)
    deg = a.sum(1)
    return np.eye(len(a)) - (np.diag(deg) - a) / deg.max()


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
    model: nn.Module, images: Tensor, labels: Tensor, W: np.ndarray, lr: float, rounds: int
) -> tuple[np.ndarray, np.ndarray]:
    """Run D-GD, adapt-then-combine, every agent from the model's x_0 on its one example:
    x̃_1 = x_0 − η g_1, x̃_t = W x̃_{t-1} − η g_t with g^k_t = ∇ CE(x^k_{t-1}; example k) at
    x^k_{t-1} = (W x̃_{t-1})_k. Returns the sent half-steps (T + 1, n, d) (index 0: x_0, the
    shared initial model) and the gradients (T, n, d)."""
    n = len(images)
    x0 = flat(model)

    def loss(v: Tensor, x: Tensor, y: Tensor) -> Tensor:
        out = functional_call(model, unflat(model, v), (x[None],))
        return nn.functional.cross_entropy(out, y[None])

    g_of = grad(loss)
    Wt = torch.from_numpy(W)
    sent = [x0.expand(n, -1).clone()]
    grads = []
    for t in range(1, rounds + 1):
        at = sent[0] if t == 1 else Wt @ sent[-1]
        g = torch.stack([g_of(at[k], images[k], labels[k]) for k in range(n)])
        grads.append(g)
        sent.append(at - lr * g)
    return torch.stack(sent).numpy(), torch.stack(grads).numpy()


def attack(
    sent: np.ndarray,
    adj: Tensor,
    W: np.ndarray,
    lr: float,
    members: list[int],
    solver: str,
    rtol: float = 1e-9,
) -> dict[int, np.ndarray]:
    """Each non-member's round-1 gradient from the coalition's recorded messages, on the tied
    system (one unknown gradient per non-member over the rounds). ``ours``: identifiable
    victims only (float QR rank), exact solve; ``lstsq``: min-norm least squares of the whole
    tied system, every victim (the anchor's ``np.linalg.lstsq``). ``rtol``: the float rank's
    cut-off on the singular values (``identifiability``'s; the tied rows of a line decay
    geometrically with distance, so it decides how far ``ours`` claims to reach)."""
    T, n = sent.shape[0] - 1, sent.shape[1]
    rec = dpsgd(W, lr)
    others = [k for k in range(n) if k not in members]
    rows = gossip_messages(adj, members, range(1, T + 1), own=("x",))
    system = knowledge(
        rec, members, rows, rounds=T, known=lambda k: k[0] in rec.public, tied=others
    )
    x0 = sent[0, 0]
    observed = system.observed(sent)
    if solver == "ours":
        analysis = identifiability(system, rtol=rtol)
        keys = [("g", v, 1) for v in others if analysis.status(("g", v, 1)) == "identifiable"]
        if not keys:
            return {}
        rec_ = solve(system, observed, lambda key: x0, analysis=analysis, keys=keys)
        return {k[1]: rec_.values[i] for i, k in enumerate(rec_.keys)}
    if solver != "lstsq":
        raise ValueError(f"unknown solver {solver!r}; use ours or lstsq")
    y = system.rhs(observed, known_values=lambda key: x0)
    sol = np.linalg.lstsq(system.K.toarray(), y, rcond=None)[0]
    return {v: sol[system.index(("g", v, 1))] for v in others}


def psnr(a: Tensor, b: Tensor) -> float:
    mse = float(((a - b) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


def invert(model: nn.Module, x0: np.ndarray, g: np.ndarray, shape: tuple[int, ...]) -> Tensor:
    """The analytic attack on one recovered gradient (first Linear layer, one example)."""
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
    return recover(obs)[0][0]


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
    rtol: float = 1e-9,
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
    for solver in ("ours", "lstsq"):
        got = attack(sent, adj, W, lr, members, solver, rtol)
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
            img = invert(model, sent[0, 0], got[v], tuple(images.shape[1:]))
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
    p.add_argument("--rtol", type=float, default=1e-9, help="float rank cut-off of ours")
    p.add_argument(
        "--settings", default=None, help="graph:a+b,… (line:0 is Fig. 6); default: both axes"
    )
    p.add_argument("--json", default=None, help="write the rows to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
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
          f"rtol {args.rtol:g})")  # fmt: skip
    print(table(rows, args.good))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return rows


if __name__ == "__main__":
    main()
