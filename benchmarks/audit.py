"""How tight is the white-box audit? ε lower bound / accounted ε of one release, for every
message kind of every defense that has a formal per-release guarantee.

The kinds are read from the defenses' registry and their own mechanism facts (a run's
``resolved["kinds"]``: ``formal`` over the run, or ``per_release`` — one release at a fixed
evaluation point is a Gaussian mechanism, e.g. ``dpdl-cg``): nothing is listed by hand, so a
new defense, or a plugin's (``--plugin FILE``), is measured too. For each kind and each
ε ∈ {1, 2, 4} (δ = 1e-5), σ is set so that one release's noise multiplier z gives
ε_target (PRV, sample rate 1, one step; z is read at σ = 1 and assumed proportional to σ,
which the run's facts confirm — the row says the accounted ε the audit actually compares
with). The white-box audit re-runs round 1 ``--trials`` times on the defense's own code (the
costly kinds the claims ledger's fixed share: :func:`privaudit.experiments.claims.row_trials`)
with one fixed canary, the canary search's first candidate for the kind's stated clip
(:func:`privaudit.eval.canaries.candidates`): a Dirac of norm C against a per-example clip
(Nasr et al.'s worst case), the clean gradient's opposite at a dominating norm against a
flat batch clip (the clipped mean swings by 2C, its sensitivity) — so that the row measures
the tightness of the bound, not of a canary search. Printed per row: the audit's ε lower
bound, the Gaussian-DP estimate's point (where the scores are exactly Gaussian: else "–")
and the Clopper–Pearson bound, each over the accounted one-release ε, and the trials behind
them. A bound above the accounted ε beyond its confidence would be a finding: ``ok`` says no.

With ``--canaries K`` each trial carries K Dirac canaries of norm C, each in by its own coin,
their Gaussian-DP estimate pooled (``privaudit audit --canaries``,
:mod:`privaudit.experiments.audit_pooled`); the kinds whose facts rule pooling out
(:func:`~privaudit.experiments.audit_pooled.not_pooled`: a flat batch clip) are listed under
the table.

    python benchmarks/audit.py [--trials 10000 --agents 4 --epsilons 1,2,4 --canaries 256]
                               [--targets dp-dpsgd-half-model,…] [--plugin FILE]
                               [--markdown figures/audit.md] [--out DIR] [--list]

Each row is saved in ``--out`` (default ``privaudit-out/benchmarks/audit``) as it finishes; a
rerun into the same folder prints the rows already there and computes the rest
(``benchmarks/resume.py``).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from resume import Pieces, add_out  # noqa: E402 - a sibling script, not a package

from privaudit.core.accounting import sigma_for_epsilon
from privaudit.core.config import RunConfig
from privaudit.defenses import DEFENSES
from privaudit.eval.canaries import candidates
from privaudit.experiments.audit import audit, check_trials
from privaudit.experiments.audit_pooled import not_pooled
from privaudit.experiments.claims import row_trials
from privaudit.plugins import load_plugins
from privaudit.sim.run import Run
from privaudit.sim.targets import Target

GOAL = 0.95  # the bar for the Gaussian-DP lower bound / accounted ε


def run_config(defense: str, agents: int, sigma: float, delta: float, rounds: int = 1) -> RunConfig:
    """``rounds`` of ``defense`` on its own graph (the ring where it requires none)."""
    topology = DEFENSES[defense].topology or "ring"
    return RunConfig(
        defense=defense, rounds=rounds, agents=agents, epsilon=None, sigma=sigma, delta=delta,
        topology=topology,
    )  # fmt: skip


def formal_kinds(agents: int, delta: float) -> dict[str, tuple[str, float]]:
    """``{target: (defense, z at σ = 1)}`` for every kind whose one release is a Gaussian
    mechanism by its defense's own facts (formal, or formal per release), in registry order."""
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in DEFENSES:
            run = Run.create(run_config(name, agents, 1.0, delta), Path(tmp) / name)
            for kind, facts in run.resolved["kinds"].items():
                if (facts["formal"] or facts["per_release"]) and facts["noise_multiplier"] > 0:
                    found[f"{name}-{kind}"] = (name, facts["noise_multiplier"])
    return found


def measure(target: str, defense: str, z1: float, eps: float, trials: int, a, work: Path) -> dict:
    """One row: the white-box audit of ``target`` at the σ whose one release has ε = ``eps``,
    the run in ``work``."""
    sigma = sigma_for_epsilon(eps, a.delta, 1.0, 1, 1, "prv") / z1
    rounds = max(Target.parse(target).rounds_needed(1, a.agents))  # round 1 may need round 2
    run = Run.create(run_config(defense, a.agents, sigma, a.delta, rounds), work / "run")
    # the search's first candidate: the worst case for a correct clip of the kind's stated
    # unit (a Dirac of C per example; against the clean gradient, 2C, for a flat batch clip)
    privacy = Target.parse(target).privacy(run, 0)
    first = candidates(privacy, run.cfg.batch_size)[0]
    fixed = {"canary_shape": first.kind, "canary_norm": first.norm}
    if a.canaries > 1:  # K Dirac canaries of norm C per trial, pooled, where the kind allows
        if not_pooled(privacy):
            return {"refused": not_pooled(privacy)}
        fixed = {"canaries": a.canaries}
    t0 = time.perf_counter()
    r = audit(run, target, trials=trials, progress=False, **fixed)
    label = f"{first.kind} {first.norm:g}"
    label = f"{a.canaries} × dirac {first.norm:g}" if a.canaries > 1 else label
    own = r.details  # the white-box audit's own entries: its bounds, the copies observed
    g = own.get("gdp") or {"epsilon_lo": None, "epsilon": None}  # only where exactly Gaussian
    return {
        "sigma": sigma,
        "upper": r.upper["accountant"],
        "copies": own.get("copies", 1),
        "epsilon_lo": r.epsilon_lo,
        "gdp_lo": g["epsilon_lo"],
        "gdp": g["epsilon"],
        "cp_lo": own["clopper_pearson"]["epsilon_lo"],
        "trials": trials,
        "canary": label,
        "wall": time.perf_counter() - t0,
    }


def ratios(m: dict) -> tuple[float, str, float]:
    """The audit's lower bound, the Gaussian-DP point ("–" where the scores are not exactly
    Gaussian) and the Clopper–Pearson bound, each over the accounted ε."""
    u = m["upper"]
    point = "–" if m["gdp"] is None else f"{m['gdp'] / u:.2f}"
    return m["epsilon_lo"] / u, point, m["cp_lo"] / u


def markdown(rows: list[tuple[str, float, dict]], a: argparse.Namespace) -> str:
    """The table as published (figures/audit.md)."""
    lines = [
        "| target | canary | ε target | σ | accounted ε | trials | ε ≥ | ratio | GDP point | "
        "CP ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    refused = sorted({(t, m["refused"]) for t, _, m in rows if "refused" in m})
    rows = [r for r in rows if "refused" not in r[2]]
    for target, eps, m in rows:
        lo, point, cp = ratios(m)
        lines.append(
            f"| `{target}` | {m['canary']} | {eps:g} | {m['sigma']:.3f} | {m['upper']:.3f} | "
            f"{m['trials']} | {m['epsilon_lo']:.3f} | {lo:.2f} | {point} | {cp:.2f} |"
        )
    worst = min(ratios(m)[0] for _, _, m in rows)
    canary = (
        f"{a.canaries} Dirac canaries of norm C per trial, each in by its own coin, their "
        "Gaussian-DP estimate pooled (`--canaries`; Clopper–Pearson on the first alone)"
        if a.canaries > 1
        else "one fixed canary: the search's first candidate for the kind's clip (Dirac of C "
        "per example, the opposite gradient for a flat batch clip)"
    )
    lines += [
        "",
        f"White-box audit of one release of round 1, {a.agents} agents, δ = {a.delta:g}, 95% "
        f"confidence, {canary}. ε ≥: the "
        "audit's lower bound (the larger of Clopper–Pearson and the Gaussian-DP estimate's, "
        "where the scores are exactly Gaussian); ratio: it over the accounted one-release ε, "
        f"smallest {worst:.2f} (goal ≥ {GOAL}); GDP point: the Gaussian-DP estimate over the "
        "accounted ε; CP ratio: Clopper–Pearson's bound alone.",
    ]
    for why in sorted({w for _, w in refused}):  # one canary per trial only: the table above
        kinds = ", ".join(f"`{t}`" for t, w in refused if w == why)
        lines += ["", f"Not pooled ({why}; one canary per trial only): {kinds}."]
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10000, help="white-box trials per row")
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--epsilons", default="1,2,4")
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--targets", default=None, help="comma-separated (default: every one)")
    ap.add_argument("--plugin", action="append", default=[], help="a plugin file to load first")
    ap.add_argument("--markdown", type=Path, default=None, help="write the table here too")
    ap.add_argument("--list", action="store_true", help="list the kinds measured and stop")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (small ops: 1)")
    ap.add_argument(
        "--canaries", type=int, default=1,
        help="Dirac canaries per trial, pooled (privaudit audit --canaries; default 1: one)",
    )  # fmt: skip
    add_out(ap, "audit")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    torch.set_num_threads(a.threads)
    load_plugins(a.plugin)
    kinds = formal_kinds(a.agents, a.delta)
    if a.targets:
        wanted = a.targets.split(",")
        unknown = sorted(set(wanted) - set(kinds))
        if unknown:
            raise SystemExit(f"audit.py: no formal kind {', '.join(unknown)}; see --list")
        kinds = {t: kinds[t] for t in wanted}
    need = check_trials(a.trials, a.delta)
    if a.list:
        for t, (_, z1) in kinds.items():
            print(f"{t:<22} z = {z1:g} σ, trials {row_trials(t, a.trials, need)}")
        return
    eps_list = [float(e) for e in a.epsilons.split(",")]

    def identity(target: str, eps: float) -> dict:
        return dict(bench="audit", target=target, epsilon=eps, trials=a.trials,
                    agents=a.agents, delta=a.delta, canaries=a.canaries)  # fmt: skip

    pieces = Pieces(a.out, [identity(t, e) for t in kinds for e in eps_list], [__file__])
    print(f"white-box audit of one release, δ = {a.delta:g}, 95% confidence, {len(kinds)} kinds")
    print(
        f"{'target':<22} {'ε':>4} {'σ':>6} {'ε_acct':>7} {'trials':>6} {'ε ≥':>7} "
        f"{'lo/ε':>6} {'pt/ε':>6} {'CP/ε':>6} {'ok':>4} {'s':>6}"
    )
    rows = []
    for target, (defense, z1) in kinds.items():
        trials = row_trials(target, a.trials, need)  # the ledger's share for costly kinds
        for eps in eps_list:
            m = pieces.run(
                identity(target, eps),
                lambda w, t=target, d=defense, z=z1, e=eps, n=trials: measure(t, d, z, e, n, a, w),
            )
            rows.append((target, eps, m))
            if "refused" in m:
                print(f"{target:<22} {eps:>4g} not pooled: {m['refused']}", flush=True)
                continue
            lo, point, cp = ratios(m)
            print(
                f"{target:<22} {eps:>4g} {m['sigma']:>6.3f} {m['upper']:>7.3f} {m['trials']:>6} "
                f"{m['epsilon_lo']:>7.3f} {lo:>6.3f} {point:>6} {cp:>6.3f} "
                f"{'yes' if m['epsilon_lo'] <= m['upper'] else 'NO':>4} {m['wall']:>6.1f}",
                flush=True,
            )
    worst = min((ratios(m)[0] for _, _, m in rows if "refused" not in m), default=math.nan)
    print(f"smallest lower-bound ratio: {worst:.3f} (goal ≥ {GOAL})")
    if a.markdown:
        a.markdown.parent.mkdir(parents=True, exist_ok=True)
        a.markdown.write_text(markdown(rows, a))


if __name__ == "__main__":
    main()
