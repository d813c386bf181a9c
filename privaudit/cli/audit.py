"""``privaudit audit``: ε upper bounds (accounting) beside an ε lower bound (canary audit)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from privaudit.cli.options import (
    add_overwrite,
    check_out,
    check_threat,
    checked_params,
    config_from_args,
    edges_of,
    open_run,
    option_value,
    run_in_out,
    training_options,
)
from privaudit.cli.rules import agent_ids
from privaudit.cli.vocabulary import Vocabulary
from privaudit.core import limits
from privaudit.core.errors import PrivauditError
from privaudit.core.files import dumps_strict
from privaudit.core.text import sig
from privaudit.core.threat import threat_help


def add_parser(sub: Any, words: Vocabulary) -> None:
    """Register ``audit`` on the CLI's subparsers."""
    au = sub.add_parser(
        "audit", help="ε the accounting promises vs ε a canary audit proves (lower bound)"
    )
    au.add_argument("--target", required=True, help="e.g. dpdl-cg (privaudit targets)")
    au.add_argument("--mode", default="white-box", help="white-box (default) | one-run")
    au.add_argument(
        "--trials",
        type=int,
        default=None,
        help="white-box: re-runs of the round (default 4000); one-run: canaries (default 1000)",
    )
    au.add_argument("--confidence", type=float, default=0.95, help="of the lower bound")
    au.add_argument("--round", type=int, default=1, help="white-box: the audited round")
    au.add_argument(
        "--threat", default=None, help=f"{threat_help()} (default: the weakest that observes it)"
    )
    au.add_argument("--link", default=None, metavar="SRC,DST", help="the audited link")
    au.add_argument(
        "--attacker",
        default=None,
        metavar="A[,B,...]",
        help="the neighbor, or the coalition's members (default: the victim's first receiver, "
        "or every receiver)",
    )
    au.add_argument(
        "--victim",
        default=None,
        metavar="V",
        help="the agent whose data carries the canary: one agent id, as attack's --victim "
        "takes them (default: the first non-attacker; with --link, its sender)",
    )
    au.add_argument(
        "--canary-norm",
        type=float,
        default=None,
        help="white-box: fix the canary's norm; default: search norms C, 100C, 10C and shapes "
        "(a pilot quarter of the trials, each bound at 1 − α/(2K); the best candidate on the "
        "rest at 1 − α/2: the largest bound holds at 1 − α)",
    )
    au.add_argument(
        "--canary-shape",
        default=None,
        metavar="SHAPE",
        help="white-box: fix the canary's shape, dirac | opposite | example (no shape search); "
        "real: a training example under its own label (the input-space audit)",
    )
    au.add_argument(
        "--canaries",
        type=int,
        default=None,
        metavar="K",
        help="white-box: K Dirac canaries of norm C per trial, each in by its own coin, their "
        "Gaussian-DP estimate pooled (a Gaussian release over per-example clipped gradients, "
        "observed exactly; try 256): the bound of K times the trials (default 1: one canary, "
        "searched)",
    )
    au.add_argument(
        "--span",
        type=int,
        default=0,
        metavar="K",
        help="white-box: the canary joins round t = --round only; score the target of rounds "
        "t..t+K, against the K+1 releases composed (default 0)",
    )
    au.add_argument(
        "--observe",
        default="messages",
        help="messages (default): the adversary sees the target's messages (the modes above); "
        "final: only the final models after every round, the canary in the victim's update "
        "in every round (hidden-state threat; each trial re-runs all --rounds, default 3)",
    )
    au.add_argument(
        "--observer",
        default="agent",
        help="--observe final: whose final model is seen: agent (default: --attacker, or the "
        "victim's first neighbour) | coalition (the --attacker models stacked, default the "
        "victim's neighbours) | average (of every agent's model)",
    )
    au.add_argument(
        "--batches",
        default="run",
        help="--observe final: run (default: the run's own batches) | empty (the canary "
        "alone: DP's worst case, where the scores are exactly Gaussian)",
    )
    au.add_argument(
        "--audit-seed",
        type=int,
        default=0,
        help="the audit's own draws (canaries, each trial's coin and noise), apart from the "
        "run's --seed: the same run audited again with another (default 0)",
    )
    au.add_argument("--run", default=None, help="an existing run directory (else one is made)")
    au.add_argument("--out", default=None, help="output folder (default privaudit-out/audit-T)")
    add_overwrite(au)
    au.add_argument("--json", action="store_true", help="print audit.json on stdout")
    training_options(au, None)  # --rounds default: the default run length (σ from ε over it)
    au.set_defaults(func=cmd_audit)


def cmd_audit(a: argparse.Namespace) -> int:
    from privaudit.core.files import to_jsonable, write_columns, write_json
    from privaudit.core.threat import parse_link
    from privaudit.eval.canaries import check_canary
    from privaudit.experiments.audit import audit, check_trials
    from privaudit.sim.targets import Target

    limits.check_float("--confidence", a.confidence, 0.0, 1.0, lo_open=True, hi_open=True)
    if a.observe not in ("messages", "final"):
        raise PrivauditError(f"--observe must be messages or final, got {a.observe!r}")
    if a.observe == "final" and a.mode != "white-box":
        raise PrivauditError("--mode one-run audits the messages; drop it with --observe final")
    if a.mode not in ("white-box", "one-run"):
        raise PrivauditError(f"--mode must be white-box or one-run, got {a.mode!r}")
    check_threat(a.threat, a.attacker)
    target = Target.parse(a.target)
    final = a.observe == "final"
    default = 2000 if final else 4000 if a.mode == "white-box" else 1000
    trials = default if a.trials is None else a.trials
    limits.check_int("--trials", trials, 1, limits.MAX_TRIALS)
    limits.check_int("--round", a.round, 1, limits.MAX_ROUNDS)
    if a.canary_norm is not None:
        limits.check_float("--canary-norm", a.canary_norm, 0.0, lo_open=True)
    check_canary(a.canary_norm, a.canary_shape)
    limits.check_int("--span", a.span, 0, limits.MAX_ROUNDS)
    if a.canaries is not None:
        limits.check_int("--canaries", a.canaries, 1, 1 << 24)
        pooled_with = [f for f, v in (("--span", a.span), ("--canary-shape", a.canary_shape),
                                      ("--canary-norm", a.canary_norm)) if v]  # fmt: skip
        if a.canaries > 1 and pooled_with:
            raise PrivauditError(
                f"{pooled_with[0]} is for one canary per trial; --canaries K uses Dirac "
                "canaries of norm C: drop one of them"
            )
    limits.check_seed("--audit-seed", a.audit_seed)
    out = check_out(a.out or f"privaudit-out/audit-{a.target}", "audit", a.overwrite)
    given = open_run(a) if a.run else None
    if given is not None:
        cfg, edges = given.cfg, given.edges()
    else:
        agents = option_value(a, "agents")
        rounds = a.rounds
        if rounds is None:
            rounds = 3 if final else target.rounds_to_train(a.round, agents, a.span)
        cfg = checked_params(config_from_args(a, target.defense.name, rounds))  # checks --delta
        edges = edges_of(cfg)
    check_trials(trials, cfg.delta, a.confidence, a.mode)
    link = parse_link(a.link, edges) if a.link else None  # before a run is created
    attackers = agent_ids("--attacker", a.attacker, cfg.agents) if a.attacker else None
    victim = agent_ids("--victim", a.victim, cfg.agents)[0] if a.victim else None
    with run_in_out(out, "audit", given, cfg) as run:
        result = (_final if final else audit)(
            run,
            target,
            mode=a.mode,
            round=a.round,
            trials=trials,
            confidence=a.confidence,
            threat=a.threat,
            link=link,
            attackers=attackers,
            victim=victim,
            canary_norm=a.canary_norm,
            **_mode_options(a),
            seed=a.audit_seed,
            progress=not a.no_progress,
        )
    if not isinstance(result, dict):  # audit()'s AuditResult (the final-model audit: a dict)
        result = result.to_dict()  # the document audit.json holds, key for key
    write_columns(out / "scores.csv", result.pop("raw"))  # every trial's outcome, to re-plot
    result["scores_file"] = "scores.csv"
    if "tradeoff" in result:
        result["tradeoff_figure"] = str(_tradeoff_figure(result, out / "tradeoff.png"))
    doc = to_jsonable(result)
    write_json(out / "audit.json", doc)
    if a.json:
        print(dumps_strict(doc, sort_keys=False))
    else:
        print(_report(result, trials))
        print(f"wrote {out / 'audit.json'} and {out / 'scores.csv'}")
    if result.get("interrupted"):  # the bounds stand, of fewer trials: not a finished audit
        print(f"privaudit: error: {_interrupted(result, trials)}", file=sys.stderr)
        return 2
    return 0


def _mode_options(a: argparse.Namespace) -> dict[str, Any]:
    """The options only one kind of audit takes."""
    if a.observe == "final":
        return {"observer": a.observer, "batches": a.batches}
    if a.mode != "white-box":
        return {}
    return {"canary_shape": a.canary_shape, "span": a.span, "canaries": a.canaries}


def _final(run: Any, target: Any, **kw: Any) -> dict[str, Any]:
    """:func:`~privaudit.experiments.final_audit.final_model_audit` with the white-box
    audit's keywords (those it has no use for are refused by the option rules first)."""
    from privaudit.experiments.final_audit import final_model_audit

    for unused in ("mode", "round", "threat", "link"):
        kw.pop(unused)
    return final_model_audit(run, target, **kw)


def _tradeoff_figure(r: dict[str, Any], path: Path) -> Path:
    """The trade-off curve of the audit's scores beside the accounted one: the release's μ
    where the observation is exactly Gaussian (its exact ε at δ read as μ-GDP)."""
    from privaudit.eval.fdp import gdp_mu, plot_tradeoff

    up = r["upper"].get("accountant")
    delta = r["accounting"]["delta"] if r["mode"] == "final" else r["delta"]
    mu = gdp_mu(up, delta) if "gdp" in r and up is not None else None
    head = f"{r['threat']} · {r['target']} · round {r['round']} · {r['trials']} trials"
    return plot_tradeoff(r["tradeoff"]["curve"], path, mu=mu, title=head)


def _interrupted(r: dict[str, Any], asked: int) -> str:
    """The line of an audit a Ctrl-C ended early: how many trials ran, and what to do."""
    unit = "canaries" if r["mode"] == "one-run" else "trials"
    return (
        f"interrupted after {r['trials']} of {asked} {unit}: the bounds above are of those "
        f"only; run the same command again for all {asked}"
    )


def _report(r: dict[str, Any], asked: int | None = None) -> str:
    """The audit's text report; an audit a Ctrl-C ended early (``interrupted``, ``asked``
    trials requested) says so in its first line and again before the verdict."""
    if r["mode"] == "final":
        return _final_report(r, asked)
    acc = r["accounting"]
    lo = r["epsilon_lo"]
    k = acc["copies"]
    span = r.get("span", 0)
    if r["mode"] != "white-box":
        unit = "the whole run"
    elif span:
        unit = f"the {k} releases of rounds {r['round']}..{r['round'] + span} composed"
    else:
        unit = "one release" if k == 1 else f"the {k} releases the observation combines"
    unit += " (sample rate 1)" if r["mode"] == "white-box" else ""
    where = f"round {r['round']}" if r["mode"] == "white-box" else f"{r['rounds']} rounds"
    if span:
        where += f" + {span} (span)"
    lines = [
        f"{r['target']} · {r['mode']} audit · {where} · {r['threat']} · victim {r['victim']} · "
        f"{r['trials']} {'trials' if r['mode'] == 'white-box' else 'canaries'} · "
        f"δ = {r['delta']:g}",
        f"mechanism: {acc['mechanism']}; {acc['reason']}",
    ]
    if r.get("beyond"):
        last = r["round"] + span
        lines.append(
            f"observed: every message {r['threat']} receives or sends in rounds "
            f"{r['round']}..{last} (victim {r['distance']} hops away, no copy of its own "
            f"message), scored by the {r['statistic']} statistic"
        )
    if not acc["formal"]:
        lines.append(f"ε upper = ∞: no formal DP ({acc['reason']})")
    lines.append(f"ε lower ≥ {lo:.3g} at confidence {r['confidence']:g} ({acc['adjacency']})")
    lines += _gdp_lines(r)
    if "tradeoff" in r:
        t = r["tradeoff"]
        lines.append(
            f"  trade-off curve ({len(t['curve']['threshold'])} thresholds, FPR/FNR band at "
            f"{t['curve']['confidence']:g}): not μ-GDP for μ < {sig(t['mu_lo'])}"
        )
    lines += _cp_lines(r)
    if "one_run_fdp" in r:
        f, mu, o = r["one_run_fdp"], r["mu"], r["one_run"]
        against = (
            f" against the accounted μ = {sig(mu['upper'])} → {mu['verdict']}"
            if mu["upper"] is not None
            else ""
        )
        lines += [
            f"  one run, f-DP analysis (Mahloujifar et al.): not (ε, δ)-DP for ε < "
            f"{sig(f['epsilon_lo'])} ({int(f['correct'])} of {int(f['guesses'])} guesses "
            f"correct, {int(f['canaries'])} canaries); not μ-GDP for μ < {sig(mu['lower'])}"
            f"{against} (a Gaussian mechanism of that μ has ε = {sig(f['epsilon_gdp'])})",
            f"  each at {mu['confidence']:.4g}, together at {r['confidence']:g}; Steinke et "
            f"al.'s analysis of the same canaries, at {mu['confidence']:.4g}: ε ≥ "
            f"{sig(o['epsilon'])} ({int(o['correct'])} of {int(o['guesses'])} correct)",
        ]
    if "search" in r:
        lines += _search_lines(r)
    lines.append(f"ε upper, {unit}:")
    width = max(map(len, r["upper"]))
    for name, up in r["upper"].items():
        lines.append(f"  {name:<{width}} {sig(up):>8}   → {r['verdicts'][name]}")
    if "pairwise_share" in acc:
        lines.append(_pairwise_line(acc))
    run_eps = acc["run"]
    lines.append(
        f"ε over the run ({acc['rounds']} rounds, q = {acc['sample_rate']:.3g}, "
        f"{acc['releases_per_round']} release(s)/round, {acc['accountant']}): "
        f"{sig(run_eps)} (the paper's count: {sig(acc['run_claimed'])})"
    )
    lines.append(f"paper: {acc['paper']}")
    for c in acc["caveats"]:
        lines.append(f"caveat: {c}")
    if r.get("interrupted"):
        stop = _interrupted(r, r["trials"] if asked is None else asked)
        lines.insert(1, stop)
        lines.append(stop)
    lines.append(f"verdict: {r['verdict']}")
    return "\n".join(lines)


def _gdp_lines(r: dict[str, Any]) -> list[str]:
    """The Gaussian-DP estimate with its intervals, where the scores are exactly Gaussian."""
    if "gdp" not in r:
        return []
    g = r["gdp"]
    pooled = (
        f", pooled over {int(g['canaries'])} canaries per trial (cluster-robust)"
        if "canaries" in g
        else ""
    )
    return [
        f"  Gaussian DP: μ = {g['mu']:.3g} [{g['mu_lo']:.3g}, {g['mu_hi']:.3g}] → "
        f"ε = {g['epsilon']:.3g} [{g['epsilon_lo']:.3g}, {g['epsilon_hi']:.3g}]{pooled}"
    ]


def _cp_lines(r: dict[str, Any]) -> list[str]:
    """The Clopper–Pearson bound, and whether the trial count caps it."""
    if "clopper_pearson" not in r:
        return []
    cp = r["clopper_pearson"]
    cap = " (capped by the trial count: more trials raise it)" if cp["capped"] else ""
    return [f"  Clopper–Pearson: ε ≥ {cp['epsilon_lo']:.3g}{cap}"]


def _final_report(r: dict[str, Any], asked: int | None = None) -> str:
    """The final-model audit's text report: what was observed, the bounds, and the upper
    bounds of the mechanism it ran (the canary in every round, sample rate 1)."""
    acc, c = r["accounting"], r["canary"]
    lines = [
        f"{r['target']} · final-model audit · {r['rounds']} rounds · {r['threat']} · victim "
        f"{r['victim']} ({r['distance']} hop{'' if r['distance'] == 1 else 's'}) · "
        f"{r['trials']} trials · δ = {acc['delta']:g}",
        f"canary: dirac, norm {sig(c['norm'])}, in the victim's update {c['rounds']}; "
        f"batches: {r['batches']}; statistic: {r['statistic']}",
        f"ε lower ≥ {r['epsilon_lo']:.3g} at confidence {r['confidence']:g} ({acc['adjacency']})",
    ]
    lines += _gdp_lines(r)
    lines += _cp_lines(r)
    mu = r["mu"]
    bound = f" against the accounted μ = {sig(mu['upper'])}" if mu["upper"] is not None else ""
    lines.append(f"  trade-off curve: not μ-GDP for μ < {sig(mu['lower'])}{bound}")
    lines.append(
        f"ε upper, the {acc['rounds']} rounds composed at sample rate 1 ({acc['sampling']}):"
    )
    width = max(map(len, r["upper"]))
    for name, up in r["upper"].items():
        lines.append(f"  {name:<{width}} {sig(up):>8}   → {r['verdicts'][name]}")
    lines.append(
        f"the run's own ε at its rate q = {acc['sample_rate']:.3g}: {sig(acc['run'])} (stated, "
        "not compared: a canary in every round is not the example q accounts for)"
    )
    if r.get("interrupted"):
        stop = _interrupted(r, r["trials"] if asked is None else asked)
        lines.insert(1, stop)
        lines.append(stop)
    lines.append(f"verdict: {r['verdict']}")
    return "\n".join(lines)


def _pairwise_line(acc: dict[str, Any]) -> str:
    """The attackers' pairwise shares: the exact view's and the paper's theorem's, and
    which one a linear attacker can beat."""
    line = f"pairwise share: {acc['pairwise_share']:.3g} (exact view of what the attackers hold"
    if "pairwise_share_paper" not in acc:
        return line + ")"
    line += f"; the paper's theorem: {acc['pairwise_share_paper']:.3g})"
    if acc["pairwise_beatable"]:
        line += (
            " — the paper's theorem is below the exact view at its own σ: a linear attacker "
            "on what the attackers hold can beat it"
        )
    return line


def _search_lines(r: dict[str, Any]) -> list[str]:
    """The canary that gave the bound, then every candidate's bounds (pilot, final)."""
    s, c = r["search"], r["canary"]
    found = s["candidates"]
    how = (
        f"search over {len(found)}: pilot of {s['pilot_trials']} trials, each bound at "
        f"{s['levels']['pilot']:.4g}; final on candidate {s['chosen'] + 1} at "
        f"{s['levels']['final']:.4g}"
        if len(found) > 1
        else f"no search: every trial on it, at {s['levels']['final']:.4g}"
    )
    count = f"{c['count']} " if "count" in c else ""  # --canaries K: K per trial
    lines = [
        f"canary: {count}{c['kind']}, norm {sig(c['norm'])}, impact {sig(c['impact'])} ({how})"
    ]
    for i, e in enumerate(found, 1):
        phases = [
            f"{name} ε ≥ {e[name]['epsilon_lo']:.3g} ({e[name]['trials']} trials)"
            for name in ("pilot", "final")
            if e[name] is not None
        ]
        shift = ", ".join(f"{x:.3g}" for x in e["shift"]) if "shift" in e else None
        lines.append(
            f"  {i}. {e['kind']:<8} norm {sig(e['norm']):>7}  impact {sig(e['impact']):>7}"
            + (f"  shift per round [{shift}]" if shift else "")
            + (f"  {'; '.join(phases)}" if phases else "  no trials")
        )
    return lines
