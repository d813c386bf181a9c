"""The claims ledger's final-model column (``privaudit claims --final-model``): each defense's
final-model audit (an adversary who sees only the final models, a gradient canary in every
round) on every row of it — its lower bound, the accounted bound it is held to and the
verdict — cached like the rows, stated in the setting line, and absent without the flag.

The ledger is tiny: a correct formal defense (``dp-dpsgd``) and one with no guarantee
(``nd``, one row) on 4 agents at σ = 1, batches of 2, 64 trials per row and per final-model
audit, torch on one thread (a trial is many small operations).
"""

from __future__ import annotations

import inspect
import json
import math
import sys

import pytest
import torch

from privaudit.cli import claims as cli_claims
from privaudit.cli import main
from privaudit.core.config import RunConfig
from privaudit.core.files import from_jsonable
from privaudit.core.text import sig
from privaudit.experiments import claims, claims_final, ledger_text
from privaudit.experiments.final_audit import final_model_audit

ARGS = [
    "claims",
    "--target",
    "dp-dpsgd-half-model,nd-cg",
    "--agents",
    "4",
    "--sigma",
    "1",
    "--batch-size",
    "2",
    "--trials",
    "64",
    "--no-progress",
]
FINAL = ["--final-model", "--final-model-trials", "64"]


def _cli(*argv: str) -> tuple[int, str, str]:
    """``privaudit *argv`` in this process on one torch thread: exit code, stdout, stderr."""
    out: list[str] = []
    err: list[str] = []

    def capture(*a, file=None, **k) -> None:
        (out if file in (None, sys.stdout) else err).append(" ".join(map(str, a)))

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cap = pytest.MonkeyPatch()
    cap.setattr("builtins.print", capture)
    try:
        code = main(list(argv))
    finally:
        cap.undo()
        torch.set_num_threads(threads)
    return code, "\n".join(out), "\n".join(err)


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    """The ledger with the column, ``--json``: its folder, the document and stderr."""
    out = tmp_path_factory.mktemp("claims-final")
    code, stdout, err = _cli(*ARGS, *FINAL, "--out", str(out), "--json")
    assert code == 0, err
    return out, from_jsonable(json.loads(stdout)), err


def test_each_defense_has_its_final_model_audit(ledger) -> None:
    """The correct formal mechanism's lower bound stays within its accounted bound (the
    releases of its 3 rounds composed at sample rate 1, finite); the defense with no formal
    guarantee is held to ∞ (no guarantee), audited with its first kind's canary."""
    out, doc, err = ledger
    finals = doc["final_model"]
    assert list(finals) == ["dp-dpsgd", "nd"]  # the ledger's defenses, in its order
    dp, nd = finals["dp-dpsgd"], finals["nd"]
    assert dp["error"] is None and dp["target"] == "dp-dpsgd-half-model"  # its formal kind
    assert dp["rounds"] == claims.FINAL_ROUNDS == 3 and dp["trials"] == 64
    assert math.isfinite(dp["upper"]) and 0 <= dp["epsilon_lo"] <= dp["upper"]
    assert dp["verdict"] in ("consistent", "loose") and dp["verdict"] != "violated"
    assert dp["confidence"] == 0.95 and dp["victim"] == 0 and dp["distance"] == 1
    assert nd["error"] is None and nd["target"] == "nd-model"  # none formal: its first kind
    assert math.isinf(nd["upper"]) and nd["verdict"] == "no guarantee"
    assert doc["setting"]["final_model"]["trials"] == 64
    assert doc["setting"]["final_model"]["rounds"] == 3
    # the rows' own audits are the ledger's as ever
    assert [r["target"] for r in doc["rows"]] == ["dp-dpsgd-half-model", "nd-cg"]
    assert "2 final-model audits;" in err and "final-models)" not in err  # none cached
    assert (out / "ledger.json").read_text().count('"final_model"') == 2  # setting + results


def test_the_column_is_on_every_row_and_explained(ledger) -> None:
    """The markdown's last column holds each row's defense's bound, upper bound and verdict;
    the setting line states the final-model audits' trials and run, the legend the threat
    model and the upper bound, the headline their findings; the terminal table has it too."""
    out, doc, _ = ledger
    text = (out / "claims.md").read_text()
    header = "| " + " | ".join((*ledger_text.COLUMNS, ledger_text.FINAL_COLUMN)) + " |"
    assert header in text and ledger_text.FINAL_COLUMN == "final models ε ≥"
    rows = {line.split("`")[1]: line for line in text.splitlines() if line.startswith("| `")}
    dp = doc["final_model"]["dp-dpsgd"]
    cell = rows["dp-dpsgd-half-model"].rstrip(" |").rsplit(" | ", 1)[1]
    assert cell.startswith(sig(dp["epsilon_lo"])) and " against 8.4: " in cell
    assert rows["nd-cg"].endswith("against ∞: no guarantee |")
    assert ledger_text.FINAL_LEGEND in text and "Cebere et al., ICLR 2025" in text
    assert "composed at sample rate 1" in ledger_text.FINAL_LEGEND
    assert "Final models (last column): each defense's run of 3 rounds" in text
    assert "64 trials per defense" in text
    assert "(else its first kind: dp-dpsgd-half-model, nd-model)" in text
    assert "- Final models (an adversary who sees only them" in text
    table = ledger_text.table(doc)
    assert "final models ε ≥" in table and "**" not in table


def test_a_resumed_ledger_reads_the_final_model_audits_back(ledger, monkeypatch) -> None:
    """The same command again computes nothing: rows and final-model audits are read back
    from OUT/rows and OUT/final-models, and the files are the same byte for byte."""
    out, doc, _ = ledger
    files = {name: (out / name).read_bytes() for name in ("ledger.json", "claims.md")}

    def recomputed(*a, **k):
        raise AssertionError("a cached result was recomputed")

    monkeypatch.setattr(claims_final, "final_model_audit", recomputed)
    monkeypatch.setattr(claims, "row", recomputed)
    code, stdout, err = _cli(*ARGS, *FINAL, "--out", str(out), "--json")
    assert code == 0, err
    assert from_jsonable(json.loads(stdout)) == doc
    assert f"(2 from {out}/rows), 2 final-model audits (2 from {out}/final-models)" in err
    assert {name: (out / name).read_bytes() for name in files} == files
    assert len(list((out / "final-models").glob("*.json"))) == 2


def test_ctrl_c_keeps_the_final_model_audits_done(tmp_path, monkeypatch) -> None:
    """Ctrl-C in the second defense's final-model audit: the partial ledger keeps the rows
    and the first defense's audit (cached); the same command resumes and computes only the
    audit that was cut short."""
    calls: list[str] = []

    def cut(run, target, *a, **k):
        calls.append(target)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return final_model_audit(run, target, *a, **k)

    monkeypatch.setattr(claims_final, "final_model_audit", cut)
    out = tmp_path / "c"
    code, _, err = _cli(*ARGS, "--final-model", "--final-model-trials", "32", "--out", str(out))
    assert code == 2 and "interrupted: 2 rows done" in err
    partial = json.loads((out / "ledger.json").read_text())
    assert not partial["complete"] and list(partial["final_model"]) == ["dp-dpsgd"]
    assert "Partial" in (out / "claims.md").read_text()
    calls.clear()
    args = [*ARGS, "--final-model", "--final-model-trials", "32", "--out", str(out), "--json"]
    code, stdout, err = _cli(*args)
    assert code == 0, err
    assert calls == ["nd-model"] and f"(1 from {out}/final-models)" in err
    doc = json.loads(stdout)
    assert doc["complete"] and list(doc["final_model"]) == ["dp-dpsgd", "nd"]
    assert doc["final_model"]["dp-dpsgd"] == partial["final_model"]["dp-dpsgd"]


def test_another_final_setting_is_another_key(ledger, monkeypatch, tmp_path) -> None:
    """The final-model audits' trials are in their cache key (the rows' keys do not hold the
    column's setting: the rows are read back)."""
    out, _, _ = ledger
    calls: list[int] = []

    def counted(run, target, trials, *a, **k):
        calls.append(trials)
        return final_model_audit(run, target, trials, *a, **k)

    monkeypatch.setattr(claims_final, "final_model_audit", counted)
    args = [*ARGS, "--final-model", "--final-model-trials", "40", "--out", str(out)]
    code, _, err = _cli(*args, "--json")
    assert code == 0, err
    assert calls == [40, 40] and f"(2 from {out}/rows)" in err
    assert "final-models)" not in err


def test_without_the_flag_the_document_has_no_such_key(ledger) -> None:
    """The same folder without --final-model: the rows are read back, and the ledger, its
    setting, the markdown and the table know nothing of the column."""
    out, _, _ = ledger
    code, stdout, err = _cli(*ARGS, "--out", str(out), "--json")
    assert code == 0, err
    doc = from_jsonable(json.loads(stdout))
    assert "final_model" not in doc and "final_model" not in doc["setting"]
    assert list(claims.ClaimsLedger.from_dict(doc).to_dict()) == [
        "setting",
        "topologies",
        "sigma",
        "rows",
        "complete",
    ]
    assert "final" not in (out / "ledger.json").read_text()
    text = (out / "claims.md").read_text()
    assert ledger_text.FINAL_COLUMN not in text and "Final models" not in text
    assert "| " + " | ".join(ledger_text.COLUMNS) + " |" in text
    assert "final" not in ledger_text.table(doc).lower()
    assert "final-model" not in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--final-model", "--final-model-trials", "5"], "--final-model-trials 5 is too few"),
        (["--final-model-trials", "100"], "--final-model-trials needs --final-model"),
        (["--final-model", "--final-model-trials", "0"], "--final-model-trials"),
    ],
)
def test_bad_final_model_input_is_one_line_and_exit_2(extra, message, tmp_path, capsys) -> None:
    args = ["claims", "--target", "nd-cg", "--no-progress", "--out", str(tmp_path / "c")]
    assert main([*args, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("privaudit: error:") and message in err and "\n" not in err
    assert not (tmp_path / "c").exists()  # refused before any work


def test_the_defaults_are_the_final_audits_own() -> None:
    """The column's trials are ``final_model_audit``'s default (and ``privaudit audit
    --observe final``'s), copied in the CLI for --help; the CLI documents both flags."""
    default = inspect.signature(final_model_audit).parameters["trials"].default
    assert claims.FINAL_TRIALS == cli_claims.FINAL_TRIALS == default
    assert claims.FINAL_ROUNDS == 3
    final = claims.final_config(RunConfig(), "dp-dpsgd")
    assert final.rounds == 3 and final.defense == "dp-dpsgd"
    assert final.topology == claims.run_config(RunConfig(), "dp-dpsgd").topology


# -- the text of constructed final-model audits (no run) -------------------------------------
def _doc(finals: dict) -> dict:
    """A one-row ledger (``nd-cg``, not audited) with the final-model audits ``finals``."""
    row = {
        "target": "nd-cg",
        "defense": "nd",
        "kind": "cg",
        "paper": "no privacy claim",
        "paper_short": "no privacy claim",
        "formal": False,
        "reason": "nd adds no noise",
        "epsilon_claimed": math.inf,
        "epsilon": math.inf,
        "error": "the link sees no nd-cg",
    }
    setting = claims.setting(RunConfig(), 1000, 0.95, 0, ["nd-cg"])
    setting["final_model"] = claims.final_setting(2000, 1e-5, 0.95, 0)
    return {
        "setting": setting,
        "topologies": {"nd": "ring"},
        "sigma": {"nd": 0.0},
        "rows": [row],
        "final_model": finals,
        "complete": True,
    }


def test_a_violated_or_failed_final_model_audit_is_said() -> None:
    bound = {
        "defense": "nd",
        "target": "nd-model",
        "sigma": 0.0,
        "error": None,
        "epsilon_lo": 9.5,
        "capped": False,
        "upper": 8.4,
        "verdict": "violated",
    }
    md = ledger_text.markdown(_doc({"nd": bound}))
    assert "9.5 against 8.4: **violated** |" in md
    assert "accounted bounds the evidence violates (a bug in the accounting if any): `nd`" in md
    failed = {"defense": "nd", "target": None, "error": "no neighbour"}
    md = ledger_text.markdown(_doc({"nd": failed}))
    assert "- **E2** final models of nd: no neighbour" in md
    assert "- Final models not audited (see the E-notes): `nd`." in md
    (line,) = [x for x in ledger_text.markdown(_doc({})).splitlines() if x.startswith("| `")]
    assert line.endswith("| — |")  # a partial ledger: this defense's audit not done yet
    doc = _doc({"nd": bound})
    back = claims.ClaimsLedger.from_dict(doc).to_dict()
    assert back == doc and list(back) == list(doc)  # final_model before complete, as written
