"""The claims ledger's document and its text: :class:`~privaudit.experiments.claims.ClaimsLedger`
round-trips the document key for key, and :mod:`privaudit.experiments.ledger_text` renders
every row and note (no run: a constructed ledger)."""

from __future__ import annotations

import functools
import json

import pytest
from ledgers import BOUNDED, ledger_row
from ledgers import audit_result as _audit

from privaudit.core.config import RunConfig
from privaudit.core.errors import PrivauditError
from privaudit.core.files import to_jsonable
from privaudit.experiments import claims, ledger_text

_row = functools.partial(ledger_row, searched=1)  # the ledger's rows say their search


@pytest.fixture
def doc() -> dict:
    """A ledger of four rows: a claim that does not apply, one refuted, one with no claim in
    the paper, one not audited; a costly kind on its share of the trials."""
    rows = [
        _row("constd2p-half-model", _audit(("dirac", 1.0, 0.0), ("dirac", 100.0, 25.9)), BOUNDED),
        _row("pdsl-model", _audit(("opposite", 1e4, 7.7)), trials=62),
        _row(
            "dp-cga-model",
            _audit(("dirac", 1.0, 0.2)),
            paper="CGA has no DP analysis; the DPDL and PDSL papers describe this baseline",
            paper_short="the DPDL and PDSL papers describe this…",
            paper_claims=False,
        ),
        {**_row("nd-cg", _audit(("dirac", 1.0, 0.0))), "error": "the link sees no nd-cg"},
    ]
    targets = [r["target"] for r in rows]
    return {
        "setting": claims.setting(RunConfig(), 1000, 0.95, 0, targets),
        "topologies": {r["defense"]: "ring" for r in rows},
        "sigma": {r["defense"]: 1.0 for r in rows},
        "rows": rows,
        "complete": True,
    }


def _json(doc: dict) -> str:
    return json.dumps(to_jsonable(doc), indent=2, allow_nan=False)


def test_a_ledger_round_trips_key_for_key(doc) -> None:
    """``from_dict`` then ``to_dict`` gives the document back: equal, in the same key order
    (so its JSON is the same, byte for byte), with or without the seconds it took."""
    for d in (doc, {**doc, "seconds": 12.5}, {**doc, "complete": False, "seconds": 0.0}):
        back = claims.ClaimsLedger.from_dict(d).to_dict()
        assert back == d and list(back) == list(d) and _json(back) == _json(d)
    typed = claims.ClaimsLedger.from_dict(doc)
    assert typed.seconds is None and typed.rows is doc["rows"]
    assert claims.public({**doc, "seconds": 3.0}) == typed.to_dict()


def test_a_document_that_is_not_a_ledger_is_refused(doc) -> None:
    with pytest.raises(PrivauditError, match="unknown key 'extra'"):
        claims.ClaimsLedger.from_dict({**doc, "extra": 1})
    with pytest.raises(PrivauditError, match="no 'rows'"):
        claims.ClaimsLedger.from_dict({k: v for k, v in doc.items() if k != "rows"})


def test_the_text_shows_every_row_and_note(doc) -> None:
    """The markdown has a line per row and the notes its cells refer to; the terminal table
    has no markdown emphasis."""
    md = ledger_text.markdown(doc)
    rows = [line for line in md.splitlines() if line.startswith("| `")]
    assert [line.split("`")[1] for line in rows] == [r["target"] for r in doc["rows"]]
    assert "Not audited:" in md and "**E1** the link sees no nd-cg" in md
    assert "(62 trials" in md  # the costly kind's share, in its audit cell
    assert "our reading of its count" in md and "does not apply" in md
    table = ledger_text.table(doc)
    assert "**" not in table and "`" not in table and "not audited:" in table
