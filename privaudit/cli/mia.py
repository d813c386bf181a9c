"""``privaudit mia``: who is in the batch behind a message, and which labels it holds."""

from __future__ import annotations

import argparse
import json
from typing import Any

from privaudit.cli.options import (
    add_overwrite,
    check_no_run_flags,
    check_out,
    check_threat,
    checked_params,
    config_from_args,
    mark_out,
    open_run,
    setting,
    training_options,
)
from privaudit.cli.train import run_epsilon_line
from privaudit.core import limits
from privaudit.core.threat import threat_help

SCORERS = ("decompose", "lr", "lr-iso", "inner", "cosine")


def add_parser(sub: Any) -> None:
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
    m.add_argument("--round", type=int, default=1, help="the first observed round (default 1)")
    m.add_argument(
        "--messages", type=int, default=8, help="rounds observed from --round on (default 8)"
    )
    m.add_argument(
        "--attack",
        default="grad",
        help="grad (default): message-level, one observed message at a time",
    )
    m.add_argument(
        "--scorer",
        default="decompose",
        help=f"{' | '.join(SCORERS)} (default decompose; docs/membership.md)",
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
    m.add_argument("--mia-seed", type=int, default=0, help="draws the non-members")
    m.add_argument("--run", default=None, help="an existing run directory (else one is trained)")
    m.add_argument("--out", default=None, help="output folder (default privaudit-out/mia-T)")
    add_overwrite(m)
    m.add_argument("--json", action="store_true", help="print result.json on stdout")
    training_options(m, None)
    m.set_defaults(func=cmd_mia)


def _rate(p: dict[str, float]) -> str:
    return f"{100 * p['tpr']:.1f} % [{100 * p['tpr_lo']:.1f}, {100 * p['tpr_hi']:.1f}]"


def cmd_mia(a: argparse.Namespace) -> int:
    from privaudit.api.membership import mia
    from privaudit.core.errors import PrivauditError
    from privaudit.core.files import to_jsonable
    from privaudit.core.threat import parse_agents
    from privaudit.sim.run import Run
    from privaudit.sim.targets import Target

    if a.attack != "grad":
        raise PrivauditError(
            f"--attack {a.attack!r}: the message-level attack is grad; model-level attacks "
            "(loss, lira, rmia) are not built yet"
        )
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
    if a.run:
        check_no_run_flags(a, a.run)
        run = open_run(a)
    else:
        last = a.round + a.messages - 1
        agents = setting(a, "agents")
        rounds = target.rounds_to_train(last, agents) if a.rounds is None else a.rounds
        cfg = checked_params(config_from_args(a, target.defense.name, rounds))
        mark_out(out, "mia")
        run = Run.create(cfg, out / "run")
    n = run.cfg.agents
    mark_out(out, "mia")
    result = mia(
        run,
        a.target,
        a.round,
        messages=a.messages,
        scorer=a.scorer,
        threat=a.threat,
        attackers=parse_agents(a.attacker, n) if a.attacker else None,
        victims=parse_agents(a.victim, n) if a.victim else None,
        population=a.population,
        confidence=a.confidence,
        seed=a.mia_seed,
        out=out,
        progress=not a.no_progress,
    )
    if a.json:
        print(json.dumps(to_jsonable(result), indent=2))
        return 0
    print(run_epsilon_line(run.resolved))
    r = result
    pts = r["tpr_at_fpr"]
    print(
        f"{a.target} rounds {r['rounds'][0]}–{r['rounds'][-1]} under {r['threat']}, "
        f"{r['scorer']}: {r['members']} members vs {r['nonmembers']} non-members of the "
        f"victim's shard: AUC {r['auc']:.3f}; TPR {_rate(pts['0.001'])} at 0.1 % FPR, "
        f"{_rate(pts['0.01'])} at 1 % FPR ({100 * r['confidence']:g} % intervals)"
    )
    eps = r["epsilon_release"]
    if eps is None:
        print(f"DP bound: none ({r['epsilon_release_reason']})")
    else:
        verdict = (
            f"{len(r['violations'])} ROC point(s) above it: the messages leak more than "
            "their stated ε"
            if r["violations"]
            else "no ROC point above it"
        )
        print(f"DP bound of one message: ε = {eps:.3g}, δ = {r['delta']:g}: {verdict}")
    lo = r["epsilon_lo"]
    print(
        f"ε lower bound from these examples: {lo:.3g}"
        + (f" (≤ {eps:.3g} stated)" if eps is not None and lo <= eps else "")
        + f"; label counts exact {100 * r['label_counts_exact']:.1f} %, "
        f"TV to the batch's label histogram {r['label_tv']:.3f}"
    )
    print(f"wrote {out / 'result.json'} and {r['figure']}")
    return 0
