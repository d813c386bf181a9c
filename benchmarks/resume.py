"""Benchmarks that resume: each finished piece of a benchmark's work is saved in its output
folder as it goes, and a rerun into the same folder reads it back instead of computing it
again — a benchmark killed by a timeout loses only the piece it was in.

A benchmark names every piece it will compute up front by an *identity*: a JSON-able dict of
everything its result depends on (the benchmark, the setting, the arguments that change the
numbers). A finished piece is ``OUT/done/<digest>.json``, strict JSON written atomically
(:func:`privaudit.core.files.dumps_strict`: ``{"identity", "producer", "value"}``); its
working files (run folders, figures) live in ``OUT/work/<digest>/``. A piece is read back
only when both its identity and its producer — privaudit's code identity
(:func:`privaudit.api.cache.code_identity`, as for privaudit's own cache) and a digest of the
benchmark's script — are those of this run: other ``--trials``, another ε or edited code
compute it again. The value a piece returns is the value as read back from its file (tuples
become lists, ε = ∞ travels as "inf" and returns as ``float("inf")``, keys keep their
order), so a table printed from a fresh run and from a resumed one is the same table.

    OUT/done/3f2a9c01de.json    one finished piece
    OUT/work/3f2a9c01de/        its working files (a run folder, …)
    OUT/shared/NAME-9d0e4b7a21/ a folder several pieces use (a run each attacks)
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from privaudit.core.files import digest, dumps_strict, loads_strict, write_bytes

ROOT = Path("privaudit-out") / "benchmarks"  # each benchmark's default --out is ROOT / name


def add_out(p: argparse.ArgumentParser, name: str) -> None:
    """The ``--out DIR`` option of benchmark ``name`` (default privaudit-out/benchmarks/NAME)."""
    p.add_argument(
        "--out",
        type=Path,
        default=ROOT / name,
        help=f"folder of finished pieces and working files; a rerun into it resumes "
        f"(default {ROOT / name})",
    )


IDENTITY = "from privaudit.api.cache import code_identity; print(code_identity())"


def code() -> str:
    """privaudit's code identity (:func:`privaudit.api.cache.code_identity`), asked of a child
    process where this one has not loaded torch: a parent that measures its children's
    memory (``scale.py``) stays small."""
    if "torch" in sys.modules:
        from privaudit.api.cache import code_identity  # heavy: torch, the attacks, defenses

        return code_identity()
    out = subprocess.run([sys.executable, "-c", IDENTITY], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else f"unknown: {out.stderr[-200:]}"


def producer(scripts: list[str | Path]) -> dict[str, str]:
    """What computes a piece in this process: privaudit's code identity and a digest of each
    benchmark script in ``scripts`` (the benchmark's own file and the siblings it runs)."""
    h = hashlib.sha256()
    for s in scripts:
        h.update(Path(s).read_bytes())
    return {"code": code(), "scripts": h.hexdigest()[:16]}


class Pieces:
    """The pieces of one benchmark's work under ``out``; ``planned``: every piece's identity
    (to say on stderr how many are done already); ``scripts``: the benchmark's source files
    (its ``__file__``, and the sibling scripts it imports)."""

    def __init__(self, out: Path, planned: list[dict[str, Any]], scripts: list[str | Path]):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.producer = producer(scripts)
        done = sum(self.get(p)[0] for p in planned)
        if done:
            print(f"resuming from {self.out}: {done} of {len(planned)} done", file=sys.stderr)
        stale = sum(self._file(p).is_file() for p in planned) - done
        if stale:
            print(
                f"{self.out}: {stale} finished piece(s) were computed by other code (privaudit "
                "or the benchmark edited since): computing them again",
                file=sys.stderr,
            )

    def _file(self, identity: dict[str, Any]) -> Path:
        return self.out / "done" / f"{digest(identity)}.json"

    def work(self, identity: dict[str, Any]) -> Path:
        """The working folder of the piece ``identity`` (not created)."""
        return self.out / "work" / digest(identity)

    def shared(self, name: str, identity: dict[str, Any]) -> Path:
        """A working folder several pieces share (a run that each attacks), kept across reruns
        of this code: ``OUT/shared/NAME-<digest of identity and producer>``."""
        return self.out / "shared" / f"{name}-{digest([identity, self.producer])}"

    def get(self, identity: dict[str, Any]) -> tuple[bool, Any]:
        """(True, value) of a piece finished by this code, else (False, None): not finished,
        unreadable or computed by other code — it is computed again."""
        try:
            doc = loads_strict(self._file(identity).read_bytes())
            if doc["producer"] != self.producer:
                return False, None
            return True, doc["value"]
        except (OSError, ValueError, KeyError, TypeError):
            return False, None

    def put(self, identity: dict[str, Any], value: Any) -> Any:
        """Save the finished piece ``identity`` (atomically); its value as read back."""
        doc = {"identity": identity, "producer": self.producer, "value": value}
        # keys in the order the benchmark made them: its --json reads as it did before
        write_bytes(self._file(identity), (dumps_strict(doc, sort_keys=False) + "\n").encode())
        return self.get(identity)[1]

    def run(
        self, identity: dict[str, Any], compute: Callable[[Path], Any], keep: bool = False
    ) -> Any:
        """The value of the piece ``identity``: read back when finished, else
        ``compute(work)`` (``work``: its working folder, created empty) saved and read back.
        What a killed attempt left in ``work`` is removed first — a timed piece measures a
        new run, never one half trained before — unless ``keep``: then a run there goes on
        from its last checkpoint (``Run.create``); what other code finished is removed
        always."""
        ok, value = self.get(identity)
        if ok:
            return value
        work = self.work(identity)
        if not keep or self._file(identity).exists():
            shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        return self.put(identity, compute(work))
