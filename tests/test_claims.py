"""The claims ledger: rows, verdicts, markdown, JSON, resuming, interruption and bad input."""

from __future__ import annotations

import json
import math
import signal
import sys
import threading

import pytest
from ledgers import BOUNDED, CLAIM
from ledgers import audit_result as _audit
from ledgers import ledger_row as _row

from privaudit.cli import main
from privaudit.core.files import from_jsonable
from privaudit.core.interrupts import interrupts_noted
from privaudit.experiments import claims, ledger_text

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
    err: list[str] = []

    def capture(*a, file=None, **k) -> None:  # stdout: the JSON; stderr: warning, summary
        (lines if file in (None, sys.stdout) else err).append(" ".join(map(str, a)))

    cap.setattr("builtins.print", capture)
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
    assert "| " + " | ".join(ledger_text.COLUMNS) + " |" in text
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


def test_a_rerun_resumes_from_the_cached_rows(ledger, capsys, monkeypatch) -> None:
    """Every row is read back from OUT/rows (none recomputed; stderr says so), and the ledger
    is the one computed: the same JSON, the same files byte for byte."""
    out, _, doc = ledger
    files = {name: (out / name).read_bytes() for name in ("ledger.json", "claims.md")}

    def row(*a, **k):
        raise AssertionError("a cached row was recomputed")

    monkeypatch.setattr(claims, "row", row)
    assert main([*ARGS, "--out", str(out), "--json"]) == 0
    std = capsys.readouterr()
    assert from_jsonable(json.loads(std.out)) == doc
    assert f"({len(TARGETS)} from {out}/rows)" in std.err
    assert {name: (out / name).read_bytes() for name in files} == files


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
    warning, *err = capsys.readouterr().err.strip().splitlines()
    assert warning.startswith("privaudit: warning: --trials 64 is too few for the canary search")
    assert len(err) == 1 and err[0].startswith("privaudit: error: interrupted: 1 row done")
    assert "run the same command again to resume" in err[0]
    assert len(list((out / "rows").glob("*.json"))) == 1
    assert "Partial" in (out / "claims.md").read_text()
    calls.clear()  # the rerun: the row done is read back, the other computed (no Ctrl-C)
    assert main([*args, "--no-progress", "--out", str(out), "--json"]) == 0
    std = capsys.readouterr()
    rows = json.loads(std.out)["rows"]
    assert [r["target"] for r in rows] == ["nd-cg", "dsgd-half-model"]  # registry order
    assert calls == [1] and "(1 from " in std.err


def test_a_ctrl_c_the_audit_caught_is_noted_for_the_ledger() -> None:
    """The ledger's watch (:func:`~privaudit.core.interrupts.interrupts_noted`): Ctrl-C
    raises as usual and is noted first, so a row whose audit caught it between trials and
    returned early is told from a finished one; the handler before comes back after. Off
    the main thread the block runs as is."""
    before = signal.getsignal(signal.SIGINT)
    with interrupts_noted() as note:
        assert not note.seen
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:  # the audit's catch: it returns the trials done
            pass
        assert note.seen
    assert signal.getsignal(signal.SIGINT) is before
    seen: list[bool] = []

    def elsewhere() -> None:
        with interrupts_noted() as note:
            seen.append(note.seen)

    t = threading.Thread(target=elsewhere)
    t.start()
    t.join()
    assert seen == [False] and signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--defense", "nope"], "unknown defense 'nope'"),
        (["--target", "dpdl-nope"], "unknown target 'dpdl-nope'"),
        (["--trials", "5"], "too few"),
        (["--confidence", "2"], "--confidence"),
        # a budget in seconds made the trial count depend on the machine: refused
        (
            ["--row-seconds", "10"],
            "--row-seconds was removed: a row's budget is --trials (the same everywhere); ",
        ),
        (["--row-seconds", "0"], "--row-seconds was removed"),
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


# -- verdicts on constructed audits (no run: seconds) -------------------------------------------
# the ledger's ConstD²P at ε = 1: a Dirac of norm 1 (≤ G) shows nothing, the Dirac of 100
# and the mislabeled example (LeNet: gradient norm 27.7) beat the claim
BEYOND = _audit(("dirac", 1.0, 0.0), ("dirac", 100.0, 25.9), ("example", 27.7, 3.1))


def _doc(rows: list[dict]) -> dict:
    from privaudit.core.config import RunConfig

    return {
        "setting": claims.setting(RunConfig(), 1000, 0.95, 0, [r["target"] for r in rows]),
        "topologies": {r["defense"]: "ring" for r in rows},
        "sigma": {r["defense"]: 1.0 for r in rows},
        "rows": rows,
        "complete": True,
    }


def _claim_cell(r: dict) -> str:
    return ledger_text.cells(r, *(ledger_text.Notes(p) for p in "PRE"))[-2]


def test_a_claim_beaten_only_beyond_its_unenforced_assumption_does_not_apply() -> None:
    """ConstD²P without ``enforce``: the canaries that beat the claim have gradient norms
    100 and 27.7, far above G; the one within G shows nothing. The evidence breaks the
    assumption, not the claim."""
    c = claims.claim_verdict(BEYOND, BOUNDED)
    assert c["verdict"] == "does not apply" and c["refuted_by"] == []
    assert c["measured"]["norm"] == 100.0 and c["measured"]["epsilon_lo"] == 25.9
    assert c["epsilon_lo"] == 0.0 and c["under_assumption"] == "loose"
    assert c["count"]["verdict"] == "loose" and c["rule"]["verdict"] == "loose"
    cell = _claim_cell(_row("constd2p-half-model", BEYOND, BOUNDED))
    assert cell == (
        "assumption not enforced in this run: the claim does not apply (measured: ε ≥ 25.9 "
        "with a canary of norm 100 > G = 3.5; with norm ≤ G: no evidence)"
    )


def test_a_claim_beaten_within_its_assumption_is_refuted() -> None:
    """A canary of norm ≤ G that beats the claim refutes it under its own hypothesis."""
    res = _audit(("dirac", 1.0, 0.9), ("dirac", 100.0, 25.9))
    c = claims.claim_verdict(res, BOUNDED)
    assert c["verdict"] == "violated" and c["refuted_by"] == ["count", "rule"]
    assert c["epsilon_lo"] == 0.9 and "measured" not in c
    assert _claim_cell(_row("constd2p-half-model", res, BOUNDED)) == "**violated** (count + rule)"
    # at the bound itself (Muffliato's Dirac of norm G = 1) the canary respects it
    at = claims.claim_verdict(_audit(("dirac", 1.0, 0.9), rule=None), ("G-Lipschitz loss", 1.0))
    assert at["verdict"] == "violated"


def test_a_claim_with_nothing_unenforced_is_tested_as_stated() -> None:
    """No assumption (ClipD²P, or ConstD²P with -p enforce=true): every canary counts."""
    c = claims.claim_verdict(BEYOND)
    assert c["verdict"] == "violated" and c["refuted_by"] == ["count", "rule"]
    assert "assumption" not in c and c["epsilon_lo"] == 25.9
    assert "does not apply" not in _claim_cell(_row("clipd2p-half-model", BEYOND))


def test_a_loose_claim_beyond_its_assumption_keeps_its_word() -> None:
    """No canary beats the claim: the verdict is that of the canaries within G."""
    res = _audit(("dirac", 1.0, 0.2), ("dirac", 100.0, 0.5))
    c = claims.claim_verdict(res, BOUNDED)
    assert c["verdict"] == "loose" and c["epsilon_lo"] == 0.2 and "measured" not in c
    assert _claim_cell(_row("constd2p-half-model", res, BOUNDED)) == "loose"


def test_no_evidence_is_not_loose() -> None:
    """A lower bound of 0 shows nothing ("no evidence"); a positive one below half the
    upper bound shows a leak smaller than allowed ("loose")."""
    nothing = _row(
        "clipd2p-half-model",
        _audit(("dirac", 1.0, 0.0)),
        accounting={"epsilon": CLAIM, "verdict": "loose"},
    )
    some = _row(
        "clipd2p-weight",
        _audit(("dirac", 1.0, 0.2)),
        accounting={"epsilon": CLAIM, "verdict": "loose"},
    )
    notes = [ledger_text.Notes(p) for p in "PRE"]
    assert ledger_text.cells(nothing, *notes)[-2:] == ["no evidence", "no evidence"]
    assert ledger_text.cells(some, *notes)[-2:] == ["loose", "loose"]
    text = ledger_text.markdown(_doc([nothing, some]))
    assert "| no evidence | no evidence |" in text and "| loose | loose |" in text
    assert "no evidence (lower bound 0" in text


def test_headline_tells_refuted_claims_from_claims_that_do_not_apply() -> None:
    rows = [
        _row("constd2p-half-model", BEYOND, BOUNDED),
        _row("constd2p-weight", BEYOND, BOUNDED),
        _row("muffliato-model", BEYOND, ("G-Lipschitz loss", 1.0)),
        _row("pdsl-cg", _audit(("opposite", 1e4, 7.7))),
    ]
    lines = ledger_text.headline(_doc(rows))
    refuted = next(x for x in lines if x.startswith("- Claims the evidence refutes"))
    assert refuted.endswith(": `pdsl-cg`.")
    moot = next(x for x in lines if "do not apply because their assumption" in x)
    assert moot.endswith(
        ": `constd2p-half-model`, `constd2p-weight` (bounded gradients: every per-example "
        "gradient norm ≤ G (Assumption 6)); `muffliato-model` (G-Lipschitz loss)."
    )
    none = ledger_text.headline(_doc(rows[3:]))
    assert any(x.startswith("- Claims that do not apply") and x.endswith(": none.") for x in none)


def test_the_terminal_table_wraps_what_the_markdown_keeps_whole() -> None:
    """``privaudit claims`` prints a table narrow enough for a terminal (the long cells wrap);
    the markdown keeps every cell on one line."""
    rows = [
        _row("constd2p-half-model", BEYOND, BOUNDED),
        _row(
            "dp-cga-model",
            _audit(("dirac", 1.0, 0.0)),
            paper="CGA has no DP analysis; the DPDL and PDSL papers describe this baseline",
            paper_short="the DPDL and PDSL papers describe this…",
            paper_claims=False,
        ),
    ]
    doc = _doc(rows)
    text = ledger_text.table(doc)
    lines = text.splitlines()
    top = lines.index("") + 1  # the table, after the setting
    grid = lines[top : lines.index("", top)]
    assert max(map(len, grid)) <= 180
    assert any(x.startswith("constd2p-half-model") for x in grid)
    assert "assumption not enforced in" in text  # the claim cell, over lines of 30
    md = ledger_text.markdown(doc)
    assert _claim_cell(rows[0]) in md  # whole, on the row's line


@pytest.mark.parametrize(
    "name, kind, bound, what",
    [
        ("constd2p", "half-model", "G", "bounded gradients"),
        ("muffliato", "model", "grad_bound", "Lipschitz"),
    ],
)
def test_unenforced_gradient_bounds_are_a_privacy_fact(name, kind, bound, what) -> None:
    """ConstD²P and Muffliato assume a gradient bound G; unenforced, their Privacy says so
    (what the ledger reads), enforced it does not. ClipD²P clips: nothing assumed."""
    from privaudit.core.context import params_of
    from privaudit.defenses import get_defense
    from privaudit.scenario.topology import build_topology, metropolis_hastings

    def W(d):
        return metropolis_hastings(build_topology(d.topology or "ring", 6)).double()

    d = get_defense(name)
    for enforce in (False, True):
        p = params_of(d.Params, {"sigma": 1.0, "enforce": enforce})
        pr = d.privacy(p, kind, W(d))
        if enforce:
            assert pr.assumption is None and pr.formal
        else:
            assert pr.assumption[1] == getattr(p, bound) and what in pr.assumption[0]
    clip = get_defense("clipd2p")
    assert (
        clip.privacy(params_of(clip.Params, {"sigma": 1.0}), "half-model", W(clip)).assumption
        is None
    )


def test_a_rows_cache_key_holds_every_privacy_fact_but_functions() -> None:
    """A row is cached under the digest of its kind's Privacy facts: its functions (σ(ε)
    rule, pairwise bounds such as Muffliato's with an agent) are left out, the rest is in."""
    from privaudit.core.context import params_of
    from privaudit.core.files import digest
    from privaudit.defenses import get_defense
    from privaudit.scenario.topology import build_topology, metropolis_hastings

    d = get_defense("muffliato")
    W = metropolis_hastings(build_topology("ring", 6)).double()
    pr = d.privacy(params_of(d.Params, {"sigma": 1.0}), "model", W, 0)
    facts = claims.privacy_facts(pr)
    assert digest(facts) and not any(callable(v) for v in facts.values())
    assert facts["noise_multiplier"] == pr.noise_multiplier and "assumption" in facts
