"""The typed membership result (:class:`~privaudit.api.membership_result.MembershipResult`):
its document is the dict :func:`~privaudit.api.message_membership.mia` and
:func:`~privaudit.api.model_membership.model_mia` returned before it was typed — the same keys
in the same order, the same values, ``result.json`` and ``privaudit mia --json`` unchanged —
and the old dict access still works, with a DeprecationWarning naming the new form.

The runs are the smallest of tests/test_mia.py and tests/test_membership_registry.py: D-PSGD on
4 agents for 3 rounds; message level: rounds 1–2 of victims 1 and 3 as agent 2 sees them;
model level: LOSS (no reference runs) on 8 candidate pairs of victim 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import warnings

import pytest
from conftest import run_cli, tiny

from privaudit.api.membership_result import MembershipResult
from privaudit.api.message_membership import mia
from privaudit.api.model_membership import model_mia
from privaudit.core.files import dumps_strict
from privaudit.sim.run import Run

pytestmark = pytest.mark.usefixtures("one_thread")

TARGET = "dsgd-half-model"
# the documents' key order before the result was typed; the last entries name the files
# written with ``out`` (result.json holds those before FIGURES: it is written before them)
MESSAGE = [
    "target",
    "rounds",
    "attack",
    "scorer",
    "threat",
    "members",
    "nonmembers",
    "auc",
    "tpr_at_fpr",
    "epsilon_release",
    "epsilon_release_reason",
    "delta",
    "violations",
    "violations_analysis",
    "epsilon_lo",
    "epsilon_lo_analysis",
    "refuted",
    "confidence",
    "tradeoff",
    "label_counts_exact",
    "label_tv",
    "per_message",
    "run",
    "scores_file",
    "figure",
    "tradeoff_figure",
]
MODEL = [
    "target",
    "attack",
    "score",
    "on",
    "round",
    "victim",
    "receiver",
    "threat",
    "members",
    "nonmembers",
    "auc",
    "tpr_at_fpr",
    "scores",
    "natural",
    "epsilon",
    "epsilon_reason",
    "epsilon_rounds",
    "delta",
    "epsilon_lo",
    "epsilon_lo_analysis",
    "refuted",
    "confidence",
    "tradeoff",
    "game",
    "split",
    "references",
    "run",
    "scores_file",
    "figure",
]
FIGURES = ("figure", "tradeoff_figure")  # added after result.json is written
NAMED = [
    f.name for f in dataclasses.fields(MembershipResult) if f.name not in ("details", "key_order")
]


@contextlib.contextmanager
def no_deprecated_access():
    """A block in which the result's deprecated dict access is an error: the project's own
    code must not use it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=r"mia\(\) and model_mia\(\)", category=Warning)
        yield


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A message-level and a model-level result, each computed (and written) without any
    deprecated access: the result, the documented key order, the output folder."""
    tmp = tmp_path_factory.mktemp("membership-result")
    run = Run.create(tiny("dsgd", rounds=3, batch_size=4, params={"lr": 0.5}), tmp / "run")
    with no_deprecated_access():
        message = mia(
            run,
            TARGET,
            1,
            messages=2,
            attackers=[2],
            victims=[1, 3],
            progress=False,
            out=tmp / "message",
        )
        model = model_mia(
            run,
            TARGET,
            attack="loss",
            victim=1,
            candidates=8,
            population=8,
            progress=False,
            out=tmp / "model",
        )
    return {
        "message": (message, MESSAGE, tmp / "message"),
        "model": (model, MODEL, tmp / "model"),
    }


@pytest.mark.parametrize("level", ["message", "model"])
def test_to_dict_is_the_old_document_and_round_trips(results, level) -> None:
    """``to_dict()`` has every key of the old dict in its order; the named fields are those
    entries, ``details`` the rest; result.json is that document (less the figures, written
    after it) byte for byte; reading it back gives the same document, the same objects."""
    res, order, out = results[level]
    assert isinstance(res, MembershipResult)
    doc = res.to_dict()
    assert list(doc) == order
    assert {k: doc[k] for k in NAMED} == {k: getattr(res, k) for k in NAMED}
    assert list(res.details) == [k for k in order if k not in NAMED]
    assert res.attack == ("grad" if level == "message" else "loss") and res.target == TARGET
    written = {k: v for k, v in doc.items() if k not in FIGURES}
    assert (out / "result.json").read_text() == dumps_strict(written) + "\n"
    back = MembershipResult.from_dict(doc)
    assert list(back.to_dict()) == order
    assert all(back.to_dict()[k] is v for k, v in doc.items())
    assert back.key_order == tuple(order) and back.details == res.details


def test_a_result_built_by_hand_lists_its_fields_then_its_details(results) -> None:
    """Without a key order (built field by field), the document is the named fields in
    their order, then the details; a document lacking a named entry is refused."""
    res, _, _ = results["model"]
    built = MembershipResult(**{k: getattr(res, k) for k in NAMED}, details={"on": "final"})
    assert list(built.to_dict()) == [*NAMED, "on"]
    with pytest.raises(KeyError, match="not a membership result: no 'auc'"):
        MembershipResult.from_dict({k: v for k, v in res.to_dict().items() if k != "auc"})


@pytest.mark.parametrize("level", ["message", "model"])
def test_the_old_dict_access_works_and_warns(results, level) -> None:
    """``result[key]``, ``in``, ``.get``, ``.keys()``, ``.items()``, ``.values()``,
    iteration and assignment answer as the dict did, each with a DeprecationWarning naming
    the new form: the attribute, ``details[key]``, or ``to_dict()``."""
    original, order, _ = results[level]
    res = dataclasses.replace(original, details=dict(original.details))  # assignments: a copy
    doc = res.to_dict()
    detail = "per_message" if level == "message" else "natural"
    prefix = r"mia\(\) and model_mia\(\) return a MembershipResult: "
    with pytest.warns(DeprecationWarning, match=prefix + r"result\['auc'\] is deprecated, use"):
        assert res["auc"] == res.auc
    with pytest.warns(DeprecationWarning, match=r"use result\.auc \(or result\.to_dict"):
        res["auc"]
    with pytest.warns(DeprecationWarning, match=rf"use result\.details\['{detail}'\]"):
        assert res[detail] is doc[detail]
    with pytest.warns(DeprecationWarning, match=r"' in result\.to_dict\(\)"):
        assert detail in res and "no such key" not in res
    with pytest.warns(DeprecationWarning, match=r"result\.details\.get\('missing'\)"):
        assert res.get("missing", 3) == 3
    with pytest.warns(DeprecationWarning, match=r"result\.epsilon_lo"):
        assert res.get("epsilon_lo") == res.epsilon_lo
    with pytest.warns(DeprecationWarning, match=r"result\.to_dict\(\)\.keys\(\)"):
        assert list(res.keys()) == order
    with pytest.warns(DeprecationWarning, match=r"result\.to_dict\(\)\.items\(\)"):
        assert [k for k, _ in res.items()] == order
    with pytest.warns(DeprecationWarning, match=r"result\.to_dict\(\)\.values\(\)"):
        assert len(list(res.values())) == len(order)
    with pytest.warns(DeprecationWarning, match=r"use result\.to_dict\(\)"):
        assert list(res) == order
    with pytest.warns(DeprecationWarning):
        with pytest.raises(KeyError):
            res["no such key"]
    with pytest.warns(DeprecationWarning, match=r"use result\.details\['note'\]"):
        res["note"] = "checked"
    with pytest.warns(DeprecationWarning, match=r"use result\.refuted"):
        res["refuted"] = True
    assert res.details["note"] == "checked" and res.refuted is True
    assert list(res.to_dict()) == [*order, "note"]  # a new entry comes last
    assert "note" not in original.details  # the fixture's result is untouched


@pytest.mark.parametrize(
    "level, argv",
    [
        ("message", ["--round", "1", "--messages", "2", "--victim", "1,3"]),
        ("model", ["--attack", "loss", "--round", "2", "--victim", "1", "--candidates", "8"]),
    ],
)
def test_the_mia_command_writes_the_document_as_before(tmp_path, capsys, level, argv) -> None:
    """``privaudit mia --out … --json``: stdout is the document in its old key order (the
    file names last), result.json the same document, less the figures, byte for byte as it
    was written (sorted keys); no deprecated access on the way."""
    out = tmp_path / "m"
    small = ["--agents", "4", "--rounds", "3", "--attacker", "2", "--population", "8"]
    with no_deprecated_access():
        code, stdout, err = run_cli(
            capsys,
            "mia",
            "--target",
            TARGET,
            *argv,
            *small,
            "--no-progress",
            "--out",
            str(out),
            "--json",
        )
    assert code == 0, err
    doc = json.loads(stdout)
    assert list(doc) == (MESSAGE if level == "message" else MODEL)
    assert stdout == dumps_strict(doc, sort_keys=False) + "\n"
    written = {k: v for k, v in doc.items() if k not in FIGURES}
    assert (out / "result.json").read_text() == dumps_strict(written) + "\n"
    assert (out / doc["figure"]).exists() and (out / doc["scores_file"]).exists()
