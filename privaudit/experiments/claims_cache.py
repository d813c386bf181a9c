"""Where the claims ledger (:mod:`privaudit.experiments.claims`) keeps what it finished:
rows under ``OUT/rows`` and final-model audits under ``OUT/final-models``, each read back
on the next run (unless ``--fresh``) when it checks out, so an interrupted ledger resumes
where it stopped and a changed defense is re-audited.

The cache itself is the caller's (:class:`RowCache`: the CLI passes
:mod:`privaudit.api.cache`, which this layer may not import); :class:`Kept` is how the
ledger uses it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Protocol


class RowCache(Protocol):
    """Where finished rows are kept and read back (``OUT/rows``): a value cached with its
    key, verified on read — its checksum, the code that computed it, the key — and None
    (after one line saying why) where it does not check out. :mod:`privaudit.api.cache`
    is one; this layer may not import it, so the caller passes it."""

    def read_value(self, path: Path, key: Any) -> Any | None: ...

    def write_value(self, path: Path, key: Any, value: Any) -> None: ...


@dataclasses.dataclass(frozen=True)
class Kept:
    """A ledger's finished results in its ``cache`` (None: none): read back unless
    ``fresh`` (``--fresh``: every one recomputed), kept once computed."""

    cache: RowCache | None
    fresh: bool

    def read(self, path: Path, key: Any) -> dict[str, Any] | None:
        """The result cached at ``path`` under ``key``, or None: none cached, one that does
        not check out, ``fresh``, or no cache."""
        return None if self.fresh or self.cache is None else self.cache.read_value(path, key)

    def keep(self, path: str | Path, key: Any, r: dict[str, Any]) -> None:
        """Cache the finished row (or final-model audit) ``r``, not one whose audit could
        not be made."""
        if r["error"] is None and self.cache is not None:
            self.cache.write_value(Path(path), key, r)
