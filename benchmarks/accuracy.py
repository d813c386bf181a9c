"""Test accuracy of every defense on MNIST at one ε, ring and complete graphs.

Trains each registered defense (or ``--defenses``) with the same data, partition, model,
rounds and ε, and prints the test accuracy of the agents' average model next to the
non-private baselines (dsgd, nd, dsgt: no noise). The push-sum defenses (adad2p family) run
on their own time-varying exponential graph whatever the column says; the cell names it.
Real MNIST is read from ``--data-root DIR`` (torchvision's layout, ``DIR/MNIST/raw``; a
t10k-only copy is divided 8,000/2,000).

    python benchmarks/accuracy.py --data-root DIR [--rounds 200 --agents 10
        --epsilon 1 --topologies ring,complete --model cnn --defenses dpdl,pdsl,...] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
import warnings

from privaudit.config import RunConfig
from privaudit.defenses import DEFENSES
from privaudit.errors import PrivauditError
from privaudit.simulator import Run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-root", required=True)
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--agents", type=int, default=10)
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--model", default="cnn")
    p.add_argument("--topologies", default="ring,complete")
    p.add_argument("--defenses", default=",".join(DEFENSES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for defense in args.defenses.split(","):
            own = DEFENSES[defense].topology  # push-sum defenses run on their own graph
            for topo in args.topologies.split(","):
                cfg = RunConfig(
                    defense=defense,
                    rounds=args.rounds,
                    agents=args.agents,
                    topology=own or topo,
                    dataset=args.dataset,
                    data_root=args.data_root,
                    model=args.model,
                    batch_size=args.batch_size,
                    epsilon=args.epsilon,
                    seed=args.seed,
                    device=args.device,
                    checkpoint_every=args.rounds,
                )
                t0 = time.perf_counter()
                try:
                    run = Run.create(cfg, f"{root}/{defense}-{topo}")
                    acc = run.test_accuracy(run.train(progress=not args.json))
                    eps, sigma, note = run.resolved["epsilon"], run.resolved["sigma"], ""
                except PrivauditError as e:  # e.g. a defense that runs on its own graph only
                    acc, eps, sigma, note = math.nan, math.nan, math.nan, str(e)
                rows.append(
                    {
                        "defense": defense,
                        "topology": topo,
                        "graph": own or topo,
                        "accuracy": acc,
                        "epsilon": eps,
                        "sigma": sigma,
                        "seconds": time.perf_counter() - t0,
                        "note": note,
                    }
                )
                if not args.json:
                    r = rows[-1]
                    print(
                        f"{defense:<10} {topo:<9} acc {acc:6.3f}  ε {eps:6.3g}  σ {sigma:6.3g}"
                        f"  {r['seconds']:5.0f} s  {note}",
                        flush=True,
                    )
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return
    topos = args.topologies.split(",")
    print(
        f"\n{args.dataset}, {args.agents} agents, {args.rounds} rounds, model {args.model}, "
        f"B = {args.batch_size}, target ε = {args.epsilon} (δ = 1e-5)\n"
    )
    print("| defense | " + " | ".join(topos) + " |")
    print("|---|" + "---|" * len(topos))
    for d in args.defenses.split(","):
        cells = []
        for t in topos:
            r = next(r for r in rows if r["defense"] == d and r["topology"] == t)
            eps = "no DP" if r["epsilon"] == math.inf else f"ε={r['epsilon']:.2g}"
            graph = "" if r["graph"] == t else f", {r['graph']}"
            cells.append(
                "n/a" if math.isnan(r["accuracy"]) else f"{r['accuracy']:.3f} ({eps}{graph})"
            )
        print(f"| {d} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
