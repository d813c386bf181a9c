"""``privaudit compare``: defenses side by side (attacks, audits, accuracy; sweeps)."""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from privaudit.cli.options import (
    add_attack_option,
    add_executor_options,
    add_lpips_option,
    add_overwrite,
    check_destination_folder,
    check_sweep_attack,
    check_threat,
    comma_list,
    executor_from_args,
    explicit_settings,
    mark_out,
    nothing_left_on_refusal,
    record_written,
    sweep_base,
    sweep_namespace,
    training_options,
)
from privaudit.cli.vocabulary import Vocabulary
from privaudit.core import limits
from privaudit.core.errors import PrivauditError
from privaudit.core.threat import threat_help

COMPARE_TARGETS = "dsgd-half-model,nd-cg,dpdl-cg,pdsl-cg,lppa-gt,adad2p-half-model"
# --preset utility: the privacy–utility frontier of these, at their operating points
FRONTIER_TARGETS = (
    "dsgd-half-model,dpdl-cg,dp-dpsgd-half-model,pdsl-cg,dp-cga-cg,muffliato-model,"
    "clipd2p-half-model"
)
FRONTIER_EPSILONS = [1.0, 2.0, 4.0, 8.0, float("inf")]
# (victims, attack iterations, audit trials) a sweep uses unless told: the utility preset's
# batches (B = 64) cost ~60× an iteration of B = 1, and its audits re-run whole rounds
SWEEP_DEFAULTS = {"attack": (4, 1000, None), "utility": (1, 200, 256)}
# what --figures DIR receives
FIGURES = (".png", ".md")


def _printer(json_out: bool) -> Any:
    """Where the human lines go: stdout, or stderr when stdout carries the JSON."""
    return functools.partial(print, file=sys.stderr) if json_out else print


def add_parser(sub: Any, words: Vocabulary) -> None:
    """Register ``compare`` on the CLI's subparsers."""
    c = sub.add_parser(
        "compare",
        help="attack several targets over rounds, ε and seeds: grid, sweeps, table",
        description=(
            "Train one run per (defense, ε, seed) (reused when already under OUT/runs), attack "
            "each (target, round, ε, seed) once (cached under OUT/results) and write the "
            "figure grids, sweep plots, privacy–utility plot and tables into OUT. Defaults "
            "(B = 1, 4 victims, rounds 1,50, ε = 1, seed 0, 1000 IG iterations) finish the "
            f"six default targets ({COMPARE_TARGETS}) on a 2-core CPU in minutes. With "
            "--preset utility: the privacy–utility frontier — every run at its defense's "
            "operating point for that ε, the last round attacked (1 victim, 200 IG "
            "iterations) and audited (256 trials), ε = 1,2,4,8,inf, the references "
            "(centralised DP-SGD with opacus, centralised SGD, non-private D-PSGD) and the "
            f"targets {FRONTIER_TARGETS}; frontier.png/.md."
        ),
        conflict_handler="resolve",  # --rounds/--epsilon/--seed become lists below
    )
    _add_outputs(c)
    _add_attack_options(c, words)
    _add_audit_options(c)
    training_options(c, None)
    _add_study_grid(c)
    add_executor_options(c)
    c.set_defaults(func=cmd_compare)


def _add_outputs(c: argparse.ArgumentParser) -> None:
    """``compare``'s targets and where it writes (``--out``, ``--overwrite``,
    ``--figures``); a helper of :func:`add_parser`, kept apart to keep it short."""
    c.add_argument(
        "--targets",
        default=None,
        type=comma_list(str, "--targets"),
        help=f"comma-separated targets (default {COMPARE_TARGETS}; utility preset: "
        f"{FRONTIER_TARGETS})",
    )
    c.add_argument("--out", required=True, help="output folder (runs, results, figures)")
    add_overwrite(
        c,
        "an --out folder holding files privaudit did not write there, or a --figures folder "
        "holding PNG or markdown files it did not write",
    )
    c.add_argument(
        "--figures",
        default=None,
        metavar="DIR",
        help="also copy the PNG figures and summary.md into DIR (e.g. the README's figures/)",
    )


def _add_attack_options(c: argparse.ArgumentParser, words: Vocabulary) -> None:
    """``compare``'s attack settings (threat, victims, attack, iterations, LPIPS); a
    helper of :func:`add_parser`, in the order ``--help`` lists them."""
    c.add_argument(
        "--threat",
        default=None,
        help=f"{threat_help()} (default: per target, the weakest adversary that observes it)",
    )
    c.add_argument(
        "--victims",
        type=int,
        default=None,
        help="agents 0..V-1 are attacked in every cell (default 4; utility preset: 1)",
    )
    c.add_argument(
        "--attack",
        default=None,
        help=f"{words.attack_help()} (privaudit targets --list attacks)",
    )
    c.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="attack iterations (1000; utility preset: 200)",
    )
    add_attack_option(c)
    add_lpips_option(c, "also score LPIPS (needs AlexNet's weights; default: off)")
    c.add_argument(
        "--json",
        action="store_true",
        help="print the summary rows, every cell's row and the files written as one JSON "
        "document on stdout (the other lines go to stderr)",
    )


def _add_audit_options(c: argparse.ArgumentParser) -> None:
    """``compare``'s canary audit and membership inference switches; a helper of
    :func:`add_parser`, in the order ``--help`` lists them."""
    c.add_argument(
        "--audit",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="white-box canary audit of each noised target at its last round: "
        "an empirical ε lower bound beside the accounted ε (default: on with the utility "
        "preset, off otherwise)",
    )
    c.add_argument(
        "--membership",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="message-level membership inference and label counts on each target's last 8 "
        "rounds (privaudit mia's defaults; default: on with the utility preset, off otherwise)",
    )
    c.add_argument(
        "--audit-trials",
        type=int,
        default=None,
        help="audit trials (the audit's default; utility preset: 256)",
    )


def _add_study_grid(c: argparse.ArgumentParser) -> None:
    """``compare``'s sweep group: the rounds, ε and seeds the study grid spans (lists,
    replacing the training options' single values); a helper of :func:`add_parser`."""
    g = c.add_argument_group("sweep")
    g.add_argument(
        "--rounds",
        type=comma_list(int, "--rounds"),
        default=None,
        help="attacked rounds, comma-separated (default 1,50; utility preset: each run's "
        "last round, and given, the runs stop at the largest)",
    )
    g.add_argument(
        "--epsilons",
        "--epsilon",
        dest="epsilons",
        default=None,
        type=comma_list(float, "--epsilons"),
        help="ε per agent over the run, comma-separated; inf runs a noised defense without "
        "noise (default 1; utility preset: 1,2,4,8,inf)",
    )
    g.add_argument(
        "--seeds",
        "--seed",
        dest="seeds",
        default=[0],
        type=comma_list(int, "--seeds"),
        help="run seeds, comma-separated (default 0): each seeds its runs (as train's --seed does) "
        "and their cells' attacks; the audits and membership inference draw as --audit-seed "
        "0 and --mia-seed 0 do",
    )
    g.add_argument(
        "--horizon",
        type=int,
        default=None,
        metavar="R",
        help="the rounds each run is configured for, over which σ is calibrated to ε (at "
        "least every attacked round; runs are trained only as far as the cells need): "
        "attacking other rounds later reuses every run and cell (default: the largest "
        "attacked round, so a longer --rounds recalibrates σ and recomputes noised cells)",
    )


def cmd_compare(a: argparse.Namespace) -> int:
    from privaudit.api.sweeps import Sweep, execute, load_tensors
    from privaudit.core.files import to_jsonable
    from privaudit.eval.report import markdown, summarize, write_report
    from privaudit.scenario import presets
    from privaudit.sim.targets import Target

    check_threat(a.threat)
    preset = a.preset or "attack"
    if preset not in presets.PRESETS:
        raise PrivauditError(f"--preset must be one of {', '.join(presets.PRESETS)}")
    frontier = preset == "utility"
    if not frontier and a.batch_size is None:
        a.batch_size = 1  # the attack comparison's default: one image per batch
    victims, iterations, trials = SWEEP_DEFAULTS[preset]
    a.victims = victims if a.victims is None else a.victims
    a.iterations = iterations if a.iterations is None else a.iterations
    a.audit_trials = trials if a.audit_trials is None else a.audit_trials
    check_sweep_attack(a)
    executor = executor_from_args(a)  # makes --out/--data-root absolute for Ray: before configs
    if a.audit_trials is not None:
        limits.check_int("--audit-trials", a.audit_trials, 1, limits.MAX_TRIALS)
    targets = a.targets or (FRONTIER_TARGETS if frontier else COMPARE_TARGETS).split(",")
    sweep = Sweep(
        targets=targets,
        rounds=a.rounds if a.rounds is not None else ([] if frontier else [1, 50]),
        epsilons=a.epsilons or (FRONTIER_EPSILONS if frontier else [1.0]),
        seeds=a.seeds,
        base=sweep_base(a),
        threat=a.threat,
        victims=a.victims,
        attack=a.attack,
        iterations=a.iterations,
        attack_options=dict(a.attack_option),
        lpips=bool(a.lpips),
        audit=frontier if a.audit is None else a.audit,
        audit_trials=a.audit_trials,
        membership=frontier if a.membership is None else a.membership,
        preset=preset,
        explicit=explicit_settings(sweep_namespace(a), max(a.rounds) if a.rounds else None),
        horizon=a.horizon,
    ).validate()
    if frontier:
        model = sweep.explicit.get("model")
        where = f"{sweep.base.dataset} with --model {model}" if model else sweep.base.dataset
        for name in dict.fromkeys(Target.parse(t).defense.name for t in targets):
            if presets.operating_point("utility", name, sweep.base.dataset, None, model) is None:
                print(
                    f"{name}: no operating point on {where} yet; it runs at the attack "
                    "preset's settings",
                    file=sys.stderr,
                )
    t0 = time.perf_counter()
    out = Path(a.out)
    dest = None
    if a.figures:  # before the grid runs: a file, a run's folder or the user's figures
        dest = check_destination_folder("--figures", a.figures, out, a.overwrite, FIGURES)
    with nothing_left_on_refusal(out):
        mark_out(out, "compare")
        rows = execute(sweep, out, progress=not a.no_progress, executor=executor)
    written = write_report(rows, out, load_tensors, last_round=frontier)
    say = _printer(a.json)
    say(markdown(summarize(rows)))
    if frontier:
        from privaudit.api.frontier import write_frontier

        table, written["frontier"] = write_frontier(sweep, rows, out, progress=not a.no_progress)
        say(table)
    if dest is not None:
        dest.mkdir(parents=True, exist_ok=True)
        copied = []
        for p in [out / "summary.md", *(p for ps in written.values() for p in ps)]:
            if p.suffix in FIGURES:
                shutil.copyfile(p, dest / p.name)
                copied.append(dest / p.name)
        record_written(out, copied)  # a rerun may replace them while they are unchanged
        say(f"copied the figures and summary.md to {dest}")
    files = [p for ps in written.values() for p in ps if p.suffix != ".pdf"]
    names = ", ".join(p.name for p in files[:3])
    wall = time.perf_counter() - t0
    say(f"wrote {len(files)} files (and PDFs of the figures) to {out}, e.g. {names}; {wall:.0f} s")
    if a.json:
        doc = {
            "summary": summarize(rows),
            "cells": rows,
            "files": {k: [str(p) for p in ps] for k, ps in written.items()},
        }
        print(json.dumps(to_jsonable(doc), indent=2, allow_nan=False))
    return 0
