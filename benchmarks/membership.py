"""Membership and label leakage at the operating point: private and non-private runs apart.

For each row — a target at its defense's MNIST operating point (``--preset utility``:
tanh-cnn, B = 64, 10 agents on a ring) trained for ``--rounds`` rounds at a given ε — the
message-level membership inference of ``privaudit mia`` (the ``decompose`` scorer) on the
messages of rounds ``--round`` … ``--round + --messages − 1``: AUC, TPR at 0.1 % and 1 % FPR,
the one-message DP bound and the ROC points above it, the ε lower bound from these real
examples, and the label counts the messages give away. The threat is the planner's default
(the weakest adversary that observes the target) unless a row names one.

    python benchmarks/membership.py --data-root DIR [--rounds 12 --round 5 --messages 4]

Prints one table (markdown with ``--markdown``); ``--json`` the rows.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

from privaudit.api.membership import mia
from privaudit.core.config import RunConfig
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


def row(target: str, eps: float | None, threat: str | None, a: argparse.Namespace) -> dict:
    base = RunConfig(
        defense=Target.parse(target).defense.name,
        dataset="mnist",
        data_root=a.data_root,
        epsilon=eps if eps is not None else RunConfig().epsilon,
    )
    cfg, _ = presets.apply(base, "utility", {"rounds": a.rounds})
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        run = Run.create(cfg.validate(), Path(tmp) / "run")
        r = mia(run, target, a.round, messages=a.messages, threat=threat, progress=False)
    pts = r["tpr_at_fpr"]
    return {
        "target": target,
        "eps_asked": eps,
        "eps_run": run.resolved["epsilon"],
        "threat": r["threat"],
        "members": r["members"],
        "auc": r["auc"],
        # None where the non-members cannot resolve the FPR (fewer than 1/FPR of them)
        "tpr_0.1%": pts["0.001"]["tpr"] if pts["0.001"]["resolved"] else None,
        "tpr_1%": pts["0.01"]["tpr"] if pts["0.01"]["resolved"] else None,
        "eps_message": r["epsilon_release"],
        "violations": len(r["violations"]),
        "eps_lo": r["epsilon_lo"],
        "labels_exact": r["label_counts_exact"],
        "label_tv": r["label_tv"],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def fmt(v: object) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return "∞" if math.isinf(v) else f"{v:.3g}"
    return str(v)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-root", required=True)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--round", type=int, default=5)
    p.add_argument("--messages", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    rows = []
    for target, eps, threat in ROWS:
        rows.append(row(target, eps, threat, a))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if a.json:
        print(json.dumps(rows, indent=2))
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
