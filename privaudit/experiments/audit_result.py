"""The result of a canary audit (:func:`privaudit.experiments.audit.audit`), typed.

Every audit, white box or one run, has the same core — what was audited, the ε lower bound
at its confidence, the canary, every upper bound with its verdict — and these are the named
fields of :class:`AuditResult`. What only one kind of audit has (a white-box audit's
Clopper–Pearson and Gaussian-DP bounds, its canary search, round and copies; a one-run
audit's rounds and its two analyses) is kept, as the experiment wrote it, in
:attr:`AuditResult.details`.

:meth:`AuditResult.to_dict` is the document ``privaudit audit`` writes (``audit.json``): the
same keys, in the same order, with the same values as the dict :func:`audit` returned before
it returned this, so that every JSON written from it is unchanged byte for byte.

Reading the result as that dict (``result["epsilon_lo"]``, ``"gdp" in result``,
``result.get(…)``, ``result.keys()``, iterating) still works, with a
:class:`DeprecationWarning` naming the new form (the attribute, or ``to_dict()[key]``);
both come from :class:`privaudit.core.result_view.FieldsAndDetails`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from privaudit.core.result_view import FieldsAndDetails

# the entries every audit has: AuditResult's named fields, in their order
FIELDS = (
    "mode",
    "target",
    "trials",
    "epsilon_lo",
    "confidence",
    "delta",
    "threat",
    "victim",
    "canary",
    "accounting",
    "upper",
    "verdicts",
    "verdict",
    "seconds",
    "raw",
)


@dataclasses.dataclass
class AuditResult(FieldsAndDetails):
    """A canary audit's result (:func:`~privaudit.experiments.audit.audit`).

    - ``mode``: ``"white-box"`` or ``"one-run"``; ``target``: the audited target's name;
    - ``trials``: the trials that ran (a one-run audit: its canaries); ``epsilon_lo``: the
      ε lower bound, which holds at ``confidence``, at ``delta``;
    - ``threat``: the adversary, described; ``victim``: the agent whose data the canary
      joins; ``canary``: its ``kind``, gradient ``norm`` and measured ``impact`` (one run:
      and its ``rate``);
    - ``accounting``: the accountant's report for the audited releases; ``upper``: every
      upper bound the lower bound is compared with (``"accountant"``, ``"paper's count"``,
      and where they apply ``"paper"`` and the pairwise bounds); ``verdicts``: the
      comparison with each; ``verdict``: the accountant's (one run: ``violated`` also where
      its μ test is);
    - ``seconds``: how long the trials took; ``raw``: every trial's outcome (white box:
      ``coin``, ``candidate``, ``score``; one run: ``included``, ``score``), which
      ``privaudit audit`` writes to ``scores.csv``;
    - ``details``: what only this mode of audit has, as the experiment wrote it — white
      box: ``clopper_pearson``, ``gdp`` (where the scores are exactly Gaussian),
      ``tradeoff``, ``round``, ``span``, ``interrupted``, ``receiver``, ``beyond``,
      ``distance``, ``attackers``, ``copies``, ``statistic``, ``search``; one run:
      ``rounds``, ``observed_rounds``, ``level`` (each of its three tests'
      confidence), ``one_run``, ``one_run_fdp``, ``mu`` (the f-DP μ test: ``lower``,
      ``upper``, ``confidence``, ``verdict``);
    - ``key_order``: the order of the entries in the document (:meth:`to_dict`), which the
      two modes write differently; empty: the named fields, then ``details``.
    """

    mode: str
    target: str
    trials: int
    epsilon_lo: float
    confidence: float
    delta: float
    threat: str
    victim: int
    canary: dict[str, Any]
    accounting: dict[str, Any]
    upper: dict[str, float]
    verdicts: dict[str, str]
    verdict: str
    seconds: float
    raw: dict[str, Any]
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    key_order: tuple[str, ...] = dataclasses.field(default=(), repr=False, compare=False)

    # the document and the deprecated dict interface (privaudit.core.result_view)
    view_returned = "audit() returns an AuditResult"
    view_fields = FIELDS
    view_noun = "an audit result"

    @property
    def interrupted(self) -> bool:
        """Whether Ctrl-C ended the trials early (the bounds are of those that ran); a
        one-run audit is never returned interrupted."""
        return bool(self.details.get("interrupted", False))
