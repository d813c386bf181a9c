"""``privaudit attack``: reconstruct a private batch from a target's messages."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from privaudit.cli.options import (
    add_attack_option,
    add_overwrite,
    attack_options,
    check_out,
    check_threat,
    checked_params,
    config_from_args,
    edges_of,
    open_run,
    run_in_out,
    setting,
    training_options,
)
from privaudit.cli.rules import agent_ids
from privaudit.cli.train import run_epsilon_line
from privaudit.core import limits
from privaudit.core.threat import threat_help


def add_parser(sub: Any) -> None:
    """Register ``attack`` on the CLI's subparsers."""
    at = sub.add_parser("attack", help="reconstruct a private batch from a target's messages")
    at.add_argument("--target", required=True, help="e.g. dpdl-cg (privaudit targets)")
    at.add_argument("--round", type=int, required=True, help="round whose message is attacked")
    at.add_argument(
        "--attack",
        default=None,
        help="the attack (default ig); privaudit targets --list attacks names them all",
    )
    at.add_argument(
        "--threat",
        default=None,
        help=f"{threat_help()} (default: the weakest that observes it)",
    )
    at.add_argument(
        "--attacker",
        default=None,
        metavar="A[,B,...]",
        help="the curious agent (neighbor; default: the victim's first receiver) or the "
        "coalition's members (default: everyone the victim sends to)",
    )
    at.add_argument(
        "--victim",
        default=None,
        metavar="V[,W,...]",
        help="agent(s) whose message is attacked (default: the first non-attacker)",
    )
    at.add_argument(
        "--link",
        action="append",
        default=None,
        metavar="SRC,DST",
        help="the link whose SRC→DST message is attacked (repeatable)",
    )
    at.add_argument("--run", default=None, help="an existing run directory (else one is trained)")
    at.add_argument("--out", default=None, help="output folder (default privaudit-out/T-rR)")
    add_overwrite(at)
    at.add_argument("--iterations", type=int, default=None)
    at.add_argument("--restarts", type=int, default=None)
    at.add_argument("--attack-seed", type=int, default=0)
    add_attack_option(at)
    at.add_argument("--no-lpips", action="store_true")
    at.add_argument("--json", action="store_true", help="print result.json on stdout")
    training_options(at, None)
    at.set_defaults(func=cmd_attack)


def cmd_attack(a: argparse.Namespace) -> int:
    from privaudit.api.pipeline import attack
    from privaudit.core.threat import parse_links
    from privaudit.sim.targets import Target

    check_threat(a.threat or ("link" if a.link else None), a.attacker)  # before any training
    target = Target.parse(a.target)
    # unknown attacks and bad options fail before any training
    options = attack_options(a, a.attack)
    limits.check_int("--round", a.round, 1, limits.MAX_ROUNDS)
    out = check_out(a.out or f"privaudit-out/{a.target}-r{a.round}", "attack", a.overwrite)
    given = open_run(a) if a.run else None
    if given is not None:
        cfg, edges = given.cfg, given.edges()
    else:
        agents = setting(a, "agents")
        rounds = target.rounds_to_train(a.round, agents) if a.rounds is None else a.rounds
        cfg = checked_params(config_from_args(a, target.defense.name, rounds))
        edges = edges_of(cfg)
    links = parse_links(a.link, edges) if a.link else None  # before a run is created
    attackers = agent_ids("--attacker", a.attacker, cfg.agents) if a.attacker else None
    victims = agent_ids("--victim", a.victim, cfg.agents) if a.victim else None
    with run_in_out(out, "attack", given, cfg) as run:
        result = attack(
            run,
            a.target,
            a.round,
            attack=a.attack,
            links=links,
            threat=a.threat or ("link" if links else None),
            attackers=attackers,
            victims=victims,
            out=out,
            iterations=a.iterations,
            restarts=a.restarts,
            seed=a.attack_seed,
            options=options,
            lpips=not a.no_lpips,
            progress=not a.no_progress,
        )
    m = result.metrics
    empty = None
    if m["mse"] is None:
        near = result.rounds_with_a_batch
        hint = (
            f"the nearest recorded rounds where it is not: {', '.join(map(str, near))}"
            if near
            else "try a neighbouring --round"
        )
        empty = (
            f"{a.target} round {a.round}: every victim's batch is empty (Poisson sampling, "
            f"realised sizes {result.batch_sizes}): nothing to reconstruct; {hint}"
        )
    if a.json:
        from privaudit.core.files import to_jsonable

        if empty:
            print(empty, file=sys.stderr)
        print(json.dumps(to_jsonable(result.to_dict()), indent=2))
        return 0
    line = run_epsilon_line(run.resolved)
    if run.resolved["epsilon_reason"]:
        line += " (each kind's reason: result.json's epsilon_reason, or privaudit train)"
    print(line)
    if result.threat_chosen:
        print(
            f"threat: {result.adversaries[0]} — the weakest adversary that observes "
            f"{a.target} (choose one with --threat link|neighbor|coalition|global)"
        )
    eps = "∞" if result.epsilon is None else f"{result.epsilon:.3g}"
    claim = result.epsilon_claimed
    if result.epsilon is None and math.isfinite(claim):
        eps += f" (the paper's count: {claim:.3g})"
    if empty:
        print(f"{empty}; wrote {out / 'result.json'}")
        return 0
    lp = f"{m['lpips']:.3f}" if m["lpips"] is not None else "n/a"
    used = sorted({u for u in result.attack_used if u})
    name = result.attack
    if used and used != [name]:  # e.g. auto: the attack it picked
        name = f"{name} ({', '.join(used)})"
    print(
        f"{a.target} round {a.round}, {name} under "
        f"{'; '.join(sorted(set(result.adversaries)))} (links {result.links}), "
        f"ε = {eps}: "
        f"PSNR {m['psnr']:.2f} dB, SSIM {m['ssim']:.3f}, MSE {m['mse']:.4f}, LPIPS {lp}, "
        f"label acc {m['label_acc']:.2f}, {result.wall_s:.1f} s"
    )
    for why in sorted({w for w in result.fallback if w}):
        print(f"{a.attack}: {why}; Inverting Gradients produced the reconstruction")
    if result.lpips_note:
        print(result.lpips_note)
    print(f"wrote {out / 'result.json'} and {result.figure}")
    return 0
