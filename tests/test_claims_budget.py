"""The claims ledger's budgets and cache: a row's trials are fixed before the study (never
by a clock), the ledger states the power it had (trials per row, whether the canary search
ran), and a cached row is read back only when it checks out (checksum, code, key).

The runs are the smallest of tests/test_claims.py: ``nd-cg`` (no noise: every trial cheap)
on 3 agents, a few hundred trials.
"""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import run_cli

from privaudit.core.config import RunConfig
from privaudit.experiments import claims, ledger_text
from privaudit.experiments.audit import check_trials, search_size

ARGS = ["claims", "--target", "nd-cg", "--agents", "3", "--no-progress"]
DELTA, CONFIDENCE = RunConfig.delta, claims.CONFIDENCE


def _ledger(capsys, out: Path, *extra: str) -> tuple[dict, str]:
    """``privaudit claims --json`` into ``out``: the ledger printed, and stderr."""
    text, err = _printed(capsys, out, *extra)
    return json.loads(text), err


def _printed(capsys, out: Path, *extra: str) -> tuple[str, str]:
    """``privaudit claims --json`` into ``out``: stdout (ledger.json's text) and stderr."""
    code, stdout, err = run_cli(capsys, *ARGS, *extra, "--out", str(out), "--json")
    assert code == 0, err
    assert stdout == (out / "ledger.json").read_text()
    return stdout, err


def _files(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in ("ledger.json", "claims.md")}


def _slow(clock: Callable[[], float], factor: float = 10.0) -> Callable[[], float]:
    """``clock`` running ``factor`` times fast from now: every span it measures is
    ``factor`` times longer, as on a machine that many times slower."""
    start = clock()
    return lambda: start + factor * (clock() - start)


def test_a_ledger_is_byte_identical_under_a_ten_times_slower_clock(
    tmp_path, capsys, monkeypatch
) -> None:
    """The same ledger computed on an idle machine and on one ten times slower (every clock
    privaudit reads runs 10× fast, as under a CPU hog): the same trials, the same bounds, the
    same ledger.json and claims.md byte for byte. A budget in seconds gave fewer trials to
    the slow one, and the files carried the seconds each row took."""
    idle, _ = _printed(capsys, tmp_path / "idle", "--trials", "600")  # 600: a 2-canary search
    for name in ("perf_counter", "monotonic", "time"):
        monkeypatch.setattr(time, name, _slow(getattr(time, name)))
    loaded, _ = _printed(capsys, tmp_path / "loaded", "--trials", "600")
    monkeypatch.undo()
    assert loaded == idle
    assert _files(tmp_path / "loaded") == _files(tmp_path / "idle")
    again, err = _printed(capsys, tmp_path / "loaded", "--trials", "600")  # read back
    assert again == idle and "(1 from " in err
    idle = json.loads(idle)
    (r,) = idle["rows"]
    assert r["audit"]["trials"] == 600 and "seconds" not in r and "seconds" not in idle
    assert "600 trials per row" in (tmp_path / "idle" / "claims.md").read_text()


def test_a_rows_trials_are_a_fixed_share_stated_and_in_its_key(
    tmp_path, capsys, monkeypatch
) -> None:
    """A costly kind runs a fixed share of --trials (:data:`claims.TRIAL_DIVISORS`): its row
    has those trials, its audit cell and the setting line say so, and they are in its cache
    key (another --trials giving the same share reads the row back)."""
    monkeypatch.setitem(claims.TRIAL_DIVISORS, "nd-cg", 4)
    doc, _ = _ledger(capsys, tmp_path / "c", "--trials", "256")
    (r,) = doc["rows"]
    assert r["audit"]["trials"] == 64 == r["audit"]["trials_asked"]
    assert doc["setting"]["audit"]["plan"] == {"nd-cg": {"trials": 64, "canaries": 1}}
    text = (tmp_path / "c" / "claims.md").read_text()
    assert "256 trials per row (64 for nd-cg: the costly kinds run a fixed share" in text
    assert "(capped, 64 trials)" in text
    (path,) = (tmp_path / "c" / "rows").glob("nd-cg-*.json")
    assert json.loads(path.read_text())["key"][-1]["trials"] == 64
    again, err = _ledger(capsys, tmp_path / "c", "--trials", "259")  # 259 // 4 = 64 too
    assert "(1 from " in err and again["rows"] == doc["rows"]


def test_too_few_trials_for_the_canary_search_are_said(tmp_path, capsys) -> None:
    """`--trials 300` cannot search the canary (2 candidates need 512): one warning line
    before the study, and a setting line that says no search ran, never "canary searched"."""
    doc, err = _ledger(capsys, tmp_path / "c", "--trials", "300")
    two = claims.search_needs(2, DELTA, CONFIDENCE)
    every = claims.search_needs(claims.CANDIDATES, DELTA, CONFIDENCE)
    lines = err.strip().splitlines()
    assert lines[0] == (
        f"privaudit: warning: --trials 300 is too few for the canary search (it needs {two} "
        f"for 2 candidates, {every} for all {claims.CANDIDATES}): every row audits the first "
        "candidate of its kind alone, and the setting line says so"
    )
    assert not any(x.startswith("privaudit: warning") for x in lines[1:])
    text = (tmp_path / "c" / "claims.md").read_text()
    assert "no canary search with 300 trials: the first of its kind's 5 candidates alone" in text
    assert "canary searched" not in text
    (r,) = doc["rows"]
    assert r["audit"]["searched"] == 1 and doc["setting"]["audit"]["plan"]["nd-cg"] == {
        "trials": 300,
        "canaries": 1,
    }
    _, err = _ledger(capsys, tmp_path / "d", "--trials", str(two))  # enough: no warning
    assert "warning" not in err


def test_an_edited_cached_row_is_recomputed(tmp_path, capsys) -> None:
    """A cached row whose number was changed by hand (still valid JSON) is not read: one
    line says why, the row is computed again, and the ledger prints the true number."""
    out = tmp_path / "c"
    doc, _ = _ledger(capsys, out, "--trials", "64")
    true = doc["rows"][0]["audit"]["epsilon_lo"]
    (path,) = (out / "rows").glob("nd-cg-*.json")
    entry = json.loads(path.read_text())
    row = entry.get("value", entry)  # the row, inside its manifest
    row["audit"]["epsilon_lo"] = 42.0
    path.write_text(json.dumps(entry, indent=2))
    again, err = _ledger(capsys, out, "--trials", "64")
    assert again["rows"][0]["audit"]["epsilon_lo"] == true != 42.0
    assert f"cache: recomputing {path}: its value does not match its SHA-256" in err
    assert "(1 from " not in err  # the summary: no row read back
    assert json.loads(path.read_text())["value"]["audit"]["epsilon_lo"] == true  # rewritten


# -- the plan, without runs ---------------------------------------------------------------------
def test_the_search_threshold_is_the_audits_own() -> None:
    """:func:`claims.search_needs` is the fewest trials for which the audit's own
    :func:`search_size` searches k candidates; the plan gives each row its trials and its
    search before the study; :data:`claims.CANDIDATES` is the search's own count."""
    from privaudit.core.context import params_of
    from privaudit.defenses import get_defense
    from privaudit.eval.canaries import candidates
    from privaudit.scenario.topology import build_topology, metropolis_hastings

    for k in range(1, claims.CANDIDATES + 1):
        n = claims.search_needs(k, DELTA, CONFIDENCE)
        assert search_size(k, n, DELTA, CONFIDENCE) == k
        assert search_size(k, n - 1, DELTA, CONFIDENCE) < k or k == 1
    need = check_trials(1000, DELTA, CONFIDENCE)
    plan = claims.plan(["nd-cg", "pdsl-model", "lppa-gt"], 1000, DELTA, CONFIDENCE)
    assert plan["nd-cg"] == {"trials": 1000, "canaries": search_size(5, 1000, DELTA, CONFIDENCE)}
    assert plan["pdsl-model"]["trials"] == max(need, 1000 // 16)
    assert plan["lppa-gt"] == {"trials": 250, "canaries": 1}
    assert claims.plan(["pdsl-mm"], need, DELTA, CONFIDENCE)["pdsl-mm"]["trials"] == need
    W = metropolis_hastings(build_topology("ring", 4)).double()
    for name, kind in (("dp-dpsgd", "half-model"), ("pdsl", "cg")):
        d = get_defense(name)
        privacy = d.privacy(params_of(d.Params, {"sigma": 1.0}), kind, W, 0)
        assert len(candidates(privacy, 8)) == claims.CANDIDATES


def test_the_setting_line_states_each_rows_trials_and_search() -> None:
    targets = ["nd-cg", "pdsl-model", "pdsl-mm", "lppa-gt"]
    doc = {
        "setting": claims.setting(RunConfig(), 1000, 0.95, 0, targets),
        "topologies": {"nd": "ring", "pdsl": "ring", "lppa": "ring"},
        "sigma": {},
        "rows": [],
    }
    line = ledger_text.describe(doc)
    k = search_size(5, 1000, DELTA, CONFIDENCE)
    assert (
        f"canary searched over the first {k} of the 5 candidates with 1000 trials; no canary "
        "search with 250 or 62 trials: the first of its kind's 5 candidates alone; a search "
        "needs 512 trials for 2 candidates, 1280 for all 5" in line
    )
    assert "1000 trials per row (250 for lppa-gt; 62 for pdsl-model, pdsl-mm: the costly" in line
    assert claims.budget_warnings(1000, DELTA, CONFIDENCE) == []
    with pytest.raises(Exception, match="too few for any bound"):
        claims.budget_warnings(8, DELTA, CONFIDENCE)


def test_rows_computed_elsewhere_are_the_local_ones_and_cached_by_the_driver(tmp_path) -> None:
    """The ``run_rows`` path (``--executor ray``): each job crosses a process boundary as
    plain data (pickled here), the worker only computes, the driver caches the row (as a
    verified entry) and the ledger is the local one; a rerun reads the row back."""
    from privaudit.api import cache

    base = RunConfig(agents=3).validate()
    kw = {"targets": ["nd-cg"], "trials": 64, "progress": False, "cache": cache}
    seen: list[claims.RowJob] = []

    def run_rows(jobs, cached, progress):
        for job in jobs:
            seen.append(job)
            there = pickle.loads(pickle.dumps(job))
            assert Path(there.rdir).is_absolute()
            yield job, claims.compute_row(there)

    local = claims.public(claims.ledger(base, tmp_path / "local", **kw))
    remote = claims.ledger(base, tmp_path / "remote", run_rows=run_rows, **kw)
    assert claims.public(remote) == local and len(seen) == 1
    (path,) = (tmp_path / "remote" / "rows").glob("nd-cg-*.json")
    assert cache.read_value(path, seen[0].key) == local["rows"][0]
    again = claims.ledger(base, tmp_path / "remote", run_rows=run_rows, **kw)
    assert len(seen) == 1 and again["rows"][0]["cached"]
    assert claims.public(again) == local
