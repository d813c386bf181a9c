"""The run directory: config, checkpoints, captured messages and secrets, kept apart.

    RUN/config.json                        the RunConfig plus the resolved σ and ε (strict
                                           JSON: ε = ∞ is "inf", privaudit.core.files)
    RUN/manifest.json                      SHA-256 and tensor schema of every file below
    RUN/checkpoints/round-000200.safetensors   agents' state + RNG state after that round
    RUN/messages/round-000200.safetensors      captured messages, key "src-dst-kind"
    RUN/secrets/round-000200.safetensors       realised batches (privaudit.core.sampling.secrets)

Only safetensors and JSON are ever read (no pickle). Every write is atomic and durable (a
temporary file, fsynced, then ``os.replace`` and an fsync of the folder) and recorded in
the manifest (:mod:`privaudit.sim.manifest`); every read checks the bytes against it, so a
truncated, edited or foreign file is reported with its name and the fix, never used. One
process writes a run at a time (:mod:`privaudit.sim.runlock`); a writer that starts removes
the temporary files a killed one left. Symbolic links inside a run directory are refused:
its files are its own, and nothing is written outside it.

What a run *is* — its configuration's identity fields and what the accounting resolved from
them (σ, the agents' sample rates, the parameters used) — is recorded in the manifest when
the run is created (:func:`run_record`), and again with config.json when privaudit extends
it to more rounds (:meth:`privaudit.sim.run.Run.extend`: a run whose σ does not depend on
its length), and compared with ``config.json`` on every read: an edited config.json is
refused even when its hash in the manifest was updated to match.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from safetensors.torch import load as load_bytes
from torch import Tensor

from privaudit.core import tensorfile
from privaudit.core.config import RunConfig
from privaudit.core.errors import PrivauditError
from privaudit.core.files import dumps_strict, from_jsonable, write_bytes
from privaudit.sim import runlock
from privaudit.sim.manifest import Manifest, entry, safetensors_header, tensor_entry

Key = tuple[int, int, int, str]
FOLDERS = ("checkpoints", "messages", "secrets")
CONFIG = "config.json"
SHARDS = "shards"  # the distributed engine's per-rank shards, each a RunDir


def _refuse_link(path: Path) -> None:
    if path.is_symlink():
        raise PrivauditError(
            f"{path} is a symbolic link; a run directory holds its own files (nothing is read "
            "from or written outside it): replace the link with the real file or folder"
        )


EDITED = "the run folder was edited: train again into a new --out"
# relative tolerance on σ and the sample rates between a record and a recomputation (the
# same accountant on the same inputs answers the same number; an edit changes it far more)
RTOL = 1e-6


def _json(value: Any) -> Any:
    """``value`` as strict JSON reads it back (tuples become lists, keys strings; a
    non-finite float, which a validated configuration never holds, its string)."""
    return json.loads(dumps_strict(value, indent=None))


def run_record(cfg: RunConfig, resolved: dict[str, Any]) -> dict[str, Any]:
    """What a run is, for its manifest (:mod:`privaudit.sim.manifest`): the identity fields
    of ``cfg`` (:meth:`RunConfig.identity`: rounds, agents, δ, accountant, ε, σ asked,
    parameters, …) and what the accounting resolved from them — σ, every agent's Poisson
    sample rate and the defense's parameters as used."""
    return _json(
        {
            "config": cfg.identity(),
            "sigma": resolved.get("sigma"),
            "sample_rates": [row.get("sample_rate") for row in resolved.get("agents", [])],
            "params": resolved.get("params"),
        }
    )


def _close(a: Any, b: Any) -> bool:
    """Whether two recorded values agree: numbers to :data:`RTOL`, lists and dicts item by
    item, anything else exactly."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b or abs(a - b) <= RTOL * max(abs(a), abs(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return a == b


def _diffs(key: str, old: Any, new: Any) -> list[tuple[str, Any, Any]]:
    """(field, new, old) for each leaf where ``new`` departs from ``old``: dicts key by key
    (``params.lr``), lists by length, then their first differing item (``sample_rates[3]``)."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted(set(old) | set(new))
        return [d for k in keys for d in _diffs(f"{key}.{k}" if key else k, old.get(k), new.get(k))]
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [(f"len({key})", len(new), len(old))]
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            if not _close(a, b):
                return _diffs(f"{key}[{i}]", a, b)
        return []
    return [] if _close(old, new) else [(key, new, old)]


def record_mismatch(recorded: dict[str, Any], now: dict[str, Any], source: str) -> str | None:
    """How the run record ``now`` (read ``source``) departs from ``recorded`` (both
    :func:`run_record`), in words naming each field and both values, or None."""
    diffs = _diffs("", recorded.get("config", {}), now.get("config", {}))
    for k in ("sigma", "sample_rates", "params"):
        if k in recorded:
            diffs += _diffs("σ" if k == "sigma" else k, recorded[k], now.get(k))

    def shown(v: Any) -> str:
        return f"{v:.6g}" if isinstance(v, float) else repr(v)

    return (
        "; ".join(
            f"{k} = {shown(new)} {source}, {shown(old)} when it was created"
            for k, new, old in diffs[:3]
        )
        or None
    )


def _fix(rel: str) -> str:
    if rel == CONFIG:
        return "restore it, or delete the run directory and train again"
    if rel.startswith("checkpoints/"):
        return "delete it and rerun: the run resumes from the previous good checkpoint"
    return "delete it and rerun: its round is re-simulated from a checkpoint"


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.manifest = Manifest(self.path)

    # -- the folder itself ---------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.path / CONFIG

    def exists(self) -> bool:
        return self.config_path.exists()

    def is_empty(self) -> bool:
        """Whether the folder holds nothing but its locks (a run can be created in it)."""
        ours = {runlock.WRITER, runlock.IO}
        return not self.path.exists() or all(p.name in ours for p in self.path.iterdir())

    def _folders(self) -> Iterator[Path]:
        """The run's folders, shards' included (those that exist)."""
        roots = [self.path]
        shards = self.path / SHARDS
        if shards.is_dir() and not shards.is_symlink():
            roots += sorted(p for p in shards.iterdir() if p.is_dir() and not p.is_symlink())
        for root in roots:
            yield root
            yield from (root / f for f in FOLDERS if (root / f).is_dir())

    def check_links(self) -> None:
        """Refuse symbolic links inside the run directory: a run's files are its own."""
        for folder in self._folders():
            for p in folder.iterdir():
                _refuse_link(p)

    def _checked(self, rel: str) -> Path:
        """``RUN/rel``, refusing a symbolic link on the way."""
        path = self.path
        for part in Path(rel).parts:
            path = path / part
            _refuse_link(path)
        return path

    def remove_temporaries(self) -> None:
        """Delete temporary files that a killed writer left (call as the writer)."""
        for folder in self._folders():
            for p in folder.glob(".*.tmp"):
                p.unlink(missing_ok=True)

    @contextmanager
    def writer(self) -> Iterator[None]:
        """Hold the run's writer lock (:mod:`privaudit.sim.runlock`) for a write session; the
        first holder checks the folder and removes a killed writer's temporary files."""
        first = not runlock.holds(self.path)
        with runlock.writer(self.path):
            if first:
                self.check_links()
                self.remove_temporaries()
            yield

    def adopt(self, pid: int) -> None:
        """Write under the lock that process ``pid`` (a distributed launcher) holds."""
        runlock.adopt(self.path, pid)

    # -- files, checked against the manifest --------------------------------------------------
    def _put(self, rel: str, data: bytes, run: dict[str, Any] | None = None) -> None:
        """``data`` as the (non-tensor) file ``rel`` (``run``: the run's record, written into
        the manifest with it)."""

        def write(path: Path) -> dict[str, Any]:
            write_bytes(path, data)
            return entry(data)

        self._record(rel, write, run)

    def _record(
        self, rel: str, write: Callable[[Path], dict[str, Any]], run: dict[str, Any] | None = None
    ) -> None:
        """``write(path)`` writes ``rel`` and returns its manifest entry, which is recorded
        (with ``run``, the run's record, when given), both under the run's I/O lock."""
        path = self._checked(rel)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            with runlock.io(self.path, exclusive=True):
                files = self.manifest.files()
                files[rel] = write(path)
                write_bytes(self.manifest.path, self.manifest.text(files, run))
        except OSError as e:
            raise runlock.unwritable(self.path, e) from None

    def _get(self, rel: str) -> bytes:
        path = self._checked(rel)
        with runlock.io(self.path, exclusive=False):
            data = path.read_bytes()
            why = self.manifest.mismatch(rel, data)
        if why:
            raise PrivauditError(f"{path} {why}; {_fix(rel)}")
        return data

    def recorded(self, rel: str) -> bool:
        """Whether ``rel`` is a file privaudit wrote here (in the manifest, and present)."""
        return rel in self.manifest.files() and (self.path / rel).exists()

    def _tensors(self, rel: str) -> dict[str, Tensor]:
        return self._decode(rel, self._get(rel))

    def _decode(self, rel: str, data: bytes) -> dict[str, Tensor]:
        try:
            return load_bytes(data)
        except Exception:
            raise PrivauditError(
                f"{self.path / rel} is not a safetensors file; {_fix(rel)}"
            ) from None

    def _save(self, rel: str, tensors: dict[str, Tensor], meta: dict[str, str] | None = None):
        """``tensors`` as the safetensors file ``rel``, written from their own memory
        (:mod:`privaudit.core.tensorfile`: no in-memory copy of the file)."""

        def write(path: Path) -> dict[str, Any]:
            sha, size = tensorfile.write(path, tensors, meta)
            return tensor_entry(sha, size, tensors)

        self._record(rel, write)

    # -- config ---------------------------------------------------------------------------
    def read_config(self) -> tuple[RunConfig, dict[str, Any]]:
        """The stored config and the resolved privacy values; one clear error if broken."""
        if self.path.exists() and not self.path.is_dir():
            raise PrivauditError(
                f"{self.path} is a file, not a run directory; pass the --out folder of "
                "privaudit train"
            )
        if not self.path.is_dir():
            raise PrivauditError(
                f"run directory {self.path} does not exist; create it with privaudit train --out"
            )
        if not self.exists():
            raise PrivauditError(
                f"{self.path} is not a privaudit run (no config.json); "
                "pass the --out folder of privaudit train"
            )
        if not self.manifest.exists():
            raise PrivauditError(
                f"{self.path} holds a config.json but no {self.manifest.path.name}: privaudit "
                "did not write it as a run (or a version without manifests did), so nothing in "
                "it can be checked; use a new or empty folder for train --out, or the --out "
                "folder of privaudit train for --run"
            )
        self.check_links()
        data = self._get(CONFIG)
        try:
            raw = json.loads(data)
            resolved = from_jsonable(raw.pop("resolved"))  # ε = ∞ is written "inf"
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, AttributeError, TypeError):
            raise PrivauditError(
                f"{self.config_path} is corrupt; delete the run directory and train again"
            ) from None
        try:
            cfg = RunConfig.from_dict(raw)
        except PrivauditError as e:
            raise PrivauditError(f"{self.config_path}: {e}") from None
        if not isinstance(resolved, dict) or not isinstance(resolved.get("agents", []), list):
            raise PrivauditError(
                f"{self.config_path} is corrupt; delete the run directory and train again"
            )
        self.check_record(run_record(cfg, resolved), "in config.json")
        return cfg, resolved

    def check_record(self, now: dict[str, Any], source: str) -> None:
        """Refuse the run when ``now`` (a :func:`run_record` read ``source``: "in
        config.json", or recomputed from it) departs from the record its manifest holds —
        whatever the digests say. A run written before runs were recorded has none: nothing
        to compare."""
        recorded = self.manifest.run()
        why = None if recorded is None else record_mismatch(recorded, now, source)
        if why:
            raise PrivauditError(
                f"{self.path} does not agree with its config.json ({why}); {EDITED}"
            )

    def check_accounting(self, cfg: RunConfig, resolved: dict[str, Any]) -> None:
        """Refuse the run when the accounting recomputed from its configuration
        (``resolved``: σ, sample rates, parameters) departs from what was recorded when it
        was created — in the manifest, or, for a run written before manifests recorded it,
        in its config.json — so a run never goes on at another σ than it was trained with."""
        now, source = run_record(cfg, resolved), "recomputed from config.json"
        if self.manifest.run() is not None:
            self.check_record(now, source)
            return
        _, stored = self.read_config()
        why = record_mismatch(run_record(cfg, stored), now, source)
        if why:
            raise PrivauditError(
                f"{self.path} does not agree with its config.json ({why}); {EDITED}"
            )

    def write_config(self, cfg: RunConfig, resolved: dict[str, Any]) -> None:
        """Write ``config.json`` (the configuration and the ``resolved`` privacy values) and
        record what the run is in the manifest (:func:`run_record`), in one manifest write:
        when the run is created, and when it is extended to more rounds (call as the
        writer)."""
        doc = {**json.loads(cfg.to_json()), "resolved": resolved}
        data = (dumps_strict(doc) + "\n").encode()
        self._put(CONFIG, data, run_record(cfg, resolved))

    # -- rounds -----------------------------------------------------------------------------
    def round_file(self, what: str, t: int) -> Path:
        """The file of round ``t`` under ``what`` ("checkpoints", "messages" or "secrets")."""
        return self.path / self._rel(what, t)

    @staticmethod
    def _rel(what: str, t: int) -> str:
        return f"{what}/round-{t:06d}.safetensors"

    def rounds(self, what: str) -> list[int]:
        """Rounds with a file under ``what`` that privaudit wrote (in the manifest)."""
        return sorted(t for t, _ in self._recorded_rounds(what))

    def shapes(self, what: str) -> dict[int, dict[str, list[int]]]:
        """Per round with a file under ``what`` that privaudit wrote: each tensor's shape, as
        the manifest recorded it (no file is read)."""
        out = {}
        for t, rec in self._recorded_rounds(what):
            tensors = rec.get("tensors") if isinstance(rec, dict) else None
            out[t] = {
                k: v[1]
                for k, v in (tensors if isinstance(tensors, dict) else {}).items()
                if isinstance(v, list) and len(v) == 2 and isinstance(v[1], list)
            }
        return out

    def _recorded_rounds(self, what: str) -> Iterator[tuple[int, Any]]:
        """(round, manifest record) of each file under ``what`` in the manifest, and present."""
        for rel, rec in self.manifest.files().items():
            folder, _, name = rel.partition("/")
            if folder != what or not name.startswith("round-"):
                continue
            try:
                t = int(name.removeprefix("round-").removesuffix(".safetensors"))
            except ValueError:
                continue
            if (self.path / rel).exists():
                yield t, rec

    def verify(self, what: str, t: int) -> None:
        """Check round ``t``'s file under ``what`` against the manifest (one clear error if it
        was truncated, edited or replaced), without decoding it."""
        self._get(self._rel(what, t))

    def discard(self, remove_folder: bool) -> None:
        """Delete every file this run recorded, its manifest and its folders where empty
        (call as the writer, on a run with nothing worth keeping); with ``remove_folder``,
        also the run directory itself when nothing else is left in it. A file privaudit did
        not write is never touched: its folder stays."""
        with runlock.io(self.path, exclusive=True):
            for rel in self.manifest.files():
                self._checked(rel).unlink(missing_ok=True)
            self.manifest.path.unlink(missing_ok=True)
        for folder in FOLDERS:
            with suppress(OSError):  # not empty: holds a file of someone else
                (self.path / folder).rmdir()
        if remove_folder and self.is_empty():
            for name in (runlock.WRITER, runlock.IO):
                (self.path / name).unlink(missing_ok=True)
            self.path.rmdir()

    def remove(self, what: str, t: int) -> None:
        """Delete round ``t``'s file under ``what``, if there is one."""
        rel = self._rel(what, t)
        with runlock.io(self.path, exclusive=True):
            (self.path / rel).unlink(missing_ok=True)
            files = self.manifest.files()
            if files.pop(rel, None) is not None:
                write_bytes(self.manifest.path, self.manifest.text(files))

    # checkpoints
    def checkpoint_rounds(self) -> list[int]:
        return self.rounds("checkpoints")

    def save_checkpoint(self, t: int, tensors: dict[str, Tensor]) -> None:
        self._save(self._rel("checkpoints", t), tensors)

    def load_checkpoint(self, t: int) -> dict[str, Tensor]:
        return self._tensors(self._rel("checkpoints", t))

    # messages
    def save_messages(
        self, t: int, messages: dict[Key, Tensor], links: Iterable[tuple[int, int]]
    ) -> None:
        """Merge into the round's file: earlier captures of the same round are kept.

        ``links`` are the directed links that were tapped, whether or not they carried a
        message this round (time-varying graphs leave some idle)."""
        with runlock.io(self.path, exclusive=True):
            merged, tapped = self.read_messages(t)
            merged.update(messages)
            tapped = sorted(set(tapped) | {tuple(e) for e in links})
            tensors = {f"{s}-{d}-{k}": v for (_, s, d, k), v in merged.items()}
            # a broadcast's links share their sender's one recorded copy (Tap.record): the
            # file holds each link's own, as safetensors needs
            seen: set[int] = set()
            for name, v in tensors.items():
                ptr = v.untyped_storage().data_ptr()
                tensors[name] = v.clone() if ptr in seen else v
                seen.add(ptr)
            meta = {"links": dumps_strict(tapped, indent=None)}
            self._save(self._rel("messages", t), tensors, meta)

    def read_messages(self, t: int) -> tuple[dict[Key, Tensor], list[tuple[int, int]]]:
        """Round ``t``'s captured messages and the directed links tapped (both empty if
        none), from one checked read of its file."""
        rel = self._rel("messages", t)
        if not self.recorded(rel):
            return {}, []
        data = self._get(rel)
        try:
            meta = safetensors_header(data).get("__metadata__") or {}
            links = [(int(s), int(d)) for s, d in json.loads(meta.get("links", "[]"))]
        except (ValueError, TypeError, AttributeError):
            raise PrivauditError(f"{self.path / rel} has malformed links; {_fix(rel)}") from None
        out = {}
        for name, v in self._decode(rel, data).items():
            try:
                s, d, kind = name.split("-", 2)
                out[(t, int(s), int(d), kind)] = v
            except ValueError:
                raise PrivauditError(
                    f"{self.path / rel} has a malformed message key {name!r}; {_fix(rel)}"
                ) from None
        return out, links

    def captured_links(self, t: int) -> list[tuple[int, int]]:
        """The directed links tapped in round ``t`` (empty if none)."""
        return self.read_messages(t)[1]

    def load_messages(self, t: int) -> dict[Key, Tensor]:
        """Round ``t``'s captured messages, keyed (t, src, dst, kind) (empty if none)."""
        return self.read_messages(t)[0]

    # secrets
    def save_secrets(self, t: int, tensors: dict[str, Tensor]) -> None:
        self._save(self._rel("secrets", t), tensors)

    def has_secrets(self, t: int) -> bool:
        return self.recorded(self._rel("secrets", t))

    def load_secrets(self, t: int) -> dict[str, Tensor]:
        rel = self._rel("secrets", t)
        if not self.recorded(rel):
            raise PrivauditError(f"no secrets recorded for round {t} in {self.path}")
        return self._tensors(rel)
