"""Membership and label leakage at the operating point: private and non-private runs apart.

For each row — a target at its defense's MNIST operating point (``--preset utility``:
tanh-cnn, B = 64, 10 agents on a ring) trained for ``--rounds`` rounds at a given ε — the
message-level membership inference of ``privaudit mia`` (the ``decompose`` scorer) on the
messages of rounds ``--round`` … ``--round + --messages − 1``: AUC, TPR at 0.1 % and 1 % FPR,
the one-message DP bound and the ROC points above it, the ε lower bound from these real
examples, and the label counts the messages give away. The threat is the planner's default
(the weakest adversary that observes the target) unless a row names one.

    python benchmarks/membership.py --data-root DIR [--rounds 12 --round 5 --messages 4]
        [--out DIR]

Prints one table (markdown with ``--markdown``); ``--json`` the rows (strict JSON). Each row
is saved in ``--out`` (default ``privaudit-out/benchmarks/membership``, its run beside it) as
it finishes; a rerun into the same folder computes only the rows not there yet
(``benchmarks/resume.py``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from resume import Pieces, add_out  # noqa: E402 - a sibling script, not a package

from privaudit.api.message_membership import mia
from privaudit.core.config import RunConfig
from privaudit.core.files import dumps_strict
from privaudit.scenario import presets
from privaudit.sim.run import Run
from privaudit.sim.targets import Target

# (target, ε or None, threat or None)
ROWS = [
    ("dsgd-half-model", None, None),
    ("dsgd-half-model", None, "global"),
    ("nd-cg", None, None),
    ("dp-dpsgd-half-model", 8.0, "global"),
    ("dp-dpsgd-half-model", 1.0, "global"),
    ("dpdl-cg", 8.0, None),
    ("dpdl-cg", 1.0, None),
]


def row(
    target: str, eps: float | None, threat: str | None, a: argparse.Namespace, work: Path
) -> dict:
    base = RunConfig(
        defense=Target.parse(target).defense.name,
        dataset="mnist",
        data_root=a.data_root,
        epsilon=eps if eps is not None else RunConfig().epsilon,
    )
    cfg, _ = presets.apply(base, "utility", {"rounds": a.rounds})
    t0 = time.perf_counter()
    run = Run.create(cfg.validate(), work / "run")
    r = mia(run, target, a.round, messages=a.messages, threat=threat, progress=False)
    pts, d = r.tpr_at_fpr, r.details  # d: the message-level entries
    return {
        "target": target,
        "eps_asked": eps,
        "eps_run": run.resolved["epsilon"],
        "threat": r.threat,
        "members": r.members,
        "auc": r.auc,
        # None where the non-members cannot resolve the FPR (fewer than 1/FPR of them)
        "tpr_0.1%": pts["0.001"]["tpr"] if pts["0.001"]["resolved"] else None,
        "tpr_1%": pts["0.01"]["tpr"] if pts["0.01"]["resolved"] else None,
        "eps_message": d["epsilon_release"],
        "violations": len(d["violations"]),
        "eps_lo": r.epsilon_lo,
        "labels_exact": d["label_counts_exact"],
        "label_tv": d["label_tv"],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def fmt(v: object) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return "∞" if math.isinf(v) else f"{v:.3g}"
    return str(v)


def identity(target: str, eps: float | None, threat: str | None, a: argparse.Namespace) -> dict:
    """What a row's numbers depend on (``benchmarks/resume.py``)."""
    return dict(bench="membership", target=target, epsilon=eps, threat=threat,
                rounds=a.rounds, round=a.round, messages=a.messages)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-root", required=True)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--round", type=int, default=5)
    p.add_argument("--messages", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--json", action="store_true")
    add_out(p, "membership")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    pieces = Pieces(a.out, [identity(*r, a) for r in ROWS], [__file__])
    rows = []
    for target, eps, threat in ROWS:
        rows.append(
            pieces.run(
                identity(target, eps, threat, a),
                lambda work, t=target, e=eps, th=threat: row(t, e, th, a, work),
            )
        )
        print(dumps_strict(rows[-1], indent=None, sort_keys=False), file=sys.stderr, flush=True)
    if a.json:
        print(dumps_strict(rows, sort_keys=False))
        return 0
    cols = ["target", "eps_asked", "eps_run", "threat", "members", "auc", "tpr_0.1%", "tpr_1%"]
    cols += ["eps_message", "violations", "eps_lo", "labels_exact", "label_tv", "seconds"]
    if a.markdown:
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for r in rows:
            print("| " + " | ".join(fmt(r[c]) for c in cols) + " |")
    else:
        print("  ".join(f"{c:>12}" for c in cols))
        for r in rows:
            print("  ".join(f"{fmt(r[c]):>12}" for c in cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
