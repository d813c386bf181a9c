"""Cache entries that are read only when they hold what privaudit wrote, by the code running now.

A study's results (``compare``'s cells, audits, membership inferences, test accuracies) and the
model-level MIA's reference runs are cached on disk and read back by later commands. An entry
is only read when two things check out, so that a damaged file or one written by other code
is never taken for a result:

- **its content**: every file's SHA-256 and size, recorded when the entry was written. A
  zeroed, truncated, garbled or edited file does not match: the entry is discarded and
  recomputed, with one line on stderr — never parsed, never an internal error;
- **its producer**: the code that computed it — privaudit's :func:`code_identity` (its
  version, a digest of its own source files and of the mapped packages ``privaudit.attacks``,
  ``.defenses`` and ``.eval``, and torch's version) and :func:`plugin_sources` (a digest of the
  source file of every loaded plugin's module that registered a defense, attack, threat model
  or accountant) — and the key of what was computed. Another producer (privaudit upgraded or
  edited, a plugin edited, loaded or left out) or another key: discarded and recomputed, with
  one line saying why.

Two shapes of entry:

- a **folder** of files (a cell's ``result.json`` and ``recon.safetensors``, the reference
  runs' ``models.safetensors``) with a manifest :data:`MANIFEST` beside them, written last by
  :func:`seal` into the folder being committed (the caller commits it whole with
  :func:`privaudit.api.executor.commit_folder`, marker :data:`MANIFEST`), read with
  :func:`read` (the bytes, verified) or :func:`valid`;
- a **JSON file** that carries its own manifest (:func:`write_value`, :func:`read_value`):
  ``{"format", "key", "producer", "sha256", "value"}``, the SHA-256 over the value's
  canonical JSON.

Reading never unpickles: the bytes verified are the bytes parsed (JSON, safetensors).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import socket
import sys
import weakref
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from privaudit.attacks import ATTACKS
from privaudit.core.accountants import ACCOUNTANTS
from privaudit.core.errors import PrivauditError
from privaudit.core.files import dumps_strict, loads_strict, to_jsonable, write_json
from privaudit.core.threat import THREATS
from privaudit.defenses import DEFENSES

__all__ = [
    "FORMAT",
    "MANIFEST",
    "code_identity",
    "plugin_sources",
    "producer",
    "require",
    "seal",
    "read",
    "valid",
    "discard",
    "write_value",
    "read_value",
]

FORMAT = 1  # the layout of a manifest; another layout is another producer's entry
MANIFEST = "entry.json"  # a folder entry's manifest, written last: its marker
# privaudit's packages (pyproject.toml's package-dir): their .py files are its code identity
PACKAGES = ("privaudit", "privaudit.attacks", "privaudit.defenses", "privaudit.eval")


# -- what produced an entry ---------------------------------------------------------------------
@functools.cache
def code_identity() -> str:
    """privaudit's version, a digest of its source files and torch's version, in words
    (``privaudit 0.1.0 (source 1a2b…), torch 2.5.1``), computed once per process from the
    .py files of :data:`PACKAGES` (about a hundred). An edited or upgraded privaudit, or
    another torch, is another identity: its entries are not read."""
    files: dict[str, Path] = {}
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        for root in (spec.submodule_search_locations or []) if spec else []:
            for path in sorted(Path(root).rglob("*.py")):
                parts = path.relative_to(root).with_suffix("").parts
                files.setdefault(".".join([package, *parts]), path)  # a wheel nests them
    h = hashlib.sha256()
    for name in sorted(files):
        data = files[name].read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode() + data)
    try:
        version = metadata.version("privaudit")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        version = "(not installed)"
    return f"privaudit {version} (source {h.hexdigest()[:16]}), torch {torch.__version__}"


# a plugin module's source digest, taken the first time it is seen: the code that runs is the
# code that was imported, even if its file is edited afterwards in this process
_sources: weakref.WeakKeyDictionary[ModuleType, str] = weakref.WeakKeyDictionary()


def _source_digest(module: ModuleType | None) -> str:
    if module is None:
        return "not imported"
    if module not in _sources:
        try:
            _sources[module] = hashlib.sha256(Path(module.__file__).read_bytes()).hexdigest()[:16]
        except (OSError, TypeError):  # no source file (defined interactively, or removed)
            _sources[module] = "no source file"
    return _sources[module]


def _module_name(obj: Any) -> str:
    while isinstance(obj, functools.partial):
        obj = obj.func
    return getattr(obj, "__module__", None) or type(obj).__module__


def plugin_sources() -> dict[str, dict[str, str]]:
    """``{module: {"file", "sha256"}}`` for every module outside privaudit that defined a
    registered defense, attack, threat model or accountant: the plugins (files, entry points)
    and anything else that registered one. Any of them can change a result (a plugin threat
    model may be the one chosen, an accountant sets σ), so all of them are part of what
    produced an entry."""
    out: dict[str, dict[str, str]] = {}
    for registry in (DEFENSES, ATTACKS, THREATS, ACCOUNTANTS):
        for obj in registry.values():
            name = _module_name(obj)
            if name == "privaudit" or name.startswith("privaudit.") or name in out:
                continue
            module = sys.modules.get(name)
            out[name] = {
                "file": str(getattr(module, "__file__", None) or name),
                "sha256": _source_digest(module),
            }
    return out


def producer() -> dict[str, Any]:
    """What computes an entry in this process: :func:`code_identity` and
    :func:`plugin_sources`."""
    return {"code": code_identity(), "plugins": plugin_sources()}


def _difference(then: Any, now: dict[str, Any], was: str = "then", is_: str = "now") -> str | None:
    """Why the producer ``then`` (as an entry or a driver recorded it) is not ``now``, in
    words; ``was``/``is_`` name the two sides."""
    if not isinstance(then, dict) or not isinstance(then.get("plugins"), dict):
        return "its producer is not recorded"
    if then.get("code") != now["code"]:
        return f"privaudit's code differs: {then.get('code')} {was}, {now['code']} {is_}"
    old, new = then["plugins"], now["plugins"]
    for name in sorted(set(old) | set(new)):
        if name not in new:
            return f"plugin {old[name].get('file', name)} is loaded {was}, not {is_}"
        if name not in old:
            return f"plugin {new[name]['file']} is loaded {is_}, not {was}"
        if old[name].get("sha256") != new[name]["sha256"]:
            return f"plugin {new[name]['file']} has another source {is_} than {was}"
    return None


def require(expected: dict[str, Any]) -> None:
    """Refuse to work for a study whose driver runs other code: ``expected`` is the
    driver's :func:`producer`, handed to each task; a worker (another node of a Ray cluster)
    whose own differs raises one line naming both."""
    why = _difference(
        expected, producer(), "on the driver", f"on this worker ({socket.gethostname()})"
    )
    if why is not None:
        raise PrivauditError(
            f"{why}: install the same privaudit, torch and plugins on every node of the cluster"
        )


# -- discarding ---------------------------------------------------------------------------------
def discard(path: Path, why: str) -> None:
    """One line on stderr saying why ``path`` is not read, then remove it (a folder is first
    renamed aside, so that no reader sees half of it)."""
    print(f"cache: recomputing {path}: {why}", file=sys.stderr, flush=True)
    if path.is_dir() and not path.is_symlink():
        aside = path.with_name(f".{path.name}.discarded-{os.getpid()}.tmp")
        try:
            os.rename(path, aside)
        except FileNotFoundError:  # another reader discarded it first
            return
        except OSError:  # an earlier discard's leftover in the way: remove in place
            aside = path
        shutil.rmtree(aside, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _canonical(obj: Any) -> bytes:
    return dumps_strict(obj, indent=None).encode()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- folder entries -----------------------------------------------------------------------------
def seal(folder: Path, key: Any, about: dict[str, Any] | None = None) -> None:
    """Write :data:`MANIFEST` into ``folder`` (an entry being written, before it is
    committed): the SHA-256 and size of each of its files, the :func:`producer` and ``key``;
    ``about``: more fields for a human reader (never checked)."""
    files = {
        p.name: {"sha256": _sha(data), "bytes": len(data)}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MANIFEST
        for data in [p.read_bytes()]
    }
    doc = {"format": FORMAT, "key": key, "producer": producer(), "files": files, **(about or {})}
    write_json(folder / MANIFEST, to_jsonable(doc))


def _check(folder: Path, names: list[str] | None, key: Any) -> tuple[dict[str, bytes], str | None]:
    """The bytes of ``names`` (None: every file recorded) in the entry ``folder``, and why
    they may not be read (None: they may)."""
    try:
        doc = json.loads((folder / MANIFEST).read_bytes())
        files = doc["files"]
        if not isinstance(files, dict):
            raise ValueError
    except FileNotFoundError:
        return {}, f"it has no {MANIFEST}: written by an older privaudit or another program"
    except (OSError, ValueError, KeyError, TypeError):
        return {}, f"its {MANIFEST} is unreadable (damaged or edited)"
    if doc.get("format") != FORMAT:
        return {}, f"its {MANIFEST} has another format ({doc.get('format')!r}, not {FORMAT})"
    if key is not None and doc.get("key") != to_jsonable(key):
        return {}, "it holds another computation (its key differs)"
    why = _difference(doc.get("producer"), producer())
    if why is not None:
        return {}, f"written by other code: {why}"
    got: dict[str, bytes] = {}
    for name in files if names is None else names:
        rec = files.get(name)
        if not isinstance(rec, dict):
            return {}, f"{name} is not in its {MANIFEST}"
        try:
            data = (folder / name).read_bytes()
        except OSError:
            return {}, f"{name} is missing or unreadable"
        if len(data) != rec.get("bytes"):
            return {}, f"{name} has {len(data)} bytes where {MANIFEST} recorded {rec.get('bytes')}"
        if _sha(data) != rec.get("sha256"):
            return {}, f"{name} does not match its SHA-256 in {MANIFEST} (damaged or edited)"
        got[name] = data
    return got, None


def read(folder: Path, names: list[str], key: Any | None) -> dict[str, bytes] | None:
    """The bytes of the files ``names`` of the entry ``folder``, verified (module docstring;
    ``key`` None: any key). None when there is no entry, or when it may not be read: it is
    then discarded, with one line on stderr saying why."""
    if not folder.exists():
        return None
    got, why = _check(folder, names, key)
    if why is not None:
        discard(folder, why)
        return None
    return got


def valid(folder: Path, key: Any) -> bool:
    """Whether the entry ``folder`` exists and every file it records checks out (else it is
    discarded, with one line: :func:`read`)."""
    if not folder.exists():
        return False
    _, why = _check(folder, None, key)
    if why is not None:
        discard(folder, why)
    return why is None


# -- JSON entries -------------------------------------------------------------------------------
def write_value(path: Path, key: Any, value: Any) -> None:
    """Cache ``value`` (JSON-able) at ``path``, atomically, with its own manifest."""
    doc = {
        "format": FORMAT,
        "key": to_jsonable(key),
        "producer": producer(),
        "sha256": _sha(_canonical(value)),
        "value": to_jsonable(value),
    }
    write_json(path, doc)


def read_value(path: Path, key: Any, covers: Path | None = None) -> Any | None:
    """The value cached at ``path`` for ``key`` (:func:`write_value`), verified; None when
    there is none, or when it may not be read: it is then discarded, with one line. ``covers``:
    a folder the value vouches for (a run, whose producer it records), discarded with it."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        why = f"it is unreadable ({e.strerror})"
    else:
        why = _value_problem(data, key)
    if why is None:
        return loads_strict(data)["value"]
    if covers is not None and covers.exists():
        discard(covers, why)
        path.unlink(missing_ok=True)
    else:
        discard(path, why)
    return None


def _value_problem(data: bytes, key: Any) -> str | None:
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise ValueError
    except (ValueError, UnicodeDecodeError):
        return "it is not JSON (damaged)"
    if "value" not in doc or "sha256" not in doc:
        return "it has no manifest: written by an older privaudit or another program"
    if doc.get("format") != FORMAT:
        return f"it has another format ({doc.get('format')!r}, not {FORMAT})"
    if doc.get("key") != to_jsonable(key):
        return "it holds another computation (its key differs)"
    why = _difference(doc.get("producer"), producer())
    if why is not None:
        return f"written by other code: {why}"
    try:
        if _sha(_canonical(doc["value"])) != doc["sha256"]:
            return "its value does not match its SHA-256 (damaged or edited)"
    except (TypeError, ValueError):
        return "its value is not plain JSON (damaged or edited)"
    return None
