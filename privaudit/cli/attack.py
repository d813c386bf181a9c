"""``privaudit attack``: reconstruct a private batch from a target's messages."""

from __future__ import annotations

import argparse
import copy
import math
import sys
from typing import Any

from privaudit.cli.options import (
    add_attack_option,
    add_lpips_option,
    add_overwrite,
    attack_options,
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
from privaudit.cli.rules import adversary_of
from privaudit.cli.train import full_batch, run_epsilon_line, sampled, sampling_options
from privaudit.cli.vocabulary import Vocabulary
from privaudit.core import limits
from privaudit.core.config import RunConfig
from privaudit.core.errors import PrivauditError
from privaudit.core.files import dumps_strict
from privaudit.core.threat import threat_help


def add_parser(sub: Any, words: Vocabulary) -> None:
    """Register ``attack`` on the CLI's subparsers."""
    at = sub.add_parser(
        "attack",
        help="reconstruct a private batch from a target's messages",
        epilog="-a tie=true: El Mrini, Cyffers & Bellet's tied approximation (ICML 2024): every "
        "non-attacker's gradient taken equal over the rounds, so the coalition (--attacker) "
        "reaches victims beyond its neighbours by the gossip algebra; only on a full-batch run "
        "(--sampling full --examples-per-agent K), its error first order in the step size; "
        "with one example per agent the coalition re-runs the training from what it recovered "
        "and takes the forecast drift out (El Mrini et al.'s setting: --model linear "
        "--precision float64 --gossip laplacian)",
    )
    at.add_argument("--target", required=True, help="e.g. dpdl-cg (privaudit targets)")
    at.add_argument("--round", type=int, required=True, help="round whose message is attacked")
    at.add_argument(
        "--attack",
        default=None,
        help=f"{words.attack_help()} (privaudit targets --list attacks says what each does)",
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
    at.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="the attack's optimisation steps (default: the attack's own)",
    )
    at.add_argument(
        "--restarts",
        type=int,
        default=None,
        help="independent starts; the best reconstruction is kept (default: the attack's own)",
    )
    at.add_argument(
        "--attack-seed",
        type=int,
        default=0,
        help="the attack's own draws (its starting points), apart from the run's --seed: "
        "the same run attacked again with another (default 0)",
    )
    add_attack_option(at)
    add_lpips_option(at, "score LPIPS beside PSNR and SSIM (default: on; --no-lpips skips it)")
    at.add_argument("--json", action="store_true", help="print result.json on stdout")
    training_options(at, None)
    sampling_options(at)
    at.set_defaults(func=cmd_attack)


def cmd_attack(a: argparse.Namespace) -> int:
    """Attack ``--target`` at ``--round`` on ``--run`` (or on a run trained for it), write
    result.json and the figure to ``--out``, and print the scores with the run's ε."""
    from privaudit.api.pipeline import attack
    from privaudit.core.threat import parse_links
    from privaudit.sim.targets import Target

    check_threat(a.threat or ("link" if a.link else None), a.attacker)  # before any training
    target = Target.parse(a.target)
    # unknown attacks and bad options fail before any training
    tie, a = tie_option(a)
    options = attack_options(a, a.attack)
    limits.check_int("--round", a.round, 1, limits.MAX_ROUNDS)
    out = check_out(a.out or f"privaudit-out/{a.target}-r{a.round}", "attack", a.overwrite)
    given = open_run(a) if a.run else None
    if given is not None:
        cfg, edges = given.cfg, given.edges()
    else:
        agents = option_value(a, "agents")
        rounds = target.rounds_to_train(a.round, agents) if a.rounds is None else a.rounds
        cfg, _ = sampled(a, checked_params(config_from_args(a, target.defense.name, rounds)))
        edges = edges_of(cfg)
    if tie:
        check_tie(a, cfg, given is not None)
    links = parse_links(a.link, edges) if a.link else None  # before a run is created
    adversary = adversary_of(a, cfg.agents, links)
    with run_in_out(out, "attack", given, cfg) as run:
        result = attack(
            run,
            target,
            a.round,
            attack=a.attack,
            adversary=adversary,
            out=out,
            iterations=a.iterations,
            restarts=a.restarts,
            seed=a.attack_seed,
            options=options,
            tie=tie,
            lpips=a.lpips is not False,
            progress=not a.no_progress,
        )
    m = result.metrics
    empty = empty_line(a, result)
    if a.json:
        if empty:
            print(empty, file=sys.stderr)
        print(dumps_strict(result.to_dict(), sort_keys=False))
        return 0
    for sentence in dict.fromkeys(b["sentence"] for b in result.identifiability):
        print(f"{a.target} round {a.round}: {sentence}")
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
    for line in how_lines(result.attack_meta, result.links):
        print(line)
    if result.lpips_note:
        print(result.lpips_note)
    print(f"wrote {out / 'result.json'} and {result.figure}")
    return 0


def how_lines(metas: list[dict[str, Any]], links: list[list[int | None]]) -> list[str]:
    """The lines saying how the attack solved each observation, from what it recorded
    (``result.json``'s ``attack_meta``): its ``how`` (e.g. CPA's completion: "10 exact
    after the polish, ...") and why a completion was skipped (a noised gradient), each
    naming the attack, and the victim where several were attacked; none where the attack
    recorded neither (IG, DLG)."""
    lines = []
    for meta, (src, _) in zip(metas, links, strict=True):
        name = meta.get("attack")
        own = meta.get(name) if isinstance(name, str) else None
        own = own if isinstance(own, dict) else meta
        who = f"{name}, victim {src}" if len(metas) > 1 else f"{name}"
        how = own.get("how")
        if isinstance(how, str):
            lines.append(f"{who}: {how}")
        complete = own.get("complete")
        if isinstance(complete, dict) and isinstance(complete.get("skipped"), str):
            lines.append(f"{who}: the completion was skipped: {complete['skipped']}")
    return list(dict.fromkeys(lines))


def empty_line(a: argparse.Namespace, result: Any) -> str | None:
    """The line saying that every victim's batch of the attacked round is empty (Poisson
    sampling), with the nearest recorded rounds where one is not; None when one is not."""
    if result.metrics["mse"] is not None:
        return None
    near = result.rounds_with_a_batch
    hint = (
        f"the nearest recorded rounds where it is not: {', '.join(map(str, near))}"
        if near
        else "try a neighbouring --round"
    )
    return (
        f"{a.target} round {a.round}: every victim's batch is empty (Poisson sampling, "
        f"realised sizes {result.batch_sizes}): nothing to reconstruct; {hint}"
    )


def tie_option(a: argparse.Namespace) -> tuple[bool, argparse.Namespace]:
    """``-a tie=true|false`` taken out of the ``-a`` options (it chooses how the victims are
    observed, not how the attack inverts them), and the arguments without it: a copy, the
    given ones untouched. Anything but true or false is refused."""
    values = [v for k, v in a.attack_option if k == "tie"]
    rest = copy.copy(a)
    rest.attack_option = [(k, v) for k, v in a.attack_option if k != "tie"]
    bad = [v for v in values if not isinstance(v, bool)]
    if bad:
        raise PrivauditError(
            f"-a tie takes true or false (El Mrini et al.'s tied approximation), got {bad[0]!r}"
        )
    return bool(values and values[-1]), rest


def check_tie(a: argparse.Namespace, cfg: RunConfig, given: bool) -> None:
    """Refuse ``-a tie=true`` before any training where it cannot run: it observes a
    coalition's victims by the gossip algebra (``--attacker`` names the coalition, which
    :func:`~privaudit.cli.options.check_threat` keeps to a threat with attackers; no
    ``--link``), and takes every gradient constant over the rounds, which
    only full batches allow — a run to be trained must be ``--sampling full``; a ``--run``'s
    shards are checked when it is opened (:func:`privaudit.api.gossip.observe_beyond`)."""
    if a.link:
        raise PrivauditError(
            "-a tie=true observes a coalition's victims by the gossip algebra, not a link's "
            "message; drop --link and name the coalition with --attacker A[,B]"
        )
    if not a.attacker:
        raise PrivauditError(
            "-a tie=true solves the gossip algebra of a coalition: name it with --attacker A[,B]"
        )
    if not given and not full_batch(cfg):
        raise PrivauditError(
            "-a tie=true assumes each agent's gradient is the same in every round (El Mrini "
            f"et al.'s D-GD), but this run would draw Poisson batches of {cfg.batch_size}; add "
            "--sampling full --examples-per-agent K (every step on the agent's K examples)"
        )
