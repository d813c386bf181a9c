"""One row of the claims ledger (:mod:`privaudit.experiments.claims`): a message kind's
promise and truth (:func:`row`'s facts), the white-box audits that are its evidence (round
:data:`~privaudit.experiments.claims_plan.ROUND`, the
:data:`~privaudit.experiments.claims_plan.THREAT` adversary, a violation re-audited at the
Bonferroni level) and the verdicts — the paper's claim against the evidence
(:func:`claim_verdict`), the correct accounting against it — and the same row as plain data
for another process (:class:`RowJob`, :func:`compute_row`: ``privaudit claims --executor
ray``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from privaudit.core.config import RunConfig
from privaudit.core.errors import Interrupted as RunStopped
from privaudit.core.errors import PrivauditError
from privaudit.eval import bounds
from privaudit.experiments.audit import HELD_OUT, AuditResult, audit, verdict
from privaudit.experiments.claims_plan import CONFIDENCE, ROUND, THREAT, TRIALS
from privaudit.sim.run import Run

CLAIM_WIDTH = 44  # characters of the paper's claim shown in the table (the rest: a note)


def short_claim(text: str, width: int = CLAIM_WIDTH) -> str:
    """The head of a paper's claim: up to its first clause break, at most ``width``
    characters, cut at a word."""
    head = text
    for stop in (";", ":", ",", " ("):
        i = head.find(stop)
        if i > 0:
            head = head[:i]
    if len(head) <= width:
        return head
    cut = head[: width - 1].rsplit(" ", 1)[0]
    return cut + "…"


SEVERITY = ("violated", "consistent", "loose", "no claim")  # of one promise, most severe first
PROMISES = (("paper's count", "count"), ("paper", "rule"))  # the audit's upper bound, its name


def claim_verdict(
    res: dict[str, Any], assumption: tuple[str, float] | None = None
) -> dict[str, Any]:
    """The paper's promises for the one audited release — its count of releases at its
    multiplier, and its own σ(ε) rule where it states one — and the evidence of the white-box
    audit ``res`` against each (its document, :meth:`AuditResult.to_dict`, of which this
    reads ``epsilon_lo``, ``upper``, ``verdicts`` and the ``search``'s candidates);
    ``verdict`` is the most severe (a claim is refuted when any of its promises is),
    ``epsilon_lo`` the lower bound it rests on.

    A claim that rests on an ``assumption`` (what, G) which the run does not enforce
    (:attr:`~privaudit.core.privacy.Privacy.assumption`) is judged on the searched canaries
    that respect it, those of gradient norm ≤ G (their bounds hold together with the
    others'): beaten by one of them, it is "violated" — refuted under its own hypothesis;
    beaten only by canaries that break the hypothesis, it "does not apply" to this run —
    the evidence refutes the hypothesis, not the claim — and ``measured`` is the strongest
    of those canaries. ``under_assumption`` is the verdict of the canaries that respect it."""
    upper = res["upper"]
    out: dict[str, Any] = {"epsilon_lo": max(res["epsilon_lo"], 0.0)}
    for key, name in PROMISES:
        eps = upper.get(key)
        v = None if eps is None else "no claim" if math.isinf(eps) else res["verdicts"][key]
        out[name] = {"epsilon": eps, "verdict": v}
    judged = [
        (key, name) for key, name in PROMISES if out[name]["verdict"] not in (None, "no claim")
    ]
    beyond: list[dict[str, Any]] = []  # the canaries that break the assumption and beat a promise
    if assumption is not None and judged:
        what, bound = assumption

        def verdicts(c: dict[str, Any]) -> list[str]:
            # a candidate carries the rule's ε at its own impact ("paper"); the count is one ε
            lo = max(c["epsilon_lo"], 0.0)
            return [verdict(lo, c.get(key, upper[key])) for key, _ in judged]

        # a canary of unknown norm (none here: an example's is measured) counts on no side
        cands = [c for c in res["search"]["candidates"] if c["norm"] is not None]
        held = [c for c in cands if c["norm"] <= bound * (1 + 1e-9)]
        found = [verdicts(c) for c in held] or [[verdict(0.0, upper[key]) for key, _ in judged]]
        for j, (_, name) in enumerate(judged):
            out[name]["verdict"] = min((v[j] for v in found), key=SEVERITY.index)
        out["epsilon_lo"] = max((max(c["epsilon_lo"], 0.0) for c in held), default=0.0)
        out["assumption"] = {"what": what, "norm": bound}
        beyond = [c for c in cands if c not in held and "violated" in verdicts(c)]
    promised = [out[name]["verdict"] for _, name in PROMISES if out[name]["verdict"] is not None]
    out["verdict"] = min(promised, key=SEVERITY.index)
    out["refuted_by"] = [name for _, name in PROMISES if out[name]["verdict"] == "violated"]
    if "assumption" in out:
        out["under_assumption"] = out["verdict"]
        if beyond and not out["refuted_by"]:
            top = max(beyond, key=lambda c: c["epsilon_lo"])
            out["verdict"] = "does not apply"
            out["measured"] = {k: top.get(k) for k in ("kind", "norm", "impact", "epsilon_lo")}
    return out


def row(
    run: Any,
    kind: str,
    trials: int = TRIALS,
    confidence: float = CONFIDENCE,
    seed: int = 0,
    progress: bool = False,
    family: int = 1,
) -> dict[str, Any]:
    """The ledger's row of ``kind`` on ``run``, audited on ``trials`` trials (its budget,
    :func:`plan`): a row with ``error`` set when the audit cannot be made, e.g. the link
    adversary does not observe the kind in round 1.

    A lower bound at ``confidence`` exceeds a correct upper bound with probability up to
    1 − confidence, so among many rows some would read "violated" by chance. A row whose
    audit finds any bound violated is therefore audited again, on fresh noise and a fresh
    canary (seed + 1), at confidence 1 − (1 − confidence)/``family`` (Bonferroni over the
    ledger's ``family`` rows); that second audit is the row's evidence, so every
    "violated" of a ledger holds together at ``confidence``."""
    defense = run.defense
    privacy = defense.privacy(run.params, kind, run.ctx.W.cpu(), 0)
    out = _facts(run, kind, privacy)
    audits = _Audits(run, out["target"], confidence, seed, progress, family)
    try:
        res, first = audits.checked(audits.once(trials))
        real = None
        if out["formal"]:  # the input-space audit: a real example, as many trials
            real = audits.checked(audits.once(res.trials, shape="real"), "real")
    except RunStopped:  # a stop request is not this row's failure
        raise
    except PrivauditError as e:
        out["error"] = str(e)
        return out
    out.update(
        audit=_evidence(res, first, trials),
        upper=res.upper,
        verdicts=res.verdicts,
        real=None if real is None else _real(*real),
        claim=claim_verdict(res.to_dict(), privacy.assumption),
        accounting={
            "epsilon": res.upper["accountant"],
            "verdict": res.verdicts["accountant"],
            "sample_rate": res.accounting["sample_rate"],
        },
    )
    return out


def _facts(run: Any, kind: str, privacy: Any) -> dict[str, Any]:
    """A row's promise and truth (module docstring): what the paper claims, what its
    accounting and a correct one give over the run; the evidence is added to it."""
    defense = run.defense
    rep = run.resolved["kinds"][kind]
    return {
        "target": f"{defense.name}-{kind}",
        "defense": defense.name,
        "kind": kind,
        "message": defense.kinds[kind],
        "paper": privacy.paper,
        "paper_short": short_claim(privacy.paper),
        # False: no claim in the paper; the count is this tool's reading of it
        "paper_claims": privacy.paper_claims,
        "mechanism": privacy.mechanism,
        "formal": rep["formal"],
        "reason": rep["reason"],
        "caveats": list(privacy.caveats),
        "sigma": run.resolved["sigma"],
        "epsilon_claimed": rep["epsilon_claimed"],
        "epsilon": rep["epsilon"],
        "noise_multiplier": rep["noise_multiplier"],
        "releases_per_round": rep["releases_per_round"],
        "claimed_multiplier": privacy.claimed_multiplier,
        "claimed_releases_per_round": privacy.claimed_releases,
        "error": None,
    }


@dataclasses.dataclass(frozen=True)
class _Audits:
    """The white-box audits of one row: round :data:`ROUND`, the :data:`THREAT` adversary,
    at ``confidence``, re-audited at the Bonferroni level over ``family`` rows where a bound
    is violated (:func:`row`)."""

    run: Any
    target: str
    confidence: float
    seed: int
    progress: bool
    family: int

    def once(
        self, n: int, level: float | None = None, offset: int = 0, shape: str | None = None
    ) -> AuditResult:
        """One audit of ``n`` trials at ``level`` (default: the row's confidence)."""
        res = audit(
            self.run,
            self.target,
            mode="white-box",
            round=ROUND,
            trials=n,
            confidence=self.confidence if level is None else level,
            threat=THREAT,
            seed=self.seed + offset,
            progress=self.progress,
            canary_shape=shape,
        )
        if res.interrupted:  # Ctrl-C between trials: the row is not finished
            raise KeyboardInterrupt
        return res

    def checked(
        self, res: AuditResult, shape: str | None = None
    ) -> tuple[AuditResult, dict[str, Any] | None]:
        """``res``, or where it finds a bound violated, a second audit at the Bonferroni
        level (and the first, as the screening)."""
        if self.family == 1 or "violated" not in res.verdicts.values():
            return res, None
        level = 1 - (1 - self.confidence) / self.family
        again = bounds.trials_needed(self.run.cfg.delta, 1 - (1 - level) / 2, HELD_OUT)
        first = {
            "epsilon_lo": res.epsilon_lo,
            "trials": res.trials,
            "confidence": res.confidence,
            "verdicts": res.verdicts,
        }
        return self.once(max(res.trials, again), level, 1, shape), first


def _evidence(res: AuditResult, first: dict[str, Any] | None, trials: int) -> dict[str, Any]:
    """A row's ``audit``: the white-box audit's bound, its power (trials, the canaries
    searched) and the canary that gave it; ``first``: the screening audit a violation sent
    the row past; ``trials``: the row's budget."""
    own = res.details  # what only a white-box audit has
    cp, searched = own["clopper_pearson"], own["search"]["candidates"]
    return {
        "epsilon_lo": res.epsilon_lo,
        "capped": bool(cp["capped"]) and cp["epsilon_lo"] >= res.epsilon_lo,
        "clopper_pearson": cp["epsilon_lo"],
        "gdp": own.get("gdp", {}).get("epsilon_lo"),
        "trials": res.trials,
        "trials_asked": trials,
        # how many canary candidates the audit searched (1: none, its first alone)
        "searched": len(searched),
        "confidence": res.confidence,
        "screening": first,  # the first audit, when a violation sent the row to a second
        "round": own["round"],
        "threat": res.threat,
        "victim": res.victim,
        "receiver": own["receiver"],
        "copies": own["copies"],
        "canary": res.canary,
        # every searched canary: its gradient norm and bound (claim_verdict reads them)
        "candidates": [
            {k: c[k] for k in ("kind", "norm", "impact", "epsilon_lo")} for c in searched
        ],
    }


def _real(res: AuditResult, first: dict[str, Any] | None) -> dict[str, Any]:
    """A row's ``real``: the input-space audit (a real example as the canary)."""
    return {
        "epsilon_lo": res.epsilon_lo,
        "trials": res.trials,
        "confidence": res.confidence,
        "screening": first,
        "norm": res.canary["norm"],
        "impact": res.canary["impact"],
        "verdict": res.verdicts["accountant"],
    }


@dataclasses.dataclass(frozen=True)
class RowJob:
    """A row to compute in another process (:func:`compute_row`), as plain data: the run
    (its configuration and folder, created already, as an absolute path: a worker's working
    folder is not the driver's), the kind, the audit's setting (``trials``: the row's own),
    and where the finished row is cached and under which key (the driver caches it)."""

    target: str
    kind: str
    cfg: RunConfig
    rdir: str
    path: str
    key: Any
    trials: int
    confidence: float
    seed: int
    family: int


def compute_row(job: RowJob) -> dict[str, Any]:
    """:func:`row` of ``job``, wherever it runs (a Ray worker: see ``privaudit claims
    --executor``); the driver caches it. A stop request mid-audit raises instead: a row of
    fewer trials than asked is never returned."""
    run = Run.create(job.cfg, Path(job.rdir))
    return row(run, job.kind, job.trials, job.confidence, job.seed, False, job.family)


# rows computed elsewhere: given the jobs, the number of rows cached and whether to draw a
# bar, yields each job with its row, or with the error line of a job that could not finish
RowRunner = Callable[[list[RowJob], int, bool], Iterator[tuple[RowJob, "dict[str, Any] | str"]]]
