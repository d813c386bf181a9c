"""The typed audit result (:class:`~privaudit.experiments.audit.AuditResult`): its document is
the dict :func:`~privaudit.experiments.audit.audit` returned before it was typed — the same
keys in the same order, the same values — and the old dict access still works, with a
DeprecationWarning naming the new form.

The audits are the smallest of tests/test_audit.py: D-PSGD on 4 agents at σ = 2, 64 trials
(white box: round 1 of a 1-round run; one run: 64 canaries over 2 rounds).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import warnings

import pytest

from privaudit.cli import main
from privaudit.core.config import RunConfig
from privaudit.experiments.audit import AuditResult, audit
from privaudit.sim.run import Run

pytestmark = pytest.mark.usefixtures("one_thread")

TARGET = "dp-dpsgd-half-model"
# the documents' key order before the result was typed (white box: Clopper–Pearson and the
# Gaussian-DP estimate first, as the bounds are merged in; one run: its own order)
WHITE_BOX = [
    "clopper_pearson",
    "gdp",
    "epsilon_lo",
    "confidence",
    "delta",
    "tradeoff",
    "trials",
    "mode",
    "target",
    "round",
    "span",
    "interrupted",
    "threat",
    "victim",
    "receiver",
    "beyond",
    "distance",
    "attackers",
    "copies",
    "statistic",
    "canary",
    "search",
    "seconds",
    "raw",
    "accounting",
    "upper",
    "verdicts",
    "verdict",
]
ONE_RUN = [
    "mode",
    "target",
    "rounds",
    "observed_rounds",
    "trials",
    "epsilon_lo",
    "level",
    "one_run",
    "one_run_fdp",
    "threat",
    "victim",
    "canary",
    "confidence",
    "delta",
    "seconds",
    "raw",
    "accounting",
    "upper",
    "verdicts",
    "mu",
    "verdict",
]
NAMED = [f.name for f in dataclasses.fields(AuditResult) if f.name not in ("details", "key_order")]


@contextlib.contextmanager
def no_deprecated_access():
    """A block in which the result's deprecated dict access is an error: the project's own
    code must not use it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=r"audit\(\) returns", category=DeprecationWarning)
        yield


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A white-box and a one-run audit, each computed without any deprecated access."""
    tmp = tmp_path_factory.mktemp("audit-result")
    cfg = dict(defense="dp-dpsgd", agents=4, epsilon=None, sigma=2.0)
    wb_run = Run.create(RunConfig(**cfg, rounds=1), tmp / "wb")
    one_run = Run.create(RunConfig(**cfg, rounds=2), tmp / "one")
    with no_deprecated_access():
        wb = audit(wb_run, TARGET, trials=64, progress=False)
        one = audit(one_run, TARGET, mode="one-run", trials=64, progress=False)
    return {"white-box": (wb, WHITE_BOX), "one-run": (one, ONE_RUN)}


@pytest.mark.parametrize("mode", ["white-box", "one-run"])
def test_to_dict_is_the_audit_document_and_round_trips(results, mode) -> None:
    """``to_dict()`` has every key of the old dict in its order; the named fields are those
    entries, ``details`` the rest; reading the document back gives the same document, its
    values the very same objects."""
    res, order = results[mode]
    assert isinstance(res, AuditResult) and res.mode == mode
    doc = res.to_dict()
    assert list(doc) == order
    assert {k: doc[k] for k in NAMED} == {k: getattr(res, k) for k in NAMED}
    assert list(res.details) == [k for k in order if k not in NAMED]
    back = AuditResult.from_dict(doc)
    assert list(back.to_dict()) == order
    assert all(back.to_dict()[k] is v for k, v in doc.items())
    assert back.key_order == tuple(order) and back.details == res.details
    assert res.interrupted is False


def test_a_result_built_by_hand_lists_its_fields_then_its_details(results) -> None:
    """Without a key order (built field by field), the document is the named fields in
    their order, then the details; a document lacking a named entry is refused."""
    res, _ = results["one-run"]
    built = AuditResult(**{k: getattr(res, k) for k in NAMED}, details={"rounds": 2})
    assert list(built.to_dict()) == [*NAMED, "rounds"]
    with pytest.raises(KeyError, match="'epsilon_lo'"):
        AuditResult.from_dict({k: v for k, v in res.to_dict().items() if k != "epsilon_lo"})


def test_the_old_dict_access_works_and_warns(results) -> None:
    """``result[key]``, ``in``, ``.get``, ``.keys()``, ``.items()``, ``.values()``,
    iteration and assignment answer as the dict did, each with a DeprecationWarning naming
    the new form: the attribute, ``details[key]``, or ``to_dict()``."""
    wb, order = results["white-box"]
    res = dataclasses.replace(wb, details=dict(wb.details))  # assignments stay on this copy
    doc = res.to_dict()
    with pytest.warns(DeprecationWarning, match=r"use result\.epsilon_lo \(or result\.to_dict"):
        assert res["epsilon_lo"] == res.epsilon_lo
    with pytest.warns(DeprecationWarning, match=r"use result\.details\['search'\]"):
        assert res["search"] is doc["search"]
    with pytest.warns(DeprecationWarning, match=r"' in result\.to_dict\(\)"):
        assert "gdp" in res and "no such key" not in res
    with pytest.warns(DeprecationWarning, match=r"result\.details\.get\('missing'\)"):
        assert res.get("missing", 3) == 3
    with pytest.warns(DeprecationWarning, match=r"result\.verdict"):
        assert res.get("verdict") == res.verdict
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
    with pytest.warns(DeprecationWarning, match=r"use result\.details\['scores_file'\]"):
        res["scores_file"] = "scores.csv"
    with pytest.warns(DeprecationWarning, match=r"use result\.verdict"):
        res["verdict"] = "loose"
    assert res.details["scores_file"] == "scores.csv" and res.verdict == "loose"
    assert list(res.to_dict()) == [*order, "scores_file"]  # a new entry comes last
    assert "scores_file" not in wb.details  # the fixture's result is untouched


def test_the_audit_command_writes_the_document_as_before(tmp_path, capsys) -> None:
    """``privaudit audit --out … --json``: stdout is the document in its old key order (the
    raw outcome moved to scores.csv, the file names added last), audit.json the same
    document, and no deprecated access on the way."""
    out = tmp_path / "a"
    argv = ["audit", "--target", TARGET, "--trials", "64", "--agents", "4", "--rounds", "1"]
    argv += ["--sigma", "2", "--no-progress", "--out", str(out), "--json"]
    with no_deprecated_access():
        assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    expected = [k for k in WHITE_BOX if k != "raw"] + ["scores_file", "tradeoff_figure"]
    assert list(doc) == expected
    assert json.loads((out / "audit.json").read_text()) == doc
    rows = (out / doc["scores_file"]).read_text().splitlines()
    assert rows[0] == "coin,candidate,score" and len(rows) == 1 + doc["trials"]
