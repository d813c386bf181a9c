"""``privaudit mia``: who is in the batch behind a message, and which labels it holds."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from privaudit.cli.options import (
    add_overwrite,
    check_out,
    check_threat,
    checked_params,
    config_from_args,
    open_run,
    option_value,
    run_in_out,
    training_options,
)
from privaudit.cli.rules import adversary_of
from privaudit.cli.train import run_epsilon_line
from privaudit.cli.vocabulary import Vocabulary
from privaudit.core import limits
from privaudit.core.files import dumps_strict
from privaudit.core.text import sig
from privaudit.core.threat import threat_help

if TYPE_CHECKING:
    from privaudit.api.membership_result import MembershipResult

SCORERS = ("decompose", "lr", "lr-iso", "inner", "cosine")


def add_parser(sub: Any, words: Vocabulary) -> None:
    """Register ``mia`` on the CLI's subparsers."""
    m = sub.add_parser(
        "mia",
        help="membership inference and label counts from a target's messages (any batch size)",
        description=(
            "Score the victim's batch members against non-members of its shard by how much of "
            "each one's gradient the observed messages hold; ROC (log–log), AUC, TPR at 0.1 % "
            "and 1 % FPR, the bound (ε, δ)-DP puts on them, an ε lower bound from real "
            "examples, and the label counts the messages give away (docs/membership.md)."
        ),
    )
    m.add_argument("--target", required=True, help="e.g. dsgd-half-model (privaudit targets)")
    m.add_argument(
        "--round",
        type=int,
        default=None,
        help="grad: the first observed round (default 1); loss/lira/rmia: the round of the "
        "attacked model message (default the run's last)",
    )
    m.add_argument(
        "--messages",
        type=int,
        default=None,
        help="grad only: rounds observed from --round on (default 8)",
    )
    m.add_argument(
        "--attack",
        default="grad",
        help="grad (default): message-level, one observed message at a time; "
        f"{' | '.join(words.membership_attacks)}: model-level, on the victim's model message "
        "or the final average model, with reference runs for lira and rmia "
        "(docs/membership.md)",
    )
    m.add_argument(
        "--scorer",
        default=None,
        help=f"grad only: {' | '.join(SCORERS)} (default decompose; docs/membership.md)",
    )
    m.add_argument(
        "--references",
        type=int,
        default=8,
        help="lira/rmia: reference runs K, even (complementary pairs; default 8), simulated "
        "as one batched run and cached in the run folder",
    )
    m.add_argument(
        "--on",
        default=None,
        help="loss/lira/rmia: message (the victim's model as a neighbour receives it; the "
        "default for *-model and *-half-model targets) | final (the run's final average model; "
        "the default for other targets)",
    )
    m.add_argument(
        "--candidates",
        type=int,
        default=None,
        help="loss/lira/rmia: pairs of a shard and a test example of one label, a fair coin "
        "picking the member of each (default: as many as the victim's shard and the test "
        "split allow)",
    )
    m.add_argument(
        "--threat", default=None, help=f"{threat_help()} (default: the weakest that observes it)"
    )
    m.add_argument("--attacker", default=None, metavar="A[,B,...]", help="as for attack")
    m.add_argument("--victim", default=None, metavar="V[,W,...]", help="as for attack")
    m.add_argument(
        "--population",
        type=int,
        default=256,
        help="public test-split examples the attacker calibrates with (default 256)",
    )
    m.add_argument("--confidence", type=float, default=0.95, help="of every interval and bound")
    m.add_argument(
        "--mia-seed",
        type=int,
        default=0,
        help="draws the candidates, the pairs' coins and the reference runs",
    )
    m.add_argument("--run", default=None, help="an existing run directory (else one is trained)")
    m.add_argument("--out", default=None, help="output folder (default privaudit-out/mia-T)")
    add_overwrite(m)
    m.add_argument("--json", action="store_true", help="print result.json on stdout")
    training_options(m, None)
    m.set_defaults(func=cmd_mia)


def tpr_text(points: dict[str, dict[str, Any]], fpr: str) -> str:
    """``TPR x % [lo, hi] at f % FPR``, or why the sample cannot measure it: an FPR below 1/n
    for n non-members is not measured
    (:class:`privaudit.eval.membership_scoring.OperatingPoint`)."""
    p, at = points[fpr], f"{100 * float(fpr):g} % FPR"
    if not p.get("resolved", True):
        need = round(1 / float(fpr))
        return (
            f"TPR at {at} not measurable ({round(1 / p['resolution'])} non-members resolve "
            f"{100 * p['resolution']:.2g} %; it needs {need})"
        )
    return f"TPR {100 * p['tpr']:.1f} % [{100 * p['tpr_lo']:.1f}, {100 * p['tpr_hi']:.1f}] at {at}"


def _tradeoff_line(r: MembershipResult) -> str:
    t = r.tradeoff
    return (
        f"trade-off curve ({len(t['curve']['threshold'])} thresholds, FPR/FNR band at "
        f"{r.confidence:g}): no μ-GDP mechanism of μ < {sig(t['mu_lo'])} separates these "
        "scores so"
    )


def cmd_mia(a: argparse.Namespace) -> int:
    from privaudit.api.message_membership import mia
    from privaudit.core.errors import PrivauditError
    from privaudit.eval.membership_attacks import MEMBERSHIP_ATTACKS
    from privaudit.sim.targets import Target

    if a.attack in MEMBERSHIP_ATTACKS:
        return cmd_model_mia(a)
    if a.attack != "grad":
        raise PrivauditError(
            f"--attack must be grad (message-level) or one of {', '.join(MEMBERSHIP_ATTACKS)} "
            f"(model-level), got {a.attack!r}"
        )
    a.round = 1 if a.round is None else a.round
    a.messages = 8 if a.messages is None else a.messages
    a.scorer = a.scorer or "decompose"
    if a.scorer not in SCORERS:
        raise PrivauditError(f"--scorer must be one of {', '.join(SCORERS)}, got {a.scorer!r}")
    check_threat(a.threat, a.attacker)
    target = Target.parse(a.target)
    limits.check_int("--round", a.round, 1, limits.MAX_ROUNDS)
    limits.check_int("--messages", a.messages, 1, limits.MAX_ROUNDS)
    limits.check_int("--population", a.population, 2, 10**6)
    limits.check_float("--confidence", a.confidence, 0.0, 1.0, lo_open=True, hi_open=True)
    limits.check_seed("--mia-seed", a.mia_seed)
    out = check_out(a.out or f"privaudit-out/mia-{a.target}", "mia", a.overwrite)
    run, cfg = (open_run(a), None) if a.run else (None, None)
    if run is None:
        last = a.round + a.messages - 1
        agents = option_value(a, "agents")
        rounds = target.rounds_to_train(last, agents) if a.rounds is None else a.rounds
        cfg = checked_params(config_from_args(a, target.defense.name, rounds))
    with run_in_out(out, "mia", run, cfg) as run:
        result = mia(
            run,
            target,
            a.round,
            messages=a.messages,
            scorer=a.scorer,
            adversary=adversary_of(a, run.cfg.agents),
            population=a.population,
            confidence=a.confidence,
            seed=a.mia_seed,
            out=out,
            progress=not a.no_progress,
        )
    if a.json:
        print(dumps_strict(result.to_dict(), sort_keys=False))
        return 0
    print(run_epsilon_line(run.resolved))
    r, d = result, result.details  # d: the message-level entries
    pts = r.tpr_at_fpr
    print(
        f"{a.target} rounds {d['rounds'][0]}–{d['rounds'][-1]} under {r.threat}, "
        f"{d['scorer']}: {r.members} members vs {r.nonmembers} non-members of the "
        f"victim's shard: AUC {r.auc:.3f}; {tpr_text(pts, '0.001')}, "
        f"{tpr_text(pts, '0.01')} ({100 * r.confidence:g} % intervals)"
    )
    print(_tradeoff_line(r))
    eps = d["epsilon_release"]
    if eps is None:
        print(f"DP bound: none ({d['epsilon_release_reason']})")
    else:
        va = d["violations_analysis"]
        swap = va["region"]
        verdict = (
            f"{len(d['violations'])} ROC point(s) above it: the messages leak more than "
            "their stated ε"
            if d["violations"]
            else "no ROC point above it"
        )
        print(
            f"DP bound of one message: ε = {eps:.3g}, δ = {r.delta:g}; a swap's region "
            f"(ε = {swap['epsilon']:.3g}, δ = {swap['delta']:.3g}) over {va['trials']} "
            f"independent trials (one pair per message): {verdict}"
        )
    print(_lower_bound_line(r, r.epsilon_lo_analysis["epsilon_stated"]))
    print(
        f"label counts exact {100 * d['label_counts_exact']:.1f} %, TV to the batch's label "
        f"histogram {d['label_tv']:.3f}"
    )
    print(f"wrote {out / 'result.json'} and {d['figure']}")
    return 0


def _lower_bound_line(r: MembershipResult, eps: float | None) -> str:
    """The ε lower bound, the analysis it used and the independent trials it rests on, and
    whether it refutes the stated ε."""
    lo, how = r.epsilon_lo, r.epsilon_lo_analysis
    if lo is None:
        return f"ε lower bound: none ({how['reason']})"
    guessed = f", {how['correct']} of {how['guesses']} guesses right" if how["guesses"] else ""
    line = (
        f"ε lower bound from these examples at {100 * r.confidence:g} %: {lo:.3g} "
        f"[{how['method']}; {how['trials']} independent coins{guessed}]"
    )
    if eps is None:
        return line
    if r.refuted:
        return f"{line} > {eps:.3g} stated: the stated ε is refuted"
    return f"{line} ≤ {eps:.3g} stated"


def cmd_model_mia(a: argparse.Namespace) -> int:
    """``privaudit mia --attack loss|lira|rmia``: model-level membership inference
    (:func:`privaudit.api.model_membership.model_mia`)."""
    from privaudit.api.model_membership import model_mia
    from privaudit.core.errors import PrivauditError
    from privaudit.eval.membership_attacks import check_references
    from privaudit.sim.targets import Target

    check_references(a.attack, a.references)  # before any output folder
    limits.check_int("--references", a.references, 2, 1024)
    if a.on not in (None, "message", "final"):
        raise PrivauditError(f"--on must be message or final, got {a.on!r}")
    check_threat(a.threat, a.attacker)
    target = Target.parse(a.target)
    if a.round is not None:
        limits.check_int("--round", a.round, 1, limits.MAX_ROUNDS)
    if a.candidates is not None:
        limits.check_int("--candidates", a.candidates, 1, 10**6)
    limits.check_int("--population", a.population, 2, 10**6)
    limits.check_float("--confidence", a.confidence, 0.0, 1.0, lo_open=True, hi_open=True)
    limits.check_seed("--mia-seed", a.mia_seed)
    out = check_out(a.out or f"privaudit-out/mia-{a.target}-models", "mia", a.overwrite)
    run, cfg = (open_run(a), None) if a.run else (None, None)
    if run is None:
        agents = option_value(a, "agents")
        rounds = a.rounds
        if rounds is None:
            rounds = target.rounds_to_train(a.round or 1, agents)
        cfg = checked_params(config_from_args(a, target.defense.name, rounds))
    with run_in_out(out, "mia", run, cfg) as run:
        r = model_mia(
            run,
            target,
            attack=a.attack,
            references=a.references,
            round=a.round,
            on=a.on,
            adversary=adversary_of(a, run.cfg.agents, victims=1),
            candidates=a.candidates,
            population=a.population,
            confidence=a.confidence,
            seed=a.mia_seed,
            out=out,
            progress=not a.no_progress,
        )
    if a.json:
        print(dumps_strict(r.to_dict(), sort_keys=False))
        return 0
    print(run_epsilon_line(run.resolved))
    d = r.details  # the model-level entries
    what = (
        f"agent {d['victim']}'s {a.target} message of round {d['round']} as agent "
        f"{d['receiver']} receives it"
        if d["on"] == "message"
        else f"the final average model (round {d['round']})"
    )
    refs = d["references"]
    drawn = (
        "no reference runs"
        if refs is None
        else f"{refs['count']} reference runs ("
        + ("read from the cache" if not refs["trained"] else f"trained in {refs['seconds']:.1f} s")
        + ")"
    )
    game = d["game"]
    played = "read from the cache" if not game["trained"] else f"{game['seconds']:.1f} s"
    pts = r.tpr_at_fpr
    others = ", ".join(
        f"{name} {s['auc']:.3f}" for name, s in d["scores"].items() if name != d["score"]
    )
    print(
        f"{d['score']} on {what}, replayed as the membership game ({r.members} pairs of "
        f"agent {d['victim']}'s shard and the test split, a fair coin per pair picks the "
        f"member; {played}), {drawn}: AUC {r.auc:.3f}; {tpr_text(pts, '0.001')}, "
        f"{tpr_text(pts, '0.01')} ({100 * r.confidence:g} % intervals)"
        + (f"; AUC of {others}" if others else "")
    )
    print(_tradeoff_line(r))
    nat = d["natural"]
    print(
        f"natural split (the run's own model, {nat['members']} shard members vs "
        f"{nat['nonmembers']} test-split non-members; a train/test shift shows here too, no "
        f"bound): AUC {nat['auc']:.3f}, {tpr_text(nat['tpr_at_fpr'], '0.01')}"
    )
    eps = d["epsilon"]
    if eps is None:
        print(f"DP bound: none ({d['epsilon_reason']})")
    else:
        print(f"DP bound over {d['epsilon_rounds']} rounds: ε = {eps:.3g}, δ = {r.delta:g}")
    print(_lower_bound_line(r, eps))
    print(f"wrote {out / 'result.json'} and {d['figure']}")
    return 0
