"""``privaudit train``: train a defense over N agents, with checkpoints, and report its ε."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

from privaudit.cli.options import (
    check_not_in_run,
    checked_params,
    configured,
    nothing_left_on_refusal,
    training_options,
)
from privaudit.cli.vocabulary import Vocabulary
from privaudit.core import limits
from privaudit.core.config import RunConfig
from privaudit.core.errors import PrivauditError
from privaudit.core.files import dumps_strict

SAMPLINGS = ("poisson", "full")  # --sampling


def add_parser(sub: Any, words: Vocabulary) -> None:
    """Register ``train`` on the CLI's subparsers."""
    tr = sub.add_parser("train", help="train a defense over N agents, with checkpoints")
    tr.add_argument(
        "--defense",
        required=True,
        help=f"{words.defense_help()} (privaudit targets lists the messages each sends)",
    )
    tr.add_argument("--out", required=True, help="run directory (resumed if it exists)")
    tr.add_argument(
        "--json", action="store_true", help="print σ, ε per message kind and per agent as JSON"
    )
    training_options(tr, None)
    sampling_options(tr)
    sc = tr.add_argument_group("engine (README, Scale-out)")
    sc.add_argument(
        "--capture",
        default=None,
        metavar="ROUNDS",
        help="also record every message of these rounds, e.g. 1,5,10-20 or all (default: "
        "none; attacks re-simulate the rounds they need from a checkpoint)",
    )
    sc.add_argument(
        "--backend",
        default="sim",
        help="sim (default: all agents in this process) | torch.distributed (one process "
        "per agent, gloo on CPU, nccl on GPU)",
    )
    sc.add_argument(
        "--nproc", type=int, default=None, help="ranks to start (= --agents, the default)"
    )
    sc.add_argument(
        "--dist-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long a rank waits for a peer before the run stops (default 300)",
    )
    tr.set_defaults(func=cmd_train)


def sampling_options(p: argparse.ArgumentParser) -> None:
    """``--examples-per-agent`` and ``--sampling`` (``train``'s and ``attack``'s): El Mrini,
    Cyffers & Bellet's D-GD setting — one example per agent, every step on it — from the
    command line, where the tied attack (``attack -a tie=true``) is exact to first order."""
    g = p.add_argument_group(
        "data, sampling and precision (El Mrini et al.'s D-GD: --examples-per-agent 1 "
        "--sampling full --precision float64 --gossip laplacian)"
    )
    g.add_argument(
        "--examples-per-agent",
        type=int,
        default=None,
        metavar="K",
        help="train each agent on K examples of its shard (a seeded draw; default: the whole "
        "shard); 1: one example per agent",
    )
    g.add_argument(
        "--sampling",
        choices=SAMPLINGS,
        default=None,
        help="poisson (default): each example joins a round's batch with probability "
        "q = B/n_i, and ε is amplified by q | full: every step on the agent's whole shard "
        "(D-GD; needs --examples-per-agent K and sets the batch size to K: q = 1, ε without "
        "amplification)",
    )
    g.add_argument(
        "--precision",
        default=None,
        metavar="float32|float64",
        help="float32 (default) | float64: the models, data and messages in double precision, "
        "as El Mrini et al.'s D-GD (the tied attack beyond the neighbourhood reads step "
        "differences that float32 rounds away)",
    )
    g.add_argument(
        "--gossip",
        default=None,
        metavar="mh|laplacian",
        help="the gossip matrix: mh (default; Metropolis–Hastings weights) | laplacian (El "
        "Mrini et al.'s W = I − L/d_max)",
    )


def full_batch(cfg: RunConfig) -> bool:
    """Whether every agent of ``cfg``'s run steps on its whole shard every round (q = 1),
    known from the configuration alone: its shards are cut to K examples
    (``--examples-per-agent``) and its batch size is K (``--sampling full``)."""
    return cfg.examples_per_agent is not None and cfg.batch_size >= cfg.examples_per_agent


def sampled(a: argparse.Namespace, cfg: RunConfig) -> tuple[RunConfig, str | None]:
    """``cfg`` with ``--examples-per-agent`` and ``--sampling`` applied and validated, and
    for ``--sampling full`` what it set, in words (else None). Full batches need shards of
    one size K, so that the batch size B = K is each agent's whole shard (q_i = B/n_i = 1,
    which the accountant charges without amplification); a ``--batch-size`` beside it that
    is not K would be overridden, so it is refused."""
    for name in ("precision", "gossip"):
        if getattr(a, name) is not None:
            cfg = dataclasses.replace(cfg, **{name: getattr(a, name)}).validate()
    k = a.examples_per_agent
    if a.sampling != "full":
        if k is not None:
            cfg = dataclasses.replace(cfg, examples_per_agent=k).validate()
        return cfg, None
    if k is None:
        raise PrivauditError(
            "--sampling full steps on every agent's whole shard, which needs shards of one "
            "size: add --examples-per-agent K (1: El Mrini et al.'s one example per agent)"
        )
    if a.batch_size is not None and a.batch_size != k:
        raise PrivauditError(
            f"--sampling full sets the batch to each agent's {k} examples (--examples-per-agent "
            f"{k}), but --batch-size is {a.batch_size}; drop --batch-size"
        )
    cfg = dataclasses.replace(cfg, examples_per_agent=k, batch_size=k).validate()
    return cfg, f"--sampling full: batch_size={k}, every example in every round (q = 1)"


def _capture(text: str | None, rounds: int) -> Any:
    """``--capture``: "all", or rounds and ranges like "1,5,10-20" → a CaptureSpec."""
    from privaudit.core.messages import CaptureSpec

    if text is None:
        return None
    if text.strip() == "all":
        return CaptureSpec.of(rounds=range(1, rounds + 1))
    out: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise PrivauditError(
            f"--capture takes 'all' or rounds like 1,5,10-20, got {text!r}"
        ) from None
    bad = sorted(t for t in out if not 1 <= t <= rounds)
    if bad or not out:
        raise PrivauditError(f"--capture rounds must lie in 1..{rounds}, got {text!r}")
    return CaptureSpec.of(rounds=out)


def cmd_train(a: argparse.Namespace) -> int:
    from privaudit.defenses import get_defense
    from privaudit.sim.run import Run
    from privaudit.sim.runlock import check_free

    out = Path(a.out)
    check_not_in_run("--out", out, itself=True)  # a run inside a run's folder: refused
    check_free(out)  # a second writer is turned away before any data is loaded
    get_defense(a.defense)
    cfg, origin = configured(a, a.defense, a.rounds, preset="utility")
    cfg, full = sampled(a, checked_params(cfg))
    origin += f"; {full}" if full else ""
    print(origin, file=sys.stderr if a.json else sys.stdout, flush=True)
    capture = _capture(a.capture, cfg.rounds)
    if a.nproc is not None:
        limits.check_int("--nproc", a.nproc, 1, limits.MAX_AGENTS)
    limits.check_float("--dist-timeout", a.dist_timeout, 0.0, limits.MAX_SECONDS, lo_open=True)
    if a.backend not in ("sim", "torch.distributed"):
        raise PrivauditError(f"--backend must be sim or torch.distributed, got {a.backend!r}")
    # a new run refused before its first checkpoint is taken back (the distributed engine
    # settles its shards itself)
    sim = a.backend == "sim"
    with nothing_left_on_refusal(out, out) if sim else contextlib.nullcontext():
        if not sim:
            from privaudit.sim import distributed

            if distributed.under_launcher():  # started by torchrun: this process is one rank
                distributed.train_rank(cfg, a.out, capture, a.dist_timeout, not a.no_progress)
                if distributed.rank() != 0:
                    return 0
            else:
                distributed.launch(cfg, a.out, a.nproc, capture, a.dist_timeout, not a.no_progress)
            run = Run.open(a.out, device=cfg.device)
            print(calibration_line(run.resolved), file=sys.stderr if a.json else sys.stdout)
            state = run.train(progress=False)  # the merged last checkpoint
        else:
            run = Run.create(cfg, a.out)
            print(calibration_line(run.resolved), file=sys.stderr if a.json else sys.stdout)
            state = run.train(capture=capture, progress=not a.no_progress)
    acc = run.test_accuracy(state)
    if a.json:
        doc = {
            "defense": a.defense,
            "run": str(a.out),
            "test_accuracy": acc,  # the agents' average model
            "agent_test_accuracy": run.agent_accuracies(state),  # each agent's own model
            **run.resolved,
        }
        print(dumps_strict(doc, sort_keys=False))
        return 0
    print(
        f"{a.defense}: {run.cfg.rounds} rounds, {run.cfg.agents} agents on {run.cfg.topology}, "
        f"σ = {run.resolved['sigma']:.3g}; test accuracy of the average model {acc:.3f}; "
        f"run in {a.out}"
    )
    print(privacy_lines(run.resolved))
    return 0


def calibration_line(resolved: dict[str, Any]) -> str:
    """Where the run's noise came from: which kinds ``--epsilon`` calibrated σ on (and by
    what count) and which kinds stay ε = ∞ over the run; or the ``--sigma`` given."""
    sigma = resolved["sigma"]
    c = resolved.get("calibrated")
    unbounded = [k for k, v in resolved["kinds"].items() if not math.isfinite(v["epsilon"])]
    rest = f"; {', '.join(unbounded)} stay ε = ∞ over the run" if unbounded else ""
    if c:
        return (
            f"--epsilon {c['epsilon']:g} calibrated σ = {sigma:.3g} on "
            f"{', '.join(c['kinds'])} ({c['basis']}){rest}"
        )
    if sigma > 0:
        return f"σ = {sigma:.3g} as given{rest}"
    return f"no noise multiplier is set{rest}"


def run_epsilon_line(resolved: dict[str, Any]) -> str:
    """The run's ε: the guarantee of everything it puts on the wire (∞ with the reason when
    any kind has none), beside what its formal kinds alone would have."""
    eps = resolved["epsilon"]
    if math.isfinite(eps):
        return f"ε over the run (every message on the wire, worst agent) = {eps:.3g}"
    line = f"ε over the run (every message on the wire) = ∞: {resolved['epsilon_reason']}"
    formal = resolved.get("formal_kinds") or []
    if formal and math.isfinite(resolved["epsilon_formal_kinds"]):
        line += (
            f"; the {', '.join(formal)} messages alone: ε = {resolved['epsilon_formal_kinds']:.3g}"
        )
    return line


def sampling_text(resolved: dict[str, Any]) -> str:
    """How the run's batches are drawn, as its accounting took them: the Poisson rates, or
    — where every agent's rate is 1 (``--sampling full``) — full batches, each round charged
    as the Gaussian mechanism itself."""
    rates = [row.get("sample_rate") for row in resolved.get("agents", [])]
    if rates and all(q == 1 for q in rates):
        return "full batches: q = 1 for every agent, no amplification by sampling"
    return resolved["sampling"]


def privacy_lines(resolved: dict[str, Any]) -> str:
    """The run's ε (:func:`run_epsilon_line`), then the ε its messages have kind by kind
    (worst agent), with the reason for each ∞ and the paper's claim where it differs;
    adjacency and sampling stated."""
    lines = [
        run_epsilon_line(resolved),
        f"per message kind (δ = {resolved['delta']:g}, {resolved['adjacency']}, "
        f"{sampling_text(resolved)}, worst agent):",
    ]
    for kind, k in resolved["kinds"].items():
        eps, claim = k["epsilon"], k["epsilon_claimed"]
        text = f"ε = {eps:.3g}" if math.isfinite(eps) else f"ε = ∞ ({k['reason']})"
        if k.get("epsilon_one_release") is not None:
            text += f"; one message at a fixed evaluation point: ε = {k['epsilon_one_release']:.3g}"
        if math.isfinite(claim) and not math.isclose(claim, eps, rel_tol=1e-3):
            text += f"; the paper's accounting claims ε = {claim:.3g}"
        lines.append(f"  {kind}: {text}")
    return "\n".join(lines)
