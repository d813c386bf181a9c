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
:class:`DeprecationWarning` naming the new form (the attribute, or ``to_dict()[key]``).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator
from typing import Any

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
class AuditResult:
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
      comparison with each; ``verdict``: the accountant's;
    - ``seconds``: how long the trials took; ``raw``: every trial's outcome (white box:
      ``coin``, ``candidate``, ``score``; one run: ``included``, ``score``), which
      ``privaudit audit`` writes to ``scores.csv``;
    - ``details``: what only this mode of audit has, as the experiment wrote it — white
      box: ``clopper_pearson``, ``gdp`` (where the scores are exactly Gaussian),
      ``tradeoff``, ``round``, ``span``, ``interrupted``, ``receiver``, ``beyond``,
      ``distance``, ``attackers``, ``copies``, ``statistic``, ``search``; one run:
      ``rounds``, ``observed_rounds``, ``one_run``, ``one_run_fdp``;
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

    @property
    def interrupted(self) -> bool:
        """Whether Ctrl-C ended the trials early (the bounds are of those that ran); a
        one-run audit is never returned interrupted."""
        return bool(self.details.get("interrupted", False))

    def to_dict(self) -> dict[str, Any]:
        """The audit's document: every entry, named field or detail, in :attr:`key_order`
        (then any entry it does not list). The values are shared, not copied."""
        entries = {**{name: getattr(self, name) for name in FIELDS}, **self.details}
        listed = [k for k in self.key_order if k in entries]
        rest = [k for k in entries if k not in set(listed)]
        return {k: entries[k] for k in [*listed, *rest]}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> AuditResult:
        """The result of an audit's document (what :meth:`to_dict` gives, or the dict the
        experiments build): its named fields taken out, the rest kept as ``details``, its
        order kept. Raises ``KeyError`` naming an entry every audit has that ``doc`` lacks."""
        missing = [name for name in FIELDS if name not in doc]
        if missing:
            raise KeyError(f"not an audit result: no {', '.join(map(repr, missing))}")
        return cls(
            **{name: doc[name] for name in FIELDS},
            details={k: v for k, v in doc.items() if k not in FIELDS},
            key_order=tuple(doc),
        )

    # -- the old dict interface, deprecated ------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        _deprecated(f"result[{key!r}]", _new_form(key))
        return self.to_dict()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        _deprecated(f"result[{key!r}] = …", _new_form(key, write=True))
        if key in FIELDS:
            setattr(self, key, value)
        else:
            self.details[key] = value
        if self.key_order and key not in self.key_order:
            self.key_order = (*self.key_order, key)

    def __contains__(self, key: object) -> bool:
        _deprecated(f"{key!r} in result", f"{key!r} in result.to_dict()")
        return key in FIELDS or key in self.details

    def __iter__(self) -> Iterator[str]:
        _deprecated("iterating over result", "result.to_dict()")
        return iter(self.to_dict())

    def get(self, key: str, default: Any = None) -> Any:
        """Deprecated: ``result.to_dict().get(key, default)`` (or the attribute)."""
        _deprecated(f"result.get({key!r})", _new_form(key, get=True))
        return self.to_dict().get(key, default)

    def keys(self) -> Any:
        """Deprecated: ``result.to_dict().keys()``."""
        _deprecated("result.keys()", "result.to_dict().keys()")
        return self.to_dict().keys()

    def values(self) -> Any:
        """Deprecated: ``result.to_dict().values()``."""
        _deprecated("result.values()", "result.to_dict().values()")
        return self.to_dict().values()

    def items(self) -> Any:
        """Deprecated: ``result.to_dict().items()``."""
        _deprecated("result.items()", "result.to_dict().items()")
        return self.to_dict().items()


def _new_form(key: Any, write: bool = False, get: bool = False) -> str:
    """What replaces the dict access of ``key``: the named field, else ``details``; reading,
    ``to_dict()`` beside it."""
    if key in FIELDS:
        new = f"result.{key}"
    elif get:
        new = f"result.details.get({key!r})"
    else:
        new = f"result.details[{key!r}]"
    if write:
        return new
    read = f"result.to_dict().get({key!r})" if get else f"result.to_dict()[{key!r}]"
    return f"{new} (or {read})"


def _deprecated(old: str, new: str) -> None:
    """Warn, where the caller of the :class:`AuditResult` method called it, that ``old`` (a
    use of the result as the dict it was) is deprecated, naming ``new``, the form to use."""
    warnings.warn(
        f"audit() returns an AuditResult: {old} is deprecated, use {new}",
        DeprecationWarning,
        stacklevel=3,
    )
