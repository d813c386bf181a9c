"""``privaudit train``: train a defense over N agents, with checkpoints, and report its ε."""

from __future__ import annotations

import argparse
import contextlib
import json
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
from privaudit.core import limits
from privaudit.core.errors import PrivauditError


def add_parser(sub: Any) -> None:
    """Register ``train`` on the CLI's subparsers."""
    tr = sub.add_parser("train", help="train a defense over N agents, with checkpoints")
    tr.add_argument("--defense", required=True, help="dsgd | nd | dpdl (privaudit targets)")
    tr.add_argument("--out", required=True, help="run directory (resumed if it exists)")
    tr.add_argument(
        "--json", action="store_true", help="print σ, ε per message kind and per agent as JSON"
    )
    training_options(tr, None)
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
    cfg = checked_params(cfg)
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
        from privaudit.core.files import to_jsonable

        doc = {
            "defense": a.defense,
            "run": str(a.out),
            "test_accuracy": acc,  # the agents' average model
            "agent_test_accuracy": run.agent_accuracies(state),  # each agent's own model
            **run.resolved,
        }
        print(json.dumps(to_jsonable(doc), indent=2))
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


def privacy_lines(resolved: dict[str, Any]) -> str:
    """The run's ε (:func:`run_epsilon_line`), then the ε its messages have kind by kind
    (worst agent), with the reason for each ∞ and the paper's claim where it differs;
    adjacency and sampling stated."""
    lines = [
        run_epsilon_line(resolved),
        f"per message kind (δ = {resolved['delta']:g}, {resolved['adjacency']}, "
        f"{resolved['sampling']}, worst agent):",
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
