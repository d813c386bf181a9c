"""The result of a membership inference, message level or model level, typed.

:func:`privaudit.api.message_membership.mia` (who is in the batch behind a message) and
:func:`privaudit.api.model_membership.model_mia` (who is in the victim's training set, from a
model) make the same claim about different things, and their results share its core: what
was attacked and by whom, how many members and non-members were scored, the AUC and the TPR
at low FPR, the one-run ε lower bound with its analysis and whether it refutes the stated ε,
the trade-off curve, the run. These are the named fields of :class:`MembershipResult`; what
only one level has is kept, as the attack wrote it, in :attr:`MembershipResult.details`.

:meth:`MembershipResult.to_dict` is the document ``privaudit mia`` writes (``result.json``,
and ``--json`` on stdout): the same keys, in the same order, with the same values as the
dict the two functions returned before they returned this, so that every JSON written from
it is unchanged byte for byte.

Reading the result as that dict (``result["auc"]``, ``"violations" in result``,
``result.get(…)``, ``result.keys()``, iterating) still works, with a
:class:`DeprecationWarning` naming the new form (the attribute, ``details[key]``, or
``to_dict()[key]``); both come from :class:`privaudit.core.result_view.FieldsAndDetails`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from privaudit.core.result_view import FieldsAndDetails

# the entries every membership result has: MembershipResult's named fields, in their order
FIELDS = (
    "target",
    "attack",
    "threat",
    "members",
    "nonmembers",
    "auc",
    "tpr_at_fpr",
    "delta",
    "epsilon_lo",
    "epsilon_lo_analysis",
    "refuted",
    "confidence",
    "tradeoff",
    "run",
)


@dataclasses.dataclass
class MembershipResult(FieldsAndDetails):
    """A membership inference's result (:func:`~privaudit.api.message_membership.mia` or
    :func:`~privaudit.api.model_membership.model_mia`).

    - ``target``: the attacked target's name; ``attack``: ``"grad"`` (message level: the
      candidates' gradients against the message) or the model-level membership attack
      asked for (``"loss"``, ``"lira"``, ``"rmia"``, or a plugin's);
    - ``threat``: the adversary, described; ``members``, ``nonmembers``: how many of each
      were scored (model level: the game's, one of each per pair);
    - ``auc``: the area under the ROC; ``tpr_at_fpr``: per false-positive rate (``"0.001"``,
      ``"0.01"``) the operating point, its Clopper–Pearson interval at ``confidence`` and
      whether the non-members resolve that rate;
    - ``delta``: the run's δ; ``epsilon_lo``: the one-run ε lower bound over member /
      non-member pairs (Steinke, Nasr & Jagielski 2023; message level: None without a pair),
      which holds at ``confidence``; ``epsilon_lo_analysis``: how it was computed (method,
      trials, guesses, correct; why none); ``refuted``: whether it exceeds the stated ε
      (None where that ε is not formal);
    - ``tradeoff``: the scores' trade-off curve with its band and the μ below which no
      μ-GDP mechanism gives it (``mu_lo``); ``run``: the attacked run's folder;
    - ``details``: what only this level has, as the attack wrote it —

      message level (``mia``): ``rounds`` (the rounds observed), ``scorer``,
      ``epsilon_release`` (one message's ε; None where not formal) and
      ``epsilon_release_reason``, ``violations`` and ``violations_analysis`` (ROC points
      above a swap's DP region, over independent trials), ``label_counts_exact``,
      ``label_tv`` and ``per_message`` (each message's round, victim, receiver, AUC, …);

      model level (``model_mia``): ``score`` (the headline score), ``on`` (``"message"`` or
      ``"final"``), ``round``, ``victim``, ``receiver``, ``scores`` (every score's AUC and
      TPRs), ``natural`` (the run's own model, shard against test split), ``epsilon`` and
      ``epsilon_reason`` (the bound over ``epsilon_rounds`` rounds), ``game``, ``split``
      and ``references`` (what the result rests on);

      with ``out`` given, both: ``scores_file`` and ``figure`` (the ROC); message level:
      ``tradeoff_figure``;
    - ``key_order``: the order of the entries in the document (:meth:`to_dict`), which the
      two levels write differently; empty: the named fields, then ``details``.
    """

    target: str
    attack: str
    threat: str
    members: int
    nonmembers: int
    auc: float
    tpr_at_fpr: dict[str, dict[str, Any]]
    delta: float
    epsilon_lo: float | None
    epsilon_lo_analysis: dict[str, Any]
    refuted: bool | None
    confidence: float
    tradeoff: dict[str, Any]
    run: str
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    key_order: tuple[str, ...] = dataclasses.field(default=(), repr=False, compare=False)

    # the document and the deprecated dict interface (privaudit.core.result_view)
    view_returned = "mia() and model_mia() return a MembershipResult"
    view_fields = FIELDS
    view_noun = "a membership result"
