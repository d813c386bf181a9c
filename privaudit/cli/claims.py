"""``privaudit claims``: every defense's privacy claim beside the correct ε and an audit's."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from privaudit.cli.options import (
    DEFAULTS,
    add_executor_options,
    add_overwrite,
    check_destination,
    check_out,
    config_from_args,
    executor_from_args,
    mark_out,
    nothing_left_on_refusal,
    record_written,
    training_options,
)
from privaudit.cli.vocabulary import Vocabulary
from privaudit.core import limits
from privaudit.core.errors import PrivauditError

OUT = "privaudit-out/claims"
# the ledger's defaults (privaudit.experiments.claims.TRIALS and CONFIDENCE, whose module
# loads the engine: copied, so that --help answers without it; a test keeps them equal)
TRIALS = 1000
CONFIDENCE = 0.95
# the final-model audit's trials per defense (privaudit.experiments.claims.FINAL_TRIALS, the
# default of privaudit audit --observe final): copied for --help likewise
FINAL_TRIALS = 2000
ROW_SECONDS_REMOVED = (
    "--row-seconds was removed: a row's budget is --trials (the same everywhere); drop it "
    "(the costly kinds run a fixed share of --trials, as the setting line states)"
)


def add_parser(sub: Any, words: Vocabulary) -> None:
    """Register ``claims`` on the CLI's subparsers."""
    c = sub.add_parser(
        "claims",
        help="the claims ledger: each paper's privacy claim, the correct ε, an audit's ε",
        description=(
            "For every defense and message kind (privaudit targets) on one run configuration: "
            "the paper's privacy claim and the ε its own accounting gives, the correct "
            "accounted ε (∞ with the reason where there is no formal guarantee), a white-box "
            "canary audit's ε lower bound for one release of round 1, and the verdicts. A "
            "claim that rests on a gradient bound G the run does not enforce is judged on the "
            "canaries of norm ≤ G: beaten only by larger ones, it does not apply (-p "
            "enforce=true, where the defense has it, tests it as stated). "
            "With --final-model, a last column: each defense's final-model audit (an "
            "adversary who sees only the final models, a canary in every round). "
            "Finished rows are kept in OUT/rows: an interrupted ledger resumes. Writes "
            "OUT/ledger.json and OUT/claims.md (and --markdown PATH)."
        ),
    )
    _arguments(c, words)
    c.set_defaults(func=cmd_claims)


def _arguments(c: argparse.ArgumentParser, words: Vocabulary) -> None:
    """The arguments of ``claims``, with the ledger's defaults."""
    c.add_argument(
        "--defense",
        action="append",
        default=None,
        metavar="D[,D...]",
        help=f"only these defenses, of {', '.join(words.defenses)} (repeatable or "
        "comma-separated; default: all)",
    )
    c.add_argument(
        "--target",
        action="append",
        default=None,
        metavar="T[,T...]",
        help="only these targets, e.g. pdsl-cg (with --defense: both; privaudit targets)",
    )
    c.add_argument(
        "--trials",
        type=int,
        default=TRIALS,
        help=f"white-box trials per row, the same on every machine (default {TRIALS}); the "
        "costly kinds run a fixed share of them, and fewer than the canary search needs "
        "audit one canary: the setting line states each row's trials and search",
    )
    # removed: a budget in seconds made the ledger depend on the machine's speed and load
    c.add_argument("--row-seconds", default=None, help=argparse.SUPPRESS)
    c.add_argument(
        "--confidence", type=float, default=CONFIDENCE, help="of the lower bounds (0.95)"
    )
    c.add_argument(
        "--audit-seed",
        type=int,
        default=0,
        help="the audits' own draws (canaries, each trial's coin and noise), apart from the "
        "runs' --seed (default 0)",
    )
    c.add_argument(
        "--out", default=OUT, help=f"folder for runs, cached rows and the ledger (default {OUT})"
    )
    add_overwrite(
        c,
        "an --out folder holding files privaudit did not write there, or over a --markdown "
        "file it did not write",
    )
    c.add_argument(
        "--markdown",
        default=None,
        metavar="PATH",
        help="also write the markdown table to PATH (e.g. figures/claims.md)",
    )
    c.add_argument(
        "--final-model",
        action="store_true",
        help="add the column 'final models ε ≥': for each defense, the final-model audit of "
        "privaudit audit --observe final (hidden-state threat: only the final models are seen, "
        "a gradient canary of the defense's first formal kind's clip joins the victim's "
        "update in every round) on its run of 3 rounds, on every row of the defense: the ε "
        "lower bound, the accounted ε of those rounds' releases at sample rate 1, and the "
        "verdict; cached in OUT/final-models. Slow: each trial re-runs the 3 rounds",
    )
    c.add_argument(
        "--final-model-trials",
        type=int,
        default=None,
        metavar="N",
        help=f"with --final-model: trials of each defense's final-model audit (default "
        f"{FINAL_TRIALS}, privaudit audit --observe final's)",
    )
    c.add_argument(
        "--fresh",
        action="store_true",
        help="recompute rows (and final-model audits) cached in OUT/rows (OUT/final-models)",
    )
    c.add_argument("--json", action="store_true", help="print the ledger as JSON")
    training_options(c, DEFAULTS.rounds)
    add_executor_options(c)


def rows_on(executor: Any) -> Any:
    """The ledger's ``run_rows`` on ``executor``: each row not cached as one task."""
    from privaudit.api.executor import Task, TaskFailed
    from privaudit.experiments.claims import compute_row

    def run_rows(jobs: list[Any], cached: int, progress: bool) -> Iterator[tuple[Any, Any]]:
        tasks = [
            Task(
                j.path,
                compute_row,
                (j,),
                label=j.target,
                gpus=1.0 if j.cfg.device.startswith("cuda") else 0.0,
            )
            for j in jobs
        ]
        for t, r in executor.run(tasks, progress=progress, cached=cached):
            yield t.args[0], (r.error if isinstance(r, TaskFailed) else r)

    return run_rows


def cmd_claims(a: argparse.Namespace) -> int:
    from privaudit.api import cache
    from privaudit.core.files import to_jsonable
    from privaudit.experiments import claims, ledger_text

    if a.row_seconds is not None:
        raise PrivauditError(ROW_SECONDS_REMOVED)
    limits.check_int("--trials", a.trials, 1, limits.MAX_TRIALS)
    limits.check_float("--confidence", a.confidence, 0.0, 1.0, lo_open=True, hi_open=True)
    limits.check_seed("--audit-seed", a.audit_seed)
    final_trials = _final_trials(a)
    out = check_out(a.out, "claims", a.overwrite)
    targets = claims.select(a.defense, a.target)
    if a.markdown is not None:  # a folder, a run's file or the user's file: refused now
        check_destination("--markdown", a.markdown, out, a.overwrite)
    executor = executor_from_args(a)  # makes --out/--data-root absolute for Ray: before configs
    # the shared configuration; each defense (and its own topology) is set per run
    base = config_from_args(a, DEFAULTS.defense, a.rounds)
    # before any work: a --trials too few for any bound is refused, too few for the search
    # is said (the setting line says it too)
    for line in claims.budget_warnings(a.trials, base.delta, a.confidence):
        print(f"privaudit: warning: {line}", file=sys.stderr, flush=True)
    with nothing_left_on_refusal(out):
        mark_out(out, "claims")
        try:
            doc = claims.ledger(
                base,
                a.out,
                targets=targets,
                trials=a.trials,
                confidence=a.confidence,
                seed=a.audit_seed,
                fresh=a.fresh,
                # a bar would put an empty line before JSON that goes to a pipe or a file
                progress=not a.no_progress and (sys.stdout.isatty() or not a.json),
                run_rows=None if executor is None else rows_on(executor),
                cache=cache,  # rows verified on read: checksum, code, key
                final_trials=final_trials,
            )
        except claims.Interrupted as stop:
            done = len(stop.ledger["rows"])
            if not done:
                raise PrivauditError("interrupted before any row was done") from None
            claims.write(stop.ledger, a.out)  # the partial ledger, never over --markdown
            raise PrivauditError(
                f"interrupted: {done} row{'s' * (done != 1)} done, kept in {a.out}; run the same "
                "command again to resume"
            ) from None
    claims.write(doc, a.out, a.markdown)
    if a.markdown:
        record_written(out, [Path(a.markdown)])  # a rerun may replace it while unchanged
    where = f"{Path(a.out) / 'ledger.json'}, {Path(a.out) / 'claims.md'}"
    if a.markdown:
        where += f" and {a.markdown}"
    cached = sum(1 for r in doc["rows"] if r.get("cached"))
    done = (
        f"{len(doc['rows'])} rows in {doc['seconds']:.0f} s"
        f"{f' ({cached} from {a.out}/rows)' if cached else ''}{_finals_done(doc, a.out)}; "
        f"wrote {where}"
    )
    if a.json:  # the ledger alone on stdout, as ledger.json holds it; how it went on stderr
        text = json.dumps(
            to_jsonable(claims.public(doc)), indent=2, sort_keys=True, allow_nan=False
        )
        print(text)
        print(done, file=sys.stderr)
        return 0
    print(ledger_text.table(doc))
    print(f"\n{done}")
    return 0


def _final_trials(a: argparse.Namespace) -> int | None:
    """The final-model audit's trials per defense (``--final-model``), None without it;
    ``--final-model-trials`` alone is refused (it would change nothing)."""
    if not a.final_model:
        if a.final_model_trials is not None:
            raise PrivauditError("--final-model-trials needs --final-model; add it or drop it")
        return None
    n = FINAL_TRIALS if a.final_model_trials is None else a.final_model_trials
    limits.check_int("--final-model-trials", n, 1, limits.MAX_TRIALS)
    return n


def _finals_done(doc: dict[str, Any], out: str) -> str:
    """The summary's words on the final-model audits (``--final-model``; none without)."""
    if "final_model" not in doc:
        return ""
    finals = doc["final_model"]
    cached = sum(1 for f in finals.values() if f.get("cached"))
    return (
        f", {len(finals)} final-model audit{'s' * (len(finals) != 1)}"
        f"{f' ({cached} from {out}/final-models)' if cached else ''}"
    )
