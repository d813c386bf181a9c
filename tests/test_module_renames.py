"""Renamed modules that plugins were told to use still import under their old name, with a
DeprecationWarning naming the new import (docs/extending.md names ``model_mia``, which lived
in ``privaudit.api.references`` and is now in ``privaudit.api.model_membership``)."""

from __future__ import annotations

import importlib
import sys

import pytest

from privaudit.api import model_membership


def test_the_old_reference_runs_module_warns_and_reexports() -> None:
    sys.modules.pop("privaudit.api.references", None)  # a module warns once, when imported
    with pytest.warns(DeprecationWarning, match=r"privaudit\.api\.model_membership import"):
        old = importlib.import_module("privaudit.api.references")
    assert old.model_mia is model_membership.model_mia
    assert old.reference_shards is model_membership.reference_shards
    assert old.Candidates is model_membership.Candidates
    with pytest.raises(AttributeError):
        old.no_such_name  # noqa: B018
