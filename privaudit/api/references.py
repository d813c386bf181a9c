"""Deprecated name of :mod:`privaudit.api.model_membership` (model-level membership inference,
``model_mia``), kept so that scripts and plugins written against it still import.

Importing it warns (a DeprecationWarning naming the new import, attributed to the importing
line) and every public name resolves to the one of :mod:`privaudit.api.model_membership`.
"""

from __future__ import annotations

import warnings
from typing import Any

from privaudit.api import model_membership

NEW = "from privaudit.api.model_membership import model_mia"


warnings.warn(
    f"privaudit.api.references is renamed privaudit.api.model_membership; use `{NEW}`",
    DeprecationWarning,
    stacklevel=2,  # the importing line: warnings skips importlib's frames
)


def __getattr__(name: str) -> Any:
    """A public name of :mod:`privaudit.api.model_membership`, the module's new home."""
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(model_membership, name)
