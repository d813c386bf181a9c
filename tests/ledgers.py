"""Claims-ledger pieces built by hand, as :func:`privaudit.experiments.audit.audit` and
:func:`privaudit.experiments.claims.row` give them, for the tests of the ledger and of its
text (no run): imported as ``from ledgers import audit_result, ledger_row``."""

from __future__ import annotations

import math

from privaudit.experiments import claims
from privaudit.experiments.audit import verdict

G = 3.5  # ConstD²P's default gradient bound
BOUNDED = ("bounded gradients: every per-example gradient norm ≤ G (Assumption 6)", G)
CLAIM = 0.638  # the paper's count for one release at ε = 1 over the run


def audit_result(
    *canaries: tuple[str, float, float], count: float = CLAIM, rule: float | None = 0.85
) -> dict:
    """A white-box audit result with searched ``canaries`` (kind, gradient norm, ε lower
    bound) against ConstD²P's claims (the paper's ``count``, Prop. 1's σ(ε) ``rule``): the
    overall bound, the verdicts and the candidates."""
    found = [
        {"kind": k, "norm": n, "impact": n / 8, "epsilon_lo": lo, "paper": rule}
        for k, n, lo in canaries
    ]
    lo = max(c["epsilon_lo"] for c in found)
    upper = {"accountant": math.inf, "paper's count": count}
    if rule is not None:
        upper["paper"] = rule
    return {
        "epsilon_lo": lo,
        "upper": upper,
        "verdicts": {k: verdict(lo, u) for k, u in upper.items()},
        "search": {"candidates": found},
    }


def ledger_row(
    target: str,
    audit: dict,
    assumption: tuple[str, float] | None = None,
    *,
    trials: int = 1000,
    searched: int | None = None,
    **kw: object,
) -> dict:
    """A ledger row of ``target`` (a kind with no formal guarantee) on the constructed
    ``audit``; ``searched``: the canary candidates its audit searched (absent: not said);
    ``kw`` overrides any field."""
    audited = {
        "epsilon_lo": audit["epsilon_lo"],
        "capped": False,
        "trials": trials,
        "trials_asked": 1000,
        **({} if searched is None else {"searched": searched}),
        "confidence": 0.95,
        "screening": None,
    }
    r = {
        "target": target,
        "defense": target.split("-")[0],
        "kind": target.split("-", 1)[1],
        "paper": "Prop. 1, the classical Gaussian mechanism",
        "paper_short": "Prop. 1",
        "paper_claims": True,
        "formal": False,
        "reason": "assumes every per-example gradient norm ≤ G but never clips",
        "epsilon_claimed": 0.996,
        "epsilon": math.inf,
        "error": None,
        "audit": audited,
        "real": None,
        "claim": claims.claim_verdict(audit, assumption),
        "accounting": {"epsilon": math.inf, "verdict": "no guarantee"},
    }
    return {**r, **kw}
