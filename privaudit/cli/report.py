"""``privaudit report``: one page of what a run or a study showed."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from privaudit.cli.options import (
    add_overwrite,
    check_destination,
    check_out,
    mark_out,
    nothing_left_on_refusal,
    record_written,
)
from privaudit.cli.vocabulary import Vocabulary
from privaudit.core.errors import PrivauditError
from privaudit.core.files import dumps_strict


def add_parser(sub: Any, words: Vocabulary) -> None:
    """Register ``report`` on the CLI's subparsers."""
    r = sub.add_parser(
        "report",
        help="one self-contained HTML page (and markdown/LaTeX tables) of a run or a study",
        description=(
            "Read what a command wrote — the --out folder of attack, audit or mia (a run's "
            "result), of compare or claims (a study), or a run folder — and write one "
            "self-contained report.html (figures inlined, no external file): the grids, the "
            "ROC with the region the DP guarantee allows, the audit verdicts with their "
            "evidence, the ledger's rows, the configuration and the code's version. Only the "
            "JSON and CSV files and figures the command wrote are read; nothing in the "
            "folder changes but the report's own files."
        ),
    )
    r.add_argument(
        "source",
        metavar="RUN_OR_STUDY",
        help="a folder privaudit attack, audit, mia, compare or claims wrote (--out), or a "
        "run folder (train --out)",
    )
    r.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="folder for report.html (default: RUN_OR_STUDY itself; a run folder, which "
        "only the run writes, needs --out)",
    )
    r.add_argument("--markdown", action="store_true", help="also write the tables as report.md")
    r.add_argument(
        "--latex",
        action="store_true",
        help="also write the tables as report.tex (LaTeX tables; needs \\usepackage{booktabs})",
    )
    add_overwrite(r, "a report.html, report.md or report.tex privaudit did not write")
    r.add_argument(
        "--json",
        action="store_true",
        help='print {"kind": …, "files": […]} on stdout instead of the line',
    )
    r.set_defaults(func=cmd_report)


def cmd_report(a: argparse.Namespace) -> int:
    """Check where the report goes, build it from the source's files, then write it."""
    from privaudit.api import report

    src = report.locate(a.source)
    beside = a.out is None or Path(a.out).expanduser().absolute() == src.folder.absolute()
    if beside:
        if src.kind == "run":
            raise PrivauditError(
                f"{a.source} is a run folder, whose files only the run writes; pass --out DIR "
                "for the report"
            )
        dest = src.folder
        for p in report.outputs(dest, a.markdown, a.latex):
            check_destination("--out", p, dest, a.overwrite)
    else:
        dest = check_out(a.out, "report", a.overwrite)
    page = report.build(src)  # every read error before anything is written
    if beside:
        written = report.write(page, dest, a.markdown, a.latex)
        if src.marked:  # a rerun may replace them while they are unchanged
            record_written(dest, written)
    else:
        with nothing_left_on_refusal(dest):
            mark_out(dest, "report")
            written = report.write(page, dest, a.markdown, a.latex)
    if a.json:
        print(dumps_strict({"kind": src.kind, "files": [str(p) for p in written]}, sort_keys=False))
    else:
        print(f"privaudit {src.kind} report: wrote {', '.join(str(p) for p in written)}")
    return 0
