"""Model-level membership inference (LOSS, LiRA online/offline, RMIA) with K reference runs,
from a deliberately overfitting non-private run to dp-dpsgd at ε = 8 and ε = 1; and the cost
of the K batched reference runs as a ratio to one run, measured in this process.

The setting (the default photos data, no download): 8 agents on a ring, label-skewed shards
(Dirichlet 0.05, seed 1) where agent 4 holds 10 examples and samples each at rate B/n = 0.4,
so 100 rounds are 40 epochs of its shard; non-members are the held-out tenth of the training
split (``eval_split="validation"``), one per member's label. The attacked model is agent 4's
last half-model message as its neighbour receives it (``--on final``: the final average).

    python benchmarks/membership_models.py [--references 8] [--on message|final] [--threads 1]
        [--out DIR]

Each row is saved in ``--out`` (default ``privaudit-out/benchmarks/membership_models``) as it
finishes; a rerun into the same folder computes only the rows not there yet
(``benchmarks/resume.py``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from resume import Pieces, add_out  # noqa: E402 - a sibling script, not a package

from privaudit.api.model_membership import draw_candidates, model_mia, reference_models
from privaudit.core.config import RunConfig
from privaudit.sim.run import Run

VICTIM = 4
SETTINGS = (("dsgd", None), ("dp-dpsgd", 8.0), ("dp-dpsgd", 1.0))


def config(defense: str, epsilon: float | None, rounds: int) -> RunConfig:
    return RunConfig(
        defense=defense,
        agents=8,
        rounds=rounds,
        batch_size=4,
        seed=1,
        model="tanh-cnn",
        dirichlet_alpha=0.05,
        eval_split="validation",
        epsilon=epsilon,
        params={"lr": 0.5},
        checkpoint_every=rounds,
    )


def setting(i: int, defense: str, eps: float | None, a: argparse.Namespace, work: Path) -> dict:
    """One row of the table: train the run of ``SETTINGS[i]`` in ``work``, attack it with K
    references (and, for the first, time the K runs one by one)."""
    cfg = config(defense, eps, a.rounds)
    started = time.perf_counter()
    run = Run.create(cfg, work / "run")
    state = run.train(progress=False)
    one = time.perf_counter() - started
    acc = run.test_accuracy(state)
    r = model_mia(
        run,
        f"{defense}-half-model",
        attack="lira",
        references=a.references,
        on=a.on,
        victim=VICTIM,
        population=16,
        progress=False,
    )
    separate = None
    if i == 0:  # the same K runs simulated one at a time (another seed: no cache)
        cands = draw_candidates(run, VICTIM, None, 16, seed=1)
        t0 = time.perf_counter()
        reference_models(
            run,
            VICTIM,
            cands,
            a.references,
            until=r.details["round"],
            kind="half-model" if a.on == "message" else None,
            receiver=r.details["receiver"],
            seed=1,
            batch=1,
        )
        separate = time.perf_counter() - t0
    scores = {
        n: {"auc": v["auc"], "tpr_1%": v["tpr_at_fpr"]["0.01"]["tpr"]}
        for n, v in r.details["scores"].items()
    }
    return dict(defense=defense, eps=eps, acc=acc, scores=scores, epsilon=r.details["epsilon"],
                epsilon_lo=r.epsilon_lo, one=one, batched=r.details["references"]["seconds"],
                separate=separate)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--references", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--on", default="message", choices=("message", "final"))
    ap.add_argument("--threads", type=int, default=1)
    add_out(ap, "membership_models")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)

    def identity(defense: str, eps: float | None) -> dict:
        return dict(bench="membership_models", defense=defense, epsilon=eps,
                    references=a.references, rounds=a.rounds, on=a.on)  # fmt: skip

    pieces = Pieces(a.out, [identity(d, e) for d, e in SETTINGS], [__file__])
    rows = [
        pieces.run(
            identity(defense, eps),
            lambda work, i=i, d=defense, e=eps: setting(i, d, e, a, work),
        )
        for i, (defense, eps) in enumerate(SETTINGS)
    ]
    k = a.references
    print(
        f"\n{a.on} model of agent {VICTIM} (10 members vs 10 label-matched non-members), "
        f"K = {k} reference runs, {a.rounds} rounds, torch threads {a.threads}\n"
    )
    print(
        "| run | ε | test acc | AUC LOSS | AUC LiRA on | AUC LiRA off | AUC RMIA "
        "| TPR@1%FPR LOSS / LiRA on / LiRA off / RMIA | ε bound | ε lower | one run s "
        f"| K={k} batched s (×) | K={k} one by one s (×) |"
    )
    print("|" + "---|" * 13)
    for row in rows:
        s, one, batched, separate = row["scores"], row["one"], row["batched"], row["separate"]
        tpr = " / ".join(
            f"{s[n]['tpr_1%']:.2f}" for n in ("loss", "lira-online", "lira-offline", "rmia")
        )
        sep = "–" if separate is None else f"{separate:.1f} ({separate / one:.1f}×)"
        bound = "∞" if row["epsilon"] is None else f"{row['epsilon']:.3g}"
        eps = row["eps"]
        print(
            f"| {row['defense']} | {eps if eps else '∞'} | {row['acc']:.2f} "
            f"| {s['loss']['auc']:.3f} | {s['lira-online']['auc']:.3f} "
            f"| {s['lira-offline']['auc']:.3f} | {s['rmia']['auc']:.3f} | {tpr} | {bound} "
            f"| {row['epsilon_lo']:.2f} | {one:.1f} | {batched:.1f} ({batched / one:.1f}×) "
            f"| {sep} |"
        )


if __name__ == "__main__":
    main()
