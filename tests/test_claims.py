"""The claims ledger: rows, verdicts, markdown, JSON, resuming, interruption and bad input."""

from __future__ import annotations

import json
import math

import pytest

from privaudit.cli import main
from privaudit.core.files import from_jsonable
from privaudit.experiments import claims

# cheap kinds on 4 agents at σ = 1 (a release's ε is large enough for 300 trials to show it):
# dp-dpsgd (a correct formal mechanism), clipd2p (push-sum: its own topology, two kinds),
# pdsl-cg (flat clip: the paper counts sensitivity C, the truth is 2C), dpdl-mm (informal,
# with a claim) and nd-cg (no noise, no claim)
ARGS = [
    "claims",
    "--defense",
    "dp-dpsgd,clipd2p",
    "--target",
    "pdsl-cg",
    "--target",
    "dpdl-mm,nd-cg",
    "--agents",
    "4",
    "--sigma",
    "1",
    "--trials",
    "300",
    "--row-seconds",
    "0",
    "--no-progress",
]
TARGETS = [
    "clipd2p-half-model",
    "clipd2p-weight",
    "dp-dpsgd-half-model",
    "dpdl-mm",
    "nd-cg",
    "pdsl-cg",
]


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    out = tmp_path_factory.mktemp("claims")
    md = out / "figures" / "claims.md"
    cap = pytest.MonkeyPatch()
    lines: list[str] = []
    cap.setattr("builtins.print", lambda *a, **k: lines.append(" ".join(map(str, a))))
    try:
        code = main([*ARGS, "--out", str(out), "--markdown", str(md), "--json"])
    finally:
        cap.undo()
    assert code == 0
    doc = from_jsonable(json.loads("\n".join(lines)))  # --json: the whole ledger, ∞ as "inf"
    return out, md, doc


def _rows(doc):
    return {r["target"]: r for r in doc["rows"]}


def test_a_row_per_kind_in_registry_order(ledger) -> None:
    _, _, doc = ledger
    assert sorted(r["target"] for r in doc["rows"]) == TARGETS
    order = list(claims.select())
    assert [r["target"] for r in doc["rows"]] == sorted(TARGETS, key=order.index)
    assert doc["complete"] and doc["topologies"]["clipd2p"] != "ring"  # push-sum: its own graph
    assert doc["setting"]["audit"]["trials"] == 300 and doc["setting"]["sigma"] == 1.0
    assert doc["setting"]["adjacency"] == "add/remove one example"
    for r in doc["rows"]:
        assert r["error"] is None and r["audit"]["trials"] == 300


def test_a_correct_formal_mechanism_is_not_violated(ledger) -> None:
    r = _rows(ledger[2])["dp-dpsgd-half-model"]
    assert r["formal"] and math.isfinite(r["epsilon"]) and r["epsilon"] > 0
    assert r["accounting"]["verdict"] in ("consistent", "loose")
    assert 0 < r["audit"]["epsilon_lo"] <= r["accounting"]["epsilon"]
    assert r["claim"]["verdict"] != "violated"  # the paper's count is the correct one here
    assert r["audit"]["screening"] is None and r["audit"]["confidence"] == 0.95


def test_every_formal_kind_has_a_real_example_bound_within_its_accounting(ledger) -> None:
    """The input-space audit (a real example under its own label as the canary) runs for
    every formal kind and only for those; on correct mechanisms it stays within the accounted
    ε of one release, and it says something (> 0) where a release's ε is large (σ = 1)."""
    for r in ledger[2]["rows"]:
        real = r["real"]
        if not r["formal"]:
            assert real is None
            continue
        assert real["trials"] == r["audit"]["trials"] and real["norm"] > 0
        assert real["epsilon_lo"] <= r["accounting"]["epsilon"]
        assert real["verdict"] != "violated"
    dp = _rows(ledger[2])["dp-dpsgd-half-model"]["real"]
    assert 0 < dp["epsilon_lo"]
    assert "real example ε ≥" in ledger[1].read_text()


def test_flat_clip_claim_is_refuted_by_the_evidence(ledger) -> None:
    r = _rows(ledger[2])["pdsl-cg"]
    count, truth = r["claim"]["count"]["epsilon"], r["accounting"]["epsilon"]
    lo = r["audit"]["epsilon_lo"]
    # σ = 1: the paper's count is one release at multiplier σ (ε ≈ 4.4); the truth is σ/2
    # (sensitivity 2C, ε ≈ 10); the audit proves more than the claim and less than the truth
    assert count < truth
    assert count < lo <= truth
    assert r["claim"]["verdict"] == "violated" and "count" in r["claim"]["refuted_by"]
    assert r["accounting"]["verdict"] != "violated"
    # a violation is re-audited on fresh noise at the Bonferroni level over the 6 rows
    assert r["audit"]["screening"]["verdicts"]["paper's count"] == "violated"
    assert r["audit"]["confidence"] == pytest.approx(1 - 0.05 / len(TARGETS))
    assert r["claim"]["rule"]["epsilon"] is not None  # Theorem 1 is a stated σ(ε) rule
    assert r["epsilon_claimed"] < r["epsilon"]  # over the run, too


def test_informal_kinds_are_infinite_with_a_reason(ledger) -> None:
    rows = _rows(ledger[2])
    for target in ("dpdl-mm", "nd-cg"):
        r = rows[target]
        assert not r["formal"] and math.isinf(r["epsilon"]) and r["reason"].strip()
        assert math.isinf(r["accounting"]["epsilon"])
        assert r["accounting"]["verdict"] == "no guarantee"
    assert math.isfinite(rows["dpdl-mm"]["epsilon_claimed"])  # the paper still claims one
    nd = rows["nd-cg"]
    assert math.isinf(nd["epsilon_claimed"]) and nd["claim"]["verdict"] == "no claim"
    assert nd["audit"]["epsilon_lo"] > 1  # an un-noised message: only the trials cap it


def test_markdown_has_the_header_and_a_row_per_kind(ledger) -> None:
    out, md, _ = ledger
    text = md.read_text()
    assert text == (out / "claims.md").read_text()
    assert "| " + " | ".join(claims.COLUMNS) + " |" in text
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert sorted(line.split("`")[1] for line in rows) == TARGETS
    pdsl = next(line for line in rows if "`pdsl-cg`" in line)
    assert "**violated**" in pdsl
    mm = next(line for line in rows if "`dpdl-mm`" in line)
    assert "∞ (R" in mm and "no guarantee" in mm
    # A(DP)²SGD as a baseline: the papers state no claim; its count is our reading
    dpsgd = next(line for line in rows if "`dp-dpsgd-half-model`" in line)
    assert "no claim in the paper; our reading of its count: " in dpsgd
    assert "No claim in the paper, but the evidence refutes our reading" in text
    assert "our reading" not in pdsl  # PDSL's Theorem 1 is the paper's own claim
    assert "Why ∞" in text and "Poisson" in text and "add/remove one example" in text
    json.loads((out / "ledger.json").read_text())  # valid JSON on disk too


def test_a_rerun_resumes_from_the_cached_rows(ledger, capsys) -> None:
    out, _, doc = ledger
    assert main([*ARGS, "--out", str(out), "--json"]) == 0
    again = from_jsonable(json.loads(capsys.readouterr().out))
    assert all(r.get("cached") for r in again["rows"])
    assert [r["audit"]["epsilon_lo"] for r in again["rows"]] == [
        r["audit"]["epsilon_lo"] for r in doc["rows"]
    ]


def test_ctrl_c_keeps_the_rows_done(tmp_path, monkeypatch, capsys) -> None:
    real, calls = claims.row, []

    def row(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(claims, "row", row)
    args = ["claims", "--target", "dsgd-half-model,nd-cg", "--agents", "3", "--trials", "64"]
    out = tmp_path / "c"
    assert main([*args, "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("privaudit: error: interrupted: 1 row done")
    assert "run the same command again to resume" in err[0]
    assert len(list((out / "rows").glob("*.json"))) == 1
    assert "Partial" in (out / "claims.md").read_text()
    monkeypatch.setattr(claims, "row", real)
    assert main([*args, "--no-progress", "--out", str(out), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r.get("cached", False) for r in rows] == [True, False]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--defense", "nope"], "unknown defense 'nope'"),
        (["--target", "dpdl-nope"], "unknown target 'dpdl-nope'"),
        (["--trials", "5"], "too few"),
        (["--confidence", "2"], "--confidence"),
        (["--row-seconds", "-1"], "--row-seconds"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(extra, message, tmp_path, capsys) -> None:
    args = ["claims", "--target", "dsgd-half-model", "--no-progress", "--out", str(tmp_path)]
    assert main([*args, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("privaudit: error:") and message in err and "\n" not in err


def test_short_claim_cuts_at_a_clause() -> None:
    assert claims.short_claim("Theorem 2: ε = Δf/(√2 β) per round") == "Theorem 2"
    long = "a claim that goes on and on without any clause break at all for a while"
    short = claims.short_claim(long)
    assert short.endswith("…") and len(short) <= claims.CLAIM_WIDTH
