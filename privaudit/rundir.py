"""The run directory: config, checkpoints, captured messages and secrets, kept apart.

    RUN/config.json                        the RunConfig plus the resolved σ and ε
    RUN/checkpoints/round-000200.safetensors   agents' state + RNG state after that round
    RUN/messages/round-000200.safetensors      captured messages, key "src-dst-kind"
    RUN/secrets/round-000200.safetensors       realised batches (privaudit.sampling.secrets)

Only safetensors and JSON are ever read (no pickle), every write is atomic (temporary file,
then ``os.replace``), and a file that does not parse is reported with the fix.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from .config import RunConfig
from .errors import PrivauditError

Key = tuple[int, int, int, str]


def atomic_write(path: Path, write) -> None:
    """Call ``write(tmp_path)`` and move the result over ``path`` only once it is complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True)
            f.write("\n")

    atomic_write(path, write)


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    # -- config ---------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    def exists(self) -> bool:
        return self.config_path.exists()

    def read_config(self) -> tuple[RunConfig, dict[str, Any]]:
        """The stored config and the resolved privacy values; one clear error if broken."""
        if not self.path.is_dir():
            raise PrivauditError(
                f"run directory {self.path} does not exist; create it with privaudit train --out"
            )
        if not self.exists():
            raise PrivauditError(
                f"{self.path} is not a privaudit run (no config.json); "
                "pass the --out folder of privaudit train"
            )
        try:
            raw = json.loads(self.config_path.read_text())
            resolved = raw.pop("resolved")
            return RunConfig.from_dict(raw), resolved
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, AttributeError, TypeError):
            raise PrivauditError(
                f"{self.config_path} is corrupt; delete the run directory and train again"
            ) from None

    def write_config(self, cfg: RunConfig, resolved: dict[str, Any]) -> None:
        write_json(self.config_path, {**json.loads(cfg.to_json()), "resolved": resolved})

    # -- tensors --------------------------------------------------------------------
    def round_file(self, what: str, t: int) -> Path:
        """The file of round ``t`` under ``what`` ("checkpoints", "messages" or "secrets")."""
        return self.path / what / f"round-{t:06d}.safetensors"

    def rounds(self, what: str) -> list[int]:
        """Rounds with a file under ``what`` ("checkpoints", "messages" or "secrets")."""
        folder = self.path / what
        if not folder.is_dir():
            return []
        out = []
        for f in folder.glob("round-*.safetensors"):
            try:
                out.append(int(f.stem.split("-")[1]))
            except (IndexError, ValueError):
                continue
        return sorted(out)

    def remove(self, what: str, t: int) -> None:
        """Delete round ``t``'s file under ``what``, if there is one."""
        self.round_file(what, t).unlink(missing_ok=True)

    def _load(self, path: Path) -> dict[str, Tensor]:
        try:
            return load_file(path)
        except Exception:
            raise PrivauditError(
                f"{path} is corrupt or not a safetensors file; delete it and rerun "
                "(it is regenerated from the previous checkpoint)"
            ) from None

    def _save(self, path: Path, tensors: dict[str, Tensor]) -> None:
        tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
        atomic_write(path, lambda tmp: save_file(tensors, tmp))

    # checkpoints
    def checkpoint_rounds(self) -> list[int]:
        return self.rounds("checkpoints")

    def save_checkpoint(self, t: int, tensors: dict[str, Tensor]) -> None:
        self._save(self.round_file("checkpoints", t), tensors)

    def load_checkpoint(self, t: int) -> dict[str, Tensor]:
        return self._load(self.round_file("checkpoints", t))

    # messages
    def save_messages(
        self, t: int, messages: dict[Key, Tensor], links: Iterable[tuple[int, int]]
    ) -> None:
        """Merge into the round's file: earlier captures of the same round are kept.

        ``links`` are the directed links that were tapped, whether or not they carried a
        message this round (time-varying graphs leave some idle)."""
        path = self.round_file("messages", t)
        merged = self._load(path) if path.exists() else {}
        merged.update({f"{s}-{d}-{k}": v for (_, s, d, k), v in messages.items()})
        tapped = sorted(set(self.captured_links(t)) | {tuple(e) for e in links})
        tensors = {k: v.detach().contiguous().cpu() for k, v in merged.items()}
        meta = {"links": json.dumps(tapped)}
        atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=meta))

    def captured_links(self, t: int) -> list[tuple[int, int]]:
        """The directed links tapped in round ``t`` (empty if none)."""
        path = self.round_file("messages", t)
        if not path.exists():
            return []
        try:
            with safe_open(path, framework="pt") as f:
                meta = f.metadata() or {}
            return [tuple(e) for e in json.loads(meta.get("links", "[]"))]
        except Exception:
            raise PrivauditError(
                f"{path} is corrupt or not a safetensors file; delete it and rerun "
                "(it is regenerated from the previous checkpoint)"
            ) from None

    def load_messages(self, t: int) -> dict[Key, Tensor]:
        path = self.round_file("messages", t)
        if not path.exists():
            return {}
        out = {}
        for name, v in self._load(path).items():
            s, d, kind = name.split("-", 2)
            out[(t, int(s), int(d), kind)] = v
        return out

    # secrets
    def save_secrets(self, t: int, tensors: dict[str, Tensor]) -> None:
        self._save(self.round_file("secrets", t), tensors)

    def load_secrets(self, t: int) -> dict[str, Tensor]:
        path = self.round_file("secrets", t)
        if not path.exists():
            raise PrivauditError(f"no secrets recorded for round {t} in {self.path}")
        return self._load(path)
