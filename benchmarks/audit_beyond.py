"""How tight are the audits beyond one release? The one-run audit (Steinke, Nasr & Jagielski
2023, and Mahloujifar, Melis & Chaudhuri's f-DP analysis of the same canaries) over a whole
DP-D-PSGD run, and the final-model audit (the hidden-state threat: only the final models are
seen), each as its lower bound over the run's accounted ε.

**One run** (ε = 4 by default): ``dp-dpsgd`` on 4 agents of a ring, 3 rounds, full batches
of 8 examples (q = 1: what is drawn is every example, every round, so the run's ε is its 3
Gaussian releases composed, σ calibrated by the PRV accountant), observed by the coalition
of the victim's two neighbours, which hears every message the victim sends. The canaries are
Dirac gradients of norm C on distinct coordinates, each included by a fair coin, so their
number is bounded by the model's parameters: 10,000 on LeNet (15,826 parameters), 500,000 on
the 2NN (``mlp``, 200-200 ReLU, 656,810). Printed per row: the f-DP analysis's (ε, δ) bound
(the audit's ε lower bound, valid for any mechanism) and its Gaussian-DP bound (the μ
rejected, as the ε of a Gaussian mechanism of that μ: comparable where the mechanism is
exactly Gaussian, as here up to the real examples' gradients), each at 1 − α/2, and
Steinke et al.'s bound on the same canaries at the same level, each over the accounted ε.

**Final models** (ε = 10): ``dp-dpsgd``, 4 agents, LeNet, 2 rounds, full batches of 2
(σ by RDP, the run's default accountant), a Dirac canary of norm C in the victim's update in
every round on empty batches (DP's worst case: the scores are exactly Gaussian), the
coalition of all 4 final models as the observer; on a ring (victim 0) and a
star (victim 1, a leaf), 10,000 trials each. Printed: the lower bound over the run's ε and over
the unamplified mechanism's PRV ε (what the audit compares with), the Gaussian-DP point, the
trade-off band's μ lower bound against the accounted μ. What the coalition cannot reach of
the run's ε is what the gossip's mixing hides (docs/privacy-accounting.md).

    python benchmarks/audit_beyond.py [--epsilon 4 --final-epsilon 10 --confidence 0.95]
                                      [--markdown figures/audit-beyond.md] [--out DIR]

Each row is saved in ``--out`` (default ``privaudit-out/benchmarks/audit-beyond``) as it
finishes; a rerun into the same folder prints the rows already there and computes the rest
(``benchmarks/resume.py``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from resume import Pieces, add_out  # noqa: E402 - a sibling script, not a package

from privaudit.core.config import RunConfig
from privaudit.experiments.audit import audit
from privaudit.experiments.final_audit import final_model_audit
from privaudit.sim.run import Run

TARGET = "dp-dpsgd-half-model"
ONE_RUN = (("lenet", 10_000), ("mlp", 500_000))  # model, canaries
FINAL = (("ring", 0, 10_000), ("star", 1, 10_000))  # topology, victim (a leaf of the star), trials
ONE_RUN_GOAL, FINAL_GOAL = 0.6, 0.7  # the bars: of ε = 4 in one run, of ε = 10


def one_run_row(model: str, canaries: int, a: argparse.Namespace, work: Path) -> dict:
    """The one-run audit of ``canaries`` Dirac canaries on a fresh ``model`` run (docstring)."""
    cfg = RunConfig(
        defense="dp-dpsgd", model=model, rounds=3, agents=4, topology="ring",
        examples_per_agent=8, batch_size=8, epsilon=a.epsilon, accountant="prv",
    )  # fmt: skip
    run = Run.create(cfg, work / "run")
    t0 = time.perf_counter()
    r = audit(run, TARGET, mode="one-run", trials=canaries, confidence=a.confidence,
              threat="coalition", progress=False)  # fmt: skip
    d = r.details
    return {
        "parameters": run.ctx.spec.numel,
        "canaries": canaries,
        "sigma": run.resolved["sigma"],
        "upper": r.upper["accountant"],
        "steinke": d["one_run"]["epsilon"],
        "fdp": d["one_run_fdp"]["epsilon_lo"],
        "mu_lo": d["one_run_fdp"]["mu_lo"],
        "gdp": d["one_run_fdp"]["epsilon_gdp"],
        "guesses": int(d["one_run_fdp"]["mu_guesses"]),
        "correct": int(d["one_run_fdp"]["mu_correct"]),
        "wall": time.perf_counter() - t0,
    }


def final_row(topology: str, victim: int, trials: int, a: argparse.Namespace, work: Path) -> dict:
    """The final-model audit of every agent's final model (docstring)."""
    cfg = RunConfig(
        defense="dp-dpsgd", rounds=2, agents=4, topology=topology, model="lenet",
        examples_per_agent=2, batch_size=2, epsilon=a.final_epsilon,
    )  # fmt: skip
    run = Run.create(cfg, work / "run")
    t0 = time.perf_counter()
    r = final_model_audit(
        run, TARGET, trials=trials, confidence=a.confidence, observer="coalition",
        attackers=[0, 1, 2, 3], victim=victim, batches="empty", progress=False,
    )  # fmt: skip
    return {
        "exact_mu": exact_mu(run.ctx.W.cpu().double().numpy(), victim, cfg.rounds)
        / run.resolved["sigma"],
        "trials": r["trials"],
        "run_epsilon": r["accounting"]["run"],
        "upper": r["upper"]["accountant"],
        "epsilon_lo": r["epsilon_lo"],
        "gdp": r["gdp"]["epsilon"],
        "mu": r["gdp"]["mu"],
        "mu_band": r["mu"]["lower"],
        "mu_upper": r["mu"]["upper"],
        "verdict": r["verdict"],
        "wall": time.perf_counter() - t0,
    }


def exact_mu(W: np.ndarray, victim: int, rounds: int) -> float:
    """μ·σ of the stacked final models of D-PSGD on empty batches: x^T = −η Σ_s W^s (c e_v +
    ζ_s) + const (s = 1..T), the canary's shift Σ_s W^s e_v whitened by the noise's
    covariance Σ_s W^s W^sᵀ, through its pseudo-inverse as the audit whitens
    (docs/privacy-accounting.md, "What mixing hides")."""
    powers = [np.linalg.matrix_power(W, s) for s in range(1, rounds + 1)]
    shift = sum(P[:, victim] for P in powers)
    return float(np.sqrt(shift @ np.linalg.pinv(sum(P @ P.T for P in powers)) @ shift))


def markdown(ones: list[tuple[str, dict]], finals: list[tuple[str, int, dict]], a) -> str:
    """The two tables as published (figures/audit-beyond.md)."""
    lines = [
        "| model (parameters) | canaries | σ | accounted ε, run | Steinke et al. ε ≥ | "
        "f-DP: (ε, δ) ε ≥ | f-DP: μ ≥ (its ε) | guesses (correct) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, m in ones:
        u = m["upper"]
        lines.append(
            f"| `{model}` ({m['parameters']:,}) | {m['canaries']:,} | {m['sigma']:.3f} | "
            f"{u:.2f} | {m['steinke']:.2f} (**{m['steinke'] / u:.2f}**) | {m['fdp']:.2f} "
            f"(**{m['fdp'] / u:.2f}**) | {m['mu_lo']:.3f} ({m['gdp']:.2f}: **{m['gdp'] / u:.2f}**)"
            f" | {m['guesses']:,} ({m['correct']:,}) |"
        )
    lines += [
        "",
        f"One run of `{TARGET}` at ε = {a.epsilon:g} (δ = 1e-5, PRV): 4 agents on a ring, 3 "
        "rounds, full batches of 8 (q = 1), observed by the victim's two neighbours; Dirac "
        "gradient canaries of norm C, each in by a fair coin; the f-DP analysis's two tests "
        f"at 1 − α/2 each ({a.confidence:.0%} together), Steinke et al.'s at the same level. "
        "Bold: the bound over the accounted ε (goal for the f-DP analysis ≥ "
        f"{ONE_RUN_GOAL}). The f-DP μ bound is read as the ε of a Gaussian mechanism of that "
        "μ; the (ε, δ) bound beside it, the audit's ε lower bound, assumes nothing of the "
        "mechanism.",
        "",
        "| graph, victim | trials | run's ε (RDP) | unamplified ε (PRV) | ε ≥ | over the run's ε | "
        "over the PRV ε | GDP point | band μ ≥ / the observation's μ / accounted μ | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for topology, victim, m in finals:
        of_run = m["epsilon_lo"] / m["run_epsilon"]
        lines.append(
            f"| {topology}, {victim} | {m['trials']:,} | {m['run_epsilon']:.2f} | "
            f"{m['upper']:.2f} | {m['epsilon_lo']:.2f} | **{of_run:.2f}**"
            f" | {m['epsilon_lo'] / m['upper']:.2f} | {m['gdp']:.2f} | {m['mu_band']:.2f} / "
            f"{m['exact_mu']:.3f} / {m['mu_upper']:.3f} | {m['verdict']} |"
        )
    lines += [
        "",
        f"Final-model audit of `{TARGET}` at ε = {a.final_epsilon:g}: 4 agents, LeNet, 2 rounds, "
        "full batches of 2; a Dirac canary of norm C in the victim's update in every round, "
        "on empty batches; the observer is the coalition of all 4 final models "
        f"(whitened statistic); {a.confidence:.0%} confidence. Bold: the lower bound over the "
        f"run's ε (goal ≥ {FINAL_GOAL}). The observation's μ is exact (the canary's shift "
        "whitened by the noise the gossip mixes in); what it lacks of the accounted μ, the "
        "transcript's, is what the mixing hides.",
    ]
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilon", type=float, default=4.0, help="the one-run rows' ε")
    ap.add_argument("--final-epsilon", type=float, default=10.0, help="the final-model rows' ε")
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument(
        "--one-run", default=",".join(f"{m}:{k}" for m, k in ONE_RUN),
        help="the one-run rows, MODEL:CANARIES,... (default %(default)s)",
    )  # fmt: skip
    ap.add_argument(
        "--final", default=",".join(f"{t}:{v}:{n}" for t, v, n in FINAL),
        help="the final-model rows, TOPOLOGY:VICTIM:TRIALS,... (default %(default)s)",
    )  # fmt: skip
    ap.add_argument("--markdown", type=Path, default=None, help="write the tables here too")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (small ops: 1)")
    add_out(ap, "audit-beyond")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    torch.set_num_threads(a.threads)
    one_runs = [(m, int(k)) for m, k in (r.split(":") for r in a.one_run.split(",") if r)]
    finals_ = [(t, int(v), int(n)) for t, v, n in (r.split(":") for r in a.final.split(",") if r)]
    ids = [dict(bench="one-run", model=m, canaries=k) for m, k in one_runs]
    ids += [dict(bench="final", topology=t, victim=v, trials=n) for t, v, n in finals_]
    for i in ids:
        i.update(epsilon=a.epsilon if i["bench"] == "one-run" else a.final_epsilon)
        i.update(confidence=a.confidence)
    pieces = Pieces(a.out, ids, [__file__])
    ones, finals = [], []
    print(f"one run of {TARGET} at ε = {a.epsilon:g}: lower bound / accounted ε")
    for (model, canaries), ident in zip(one_runs, ids, strict=False):
        m = pieces.run(ident, lambda w, mo=model, k=canaries: one_run_row(mo, k, a, w))
        ones.append((model, m))
        u = m["upper"]
        print(
            f"  {model:<6} {canaries:>7} canaries  ε = {u:.2f}  Steinke {m['steinke'] / u:.3f}  "
            f"f-DP (ε, δ) {m['fdp'] / u:.3f}  f-DP μ {m['gdp'] / u:.3f}  "
            f"{'ok' if max(m['steinke'], m['fdp']) <= u else 'ABOVE'}  {m['wall']:.1f} s",
            flush=True,
        )
    print(f"final models of {TARGET} at ε = {a.final_epsilon:g}: lower bound / run's ε")
    for (topology, victim, trials), ident in zip(finals_, ids[len(one_runs) :], strict=True):
        m = pieces.run(ident, lambda w, t=topology, v=victim, n=trials: final_row(t, v, n, a, w))
        finals.append((topology, victim, m))
        print(
            f"  {topology:<5} victim {victim}  {trials} trials  ε ≥ {m['epsilon_lo']:.2f}  "
            f"{m['epsilon_lo'] / m['run_epsilon']:.3f} of the run's ε  {m['verdict']}  "
            f"{m['wall']:.1f} s",
            flush=True,
        )
    if a.markdown:
        a.markdown.parent.mkdir(parents=True, exist_ok=True)
        a.markdown.write_text(markdown(ones, finals, a))


if __name__ == "__main__":
    main()
