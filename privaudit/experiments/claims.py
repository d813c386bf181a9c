"""The claims ledger: the promise, the truth and the evidence, per defense and message kind.

For every message kind of every defense (``privaudit targets``) on one run configuration,
one row puts side by side

- **the promise**: the paper's privacy claim as stated (:attr:`Privacy.paper`), the ε its
  own accounting gives over the run (``claimed_multiplier``, ``claimed_releases``: the
  run's ``epsilon_claimed``), and for the one release the audit observes, the ε of that
  count and of the paper's own σ(ε) rule where it states one;
- **the truth**: the ε a correct accounting gives over the run at the calibrated σ
  (``run.resolved``; ∞ with the reason when the kind has no formal guarantee), and for the
  one release the audit observes;
- **the evidence**: a white-box canary audit of round 1 (:func:`privaudit.experiments.audit.audit`),
  whose ε lower bound holds at the stated confidence whatever the accounting says;
- **the verdicts**: the lower bound against the claim's per-release ε (a "violated" claim
  is refuted by the evidence: its count or its rule promises less than is proven; a claim
  resting on an assumption the run does not enforce is judged on the canaries that respect
  it, and "does not apply" where only others beat it: :func:`claim_verdict`) and against
  the correct per-release bound (a "violated" accounting would be a bug in the
  accounting); a violation is re-audited at a Bonferroni level (:func:`row`). A "loose"
  verdict whose lower bound is 0 is written "no evidence".

Everything is accounted the way the tool accounts everything (:mod:`privaudit.core.accounting`):
adjacency is adding or removing one example, each agent's batch is Poisson sampled at
q_i = B/n_i, and the run's ε is the worst agent's. Per-release bounds are at sample rate 1,
which is what a single-round white-box audit measures.

A row's budget is a number of trials fixed before the study starts (:func:`plan`):
``--trials``, a fixed share of it for the costly kinds (:data:`TRIAL_DIVISORS`). Nothing
timed decides a trial count, so a ledger is the same, byte for byte (:func:`public`), on
any machine, under any load, locally or on a cluster. The setting line states each row's
trials and whether its canary search ran (a search needs more trials than a bound:
:func:`search_needs`).

Rows are cached under ``OUT/rows`` as they finish, keyed by everything that determines them
(the run's configuration, the mechanism facts, the audit's setting and the row's trials), so
an interrupted ledger resumes where it stopped and a changed defense is re-audited. The
cache is the caller's (:class:`RowCache`: the CLI passes :mod:`privaudit.api.cache`, which
this layer may not import): each entry carries a checksum and the code that computed it,
verified on read, so an edited or damaged row, or one written by other code, is recomputed.

On request (``privaudit claims --final-model``: ``final_trials``), each defense also gets
the **final-model audit** (:func:`privaudit.experiments.final_audit.final_model_audit`): the
hidden-state adversary of Cebere et al. (ICLR 2025), who sees only the final models and plants
a gradient canary in the victim's update in every round, on the defense's run over
:data:`FINAL_ROUNDS` rounds (what ``privaudit audit --observe final`` trains by default), its
canary that of the defense's first formal kind (:func:`final_target`). Its ε lower bound, the
accounted ε of the releases it composes (sample rate 1) and the verdict stand on every row of
the defense (:func:`final_result`), cached under ``OUT/final-models`` as the rows are.
Without it the document is what it was before the column existed, key for key.

The ledger document is a dict (:class:`ClaimsLedger` types it); its text — ``OUT/claims.md``
and the table ``privaudit claims`` prints — is :mod:`privaudit.experiments.ledger_text`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from privaudit.core.accounting import ADJACENCY, SAMPLING
from privaudit.core.config import RunConfig
from privaudit.core.errors import Interrupted as RunStopped
from privaudit.core.errors import PrivauditError, unknown
from privaudit.core.files import atomic_write, digest, to_jsonable, write_json
from privaudit.core.interrupts import InterruptNote, interrupts_noted
from privaudit.core.text import progress
from privaudit.defenses import DEFENSES, get_defense
from privaudit.eval import bounds
from privaudit.experiments.audit import HELD_OUT, audit, check_trials, search_size, verdict
from privaudit.experiments.final_audit import final_model_audit
from privaudit.experiments.ledger_text import markdown
from privaudit.sim.run import Run
from privaudit.sim.targets import Target, all_targets

TRIALS = 1000  # white-box trials per row (--trials); the costly kinds run a fixed share
# The kinds whose white-box trial re-runs far more than one message (the rest of the round or
# the next one, PDSL's Shapley weights): their rows run --trials // divisor trials (at least a
# bound's worth), so that the default ledger takes minutes rather than hours. A fixed table,
# measured once at the default configuration on 2 cores (a message's trial: 1–20 ms; the ÷4
# kinds: 40–130 ms; PDSL's ÷16: 300–450 ms, and its formal rows audit twice): a row's trials
# are a pure function of the ledger's configuration, whatever the machine or its load.
TRIAL_DIVISORS: dict[str, int] = {
    "dp-cga-model": 4,
    "dp-cga-half-model": 4,
    "dsgt-model": 4,
    "lppa-model": 4,
    "lppa-gt": 4,
    "lppa-noise": 4,
    "dp-dsgt-model": 4,
    "pdsl-model": 16,
    "pdsl-mm": 16,
    "pdsl-half-model": 16,
}
CANDIDATES = 5  # the canary search's candidates per kind (privaudit.eval.canaries.candidates)
CONFIDENCE = 0.95
ROUND = 1  # the audited round: white-box audits of round 1 need no training
THREAT = "link"  # the weakest adversary: one curious link, the victim's first receiver
CLAIM_WIDTH = 44  # characters of the paper's claim shown in the table (the rest: a note)
# the final-model audit of each defense (--final-model), at privaudit audit --observe final's
# defaults: its trials, the rounds of its run, the victim, whose final model it reads (the
# victim's first neighbour) and the batches every trial uses (the run's own); a test keeps
# FINAL_TRIALS equal to final_model_audit's default
FINAL_TRIALS = 2000
FINAL_ROUNDS = 3
FINAL_VICTIM = 0
FINAL_OBSERVER = "agent"
FINAL_BATCHES = "run"


# -- the plan -------------------------------------------------------------------------------
def select(defenses: list[str] | None = None, targets: list[str] | None = None) -> list[str]:
    """The ledger's targets in registry order: every kind of the ``defenses`` plus the
    ``targets`` (entries may hold several names, comma-separated); all when both are empty."""

    def names(entries: list[str] | None) -> list[str]:
        return [n.strip() for e in entries or [] for n in e.split(",") if n.strip()]

    every = all_targets()
    ds, ts = names(defenses), names(targets)
    for d in ds:
        if d not in DEFENSES:
            raise unknown("defense", d, DEFENSES)
    for t in ts:
        if t not in every:
            raise unknown("target", t, every)
    if (defenses or targets) and not (ds or ts):
        raise PrivauditError("--defense/--target need at least one name")
    if not (ds or ts):
        return list(every)
    return [t for t, (d, _, _) in every.items() if d.name in ds or t in ts]


def run_config(base: RunConfig, defense: str) -> RunConfig:
    """``base`` for ``defense``: its own topology when the base keeps the default one (the
    push-sum defenses need theirs), and enough rounds for every kind's round-1 audit."""
    d = get_defense(defense)
    topology = d.topology_for(None if base.topology == RunConfig.topology else base.topology)
    need = max(max(d.rounds_needed(k, ROUND, base.agents)) for k in d.kinds)
    cfg = dataclasses.replace(
        base, defense=defense, topology=topology, rounds=max(base.rounds, need)
    )
    return cfg.validate()


def privacy_facts(privacy: Any) -> dict[str, Any]:
    """A Privacy's fields as data (its functions — σ(ε) rule, pairwise bounds — left out)."""
    facts = {f.name: getattr(privacy, f.name) for f in dataclasses.fields(privacy)}
    return {k: v for k, v in facts.items() if not callable(v)}


def row_trials(target: str, trials: int, need: int) -> int:
    """The trials of ``target``'s row: ``trials`` (--trials) divided by the target's entry
    in :data:`TRIAL_DIVISORS` (1 where it has none), never fewer than ``need`` (the fewest
    any bound needs, :func:`~privaudit.experiments.audit.check_trials`): fixed before the
    study, the same on every machine and under any load."""
    return max(need, trials // TRIAL_DIVISORS.get(target, 1))


@functools.cache
def search_needs(k: int, delta: float, confidence: float) -> int:
    """The fewest trials whose white-box audit searches ``k`` canary candidates (1 for
    k = 1): :func:`~privaudit.experiments.audit.search_size`, which grows with the trials,
    gives a smaller budget fewer (the first of each kind's priority order), down to one
    canary and no search at all — what a ledger of fewer trials must say it did."""
    hi = 1
    while search_size(k, hi, delta, confidence) < k:
        hi *= 2
    lo = hi // 2  # too few (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if search_size(k, mid, delta, confidence) >= k else (mid, hi)
    return hi


def plan(
    targets: list[str], trials: int, delta: float, confidence: float
) -> dict[str, dict[str, int]]:
    """Each row's budget, fixed before the study: its trials (:func:`row_trials`) and how
    many of its :data:`CANDIDATES` canary candidates those let the audit search (1: no
    search). Raises the one-line error of a ``trials`` too few for any bound."""
    need = check_trials(trials, delta, confidence)
    out = {}
    for t in targets:
        n = row_trials(t, trials, need)
        out[t] = {"trials": n, "canaries": search_size(CANDIDATES, n, delta, confidence)}
    return out


def budget_warnings(trials: int, delta: float, confidence: float) -> list[str]:
    """What ``trials`` per row cannot do that the default does, one line each (the CLI prints
    them before the study; the setting line states the same): too few for the canary search,
    every row audits the first candidate of its kind alone. Raises the error of a ``trials``
    too few for any bound."""
    check_trials(trials, delta, confidence)
    two, every = (search_needs(k, delta, confidence) for k in (2, CANDIDATES))
    if trials >= two:
        return []
    return [
        f"--trials {trials} is too few for the canary search (it needs {two} for 2 "
        f"candidates, {every} for all {CANDIDATES}): every row audits the first candidate of "
        "its kind alone, and the setting line says so"
    ]


# -- one row ------------------------------------------------------------------------------------
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
    audit ``res`` against each; ``verdict`` is the most severe (a claim is refuted when any
    of its promises is), ``epsilon_lo`` the lower bound it rests on.

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
            real = audits.checked(audits.once(res["trials"], shape="real"), "real")
    except RunStopped:  # a stop request is not this row's failure
        raise
    except PrivauditError as e:
        out["error"] = str(e)
        return out
    out.update(
        audit=_evidence(res, first, trials),
        upper=res["upper"],
        verdicts=res["verdicts"],
        real=None if real is None else _real(*real),
        claim=claim_verdict(res, privacy.assumption),
        accounting={
            "epsilon": res["upper"]["accountant"],
            "verdict": res["verdicts"]["accountant"],
            "sample_rate": res["accounting"]["sample_rate"],
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
    ) -> dict[str, Any]:
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
        if res["interrupted"]:  # Ctrl-C between trials: the row is not finished
            raise KeyboardInterrupt
        return res

    def checked(
        self, res: dict[str, Any], shape: str | None = None
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """``res``, or where it finds a bound violated, a second audit at the Bonferroni
        level (and the first, as the screening)."""
        if self.family == 1 or "violated" not in res["verdicts"].values():
            return res, None
        level = 1 - (1 - self.confidence) / self.family
        again = bounds.trials_needed(self.run.cfg.delta, 1 - (1 - level) / 2, HELD_OUT)
        first = {k: res[k] for k in ("epsilon_lo", "trials", "confidence", "verdicts")}
        return self.once(max(res["trials"], again), level, 1, shape), first


def _evidence(res: dict[str, Any], first: dict[str, Any] | None, trials: int) -> dict[str, Any]:
    """A row's ``audit``: the white-box audit's bound, its power (trials, the canaries
    searched) and the canary that gave it; ``first``: the screening audit a violation sent
    the row past; ``trials``: the row's budget."""
    cp = res["clopper_pearson"]
    return {
        "epsilon_lo": res["epsilon_lo"],
        "capped": bool(cp["capped"]) and cp["epsilon_lo"] >= res["epsilon_lo"],
        "clopper_pearson": cp["epsilon_lo"],
        "gdp": res.get("gdp", {}).get("epsilon_lo"),
        "trials": res["trials"],
        "trials_asked": trials,
        # how many canary candidates the audit searched (1: none, its first alone)
        "searched": len(res["search"]["candidates"]),
        "confidence": res["confidence"],
        "screening": first,  # the first audit, when a violation sent the row to a second
        "round": res["round"],
        "threat": res["threat"],
        "victim": res["victim"],
        "receiver": res["receiver"],
        "copies": res["copies"],
        "canary": res["canary"],
        # every searched canary: its gradient norm and bound (claim_verdict reads them)
        "candidates": [
            {k: c[k] for k in ("kind", "norm", "impact", "epsilon_lo")}
            for c in res["search"]["candidates"]
        ],
    }


def _real(res: dict[str, Any], first: dict[str, Any] | None) -> dict[str, Any]:
    """A row's ``real``: the input-space audit (a real example as the canary)."""
    return {
        "epsilon_lo": res["epsilon_lo"],
        "trials": res["trials"],
        "confidence": res["confidence"],
        "screening": first,
        "norm": res["canary"]["norm"],
        "impact": res["canary"]["impact"],
        "verdict": res["verdicts"]["accountant"],
    }


# -- the final models (--final-model) ----------------------------------------------------------
def final_config(base: RunConfig, defense: str) -> RunConfig:
    """The run of ``defense``'s final-model audit: the ledger's run of it (:func:`run_config`:
    its own topology where it needs one) over :data:`FINAL_ROUNDS` rounds, the run ``privaudit
    audit --observe final`` trains when --rounds is not given (σ calibrated over those rounds
    unless --sigma sets it: each trial re-simulates all of them)."""
    return dataclasses.replace(run_config(base, defense), rounds=FINAL_ROUNDS).validate()


def final_target(run: Any) -> str:
    """The target whose facts the final-model audit of ``run``'s defense reads: the defense's
    first formal kind (registry order), whose clip is the one its guarantee rests on, so the
    canary is a worst case for it; its first kind where none is formal. The audit observes the
    final models and is accounted over every kind; the target sizes its canary (a Dirac of the
    kind's clip) and says whether the scores can be exactly Gaussian."""
    kinds = run.resolved["kinds"]
    formal = [k for k in run.defense.kinds if kinds[k]["formal"]]
    return f"{run.defense.name}-{(formal or list(run.defense.kinds))[0]}"


def final_setting(trials: int, delta: float, confidence: float, seed: int) -> dict[str, Any]:
    """What every defense's final-model audit is computed on, stated in the output (and in
    each result's cache key); raises the one-line error of ``trials`` too few for any bound."""
    check_trials(trials, delta, confidence, flag="--final-model-trials", audit="final-model")
    return {
        "mode": "final models",
        "rounds": FINAL_ROUNDS,
        "target": "first formal kind",  # the defense's (else its first kind): final_target
        "canary": "dirac",  # of the target's clip, in the victim's update in every round
        "victim": FINAL_VICTIM,
        "observer": FINAL_OBSERVER,
        "batches": FINAL_BATCHES,
        "trials": trials,
        "confidence": confidence,
        "seed": seed,
    }


def final_result(
    run: Any,
    trials: int = FINAL_TRIALS,
    confidence: float = CONFIDENCE,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """The final-model audit of ``run``'s defense (:func:`final_target`) on ``trials``
    re-simulations of the run, as the ledger shows it: the ε lower bound, the accounted ε of
    the mechanism it ran (the canary in every round, sample rate 1: ``upper``) and the
    verdict (``violated`` also where the trade-off curve's μ bound beats the accounted μ),
    or ``error`` set where it cannot be made. A Ctrl-C between trials raises."""
    target = final_target(run)
    out: dict[str, Any] = {
        "defense": run.defense.name,
        "target": target,
        "rounds": run.cfg.rounds,
        "sigma": run.resolved["sigma"],
        "error": None,
    }
    try:
        res = final_model_audit(
            run,
            target,
            trials,
            confidence,
            observer=FINAL_OBSERVER,
            victim=FINAL_VICTIM,
            batches=FINAL_BATCHES,
            seed=seed,
            progress=progress,
        )
    except RunStopped:  # a stop request is not this audit's failure
        raise
    except PrivauditError as e:
        out["error"] = str(e)
        return out
    if res["interrupted"]:  # Ctrl-C between trials: the audit is not finished
        raise KeyboardInterrupt
    cp = res.get("clopper_pearson") or {}
    out.update(
        epsilon_lo=res["epsilon_lo"],
        capped=bool(cp.get("capped")) and cp.get("epsilon_lo", -1.0) >= res["epsilon_lo"],
        clopper_pearson=cp.get("epsilon_lo"),
        gdp=res.get("gdp", {}).get("epsilon_lo"),
        exact=res["exact"],
        trials=res["trials"],
        confidence=res["confidence"],
        upper=res["upper"]["accountant"],
        upper_claimed=res["upper"].get("paper's count"),
        verdicts=res["verdicts"],
        mu=res["mu"],
        verdict=res["verdict"],
        victim=res["victim"],
        observed=res["observed"],
        distance=res["distance"],
        batches=res["batches"],
        statistic=res["statistic"],
        canary=res["canary"],
        no_guarantee=res["accounting"]["no_guarantee"],
        run_epsilon=res["accounting"]["run"],  # at the run's rate q: stated, not compared
        sample_rate=res["accounting"]["sample_rate"],
    )
    return out


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


# -- the ledger ---------------------------------------------------------------------------------
class Interrupted(KeyboardInterrupt):
    """Ctrl-C during the ledger; ``ledger`` holds the rows finished before it."""

    def __init__(self, ledger: dict[str, Any]) -> None:
        super().__init__()
        self.ledger = ledger


@dataclasses.dataclass
class ClaimsLedger:
    """The ledger document (:func:`ledger`), typed: what every row was computed on
    (:func:`setting`), each defense's topology and σ, the rows in registry order (while the
    ledger is computed, a :class:`RowJob` holds the place of a row computed elsewhere),
    whether every row is done, the seconds it took (None where the document leaves them
    out, as the :func:`public` one does) and, with ``--final-model``, each defense's
    final-model audit (:func:`final_result`; None without: the document has no such key).

    :meth:`to_dict` is the document as :func:`ledger` returns it and :func:`write` writes it,
    key for key and in the same order; :meth:`from_dict` reads one back. Both share the
    values (the rows, the setting) rather than copy them."""

    setting: dict[str, Any]
    topologies: dict[str, str]
    sigma: dict[str, float]
    rows: list[Any]
    complete: bool
    seconds: float | None = None
    final_model: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ledger document: ``seconds`` only where it is known, ``final_model`` only
        where the ledger has the column."""
        doc = {
            "setting": self.setting,
            "topologies": self.topologies,
            "sigma": self.sigma,
            "rows": self.rows,
        }
        if self.final_model is not None:
            doc["final_model"] = self.final_model
        doc["complete"] = self.complete
        if self.seconds is not None:
            doc["seconds"] = self.seconds
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ClaimsLedger:
        """The ledger of a document :meth:`to_dict` (or :func:`ledger`) made, e.g. read from
        ``ledger.json``: one that lacks a key other than ``seconds`` and ``final_model``,
        or holds one it does not know (which :meth:`to_dict` would drop), is refused."""
        known = [f.name for f in dataclasses.fields(cls)]
        optional = ("seconds", "final_model")
        wrong = [f"no {k!r}" for k in known if k not in doc and k not in optional]
        wrong += [f"unknown key {k!r}" for k in sorted(set(doc) - set(known))]
        if wrong:
            raise PrivauditError(f"not a claims ledger: {', '.join(wrong)}")
        return cls(**{k: doc[k] for k in known if k in doc})


def setting(
    base: RunConfig,
    trials: int,
    confidence: float,
    seed: int,
    targets: list[str],
) -> dict[str, Any]:
    """What every row was computed on, stated in the output: the configuration, and the
    audit's setting with each row's budget (:func:`plan`) and what the canary search needs."""
    delta = base.delta
    return {
        "agents": base.agents,
        "topology": base.topology,
        "dataset": base.dataset,
        "model": base.model,
        "batch_size": base.batch_size,
        "rounds": base.rounds,
        "epsilon": base.epsilon,
        "sigma": base.sigma,
        "delta": delta,
        "accountant": base.accountant,
        "params": dict(base.params),
        "seed": base.seed,
        "adjacency": ADJACENCY,
        "sampling": SAMPLING,
        "audit": {
            "mode": "white-box",
            # the audit's default (privaudit/experiments/audit.py: candidates): in the key
            "canary": "search",
            "real": "example",  # the input-space audit of every formal kind, beside it
            "round": ROUND,
            "threat": THREAT,
            "victim": 0,
            "trials": trials,  # --trials: each row's own are in the plan
            "plan": plan(targets, trials, delta, confidence),
            # the trials a search of k candidates needs (k = 2: any search at all)
            "search": {
                "candidates": CANDIDATES,
                "needs": {
                    str(k): search_needs(k, delta, confidence) for k in range(2, CANDIDATES + 1)
                },
            },
            "confidence": confidence,
            "family": len(targets),
            "seed": seed,
        },
    }


class RowCache(Protocol):
    """Where finished rows are kept and read back (``OUT/rows``): a value cached with its
    key, verified on read — its checksum, the code that computed it, the key — and None
    (after one line saying why) where it does not check out. :mod:`privaudit.api.cache`
    is one; this layer may not import it, so the caller passes it."""

    def read_value(self, path: Path, key: Any) -> Any | None: ...

    def write_value(self, path: Path, key: Any, value: Any) -> None: ...


def ledger(
    base: RunConfig,
    out: str | Path,
    targets: list[str] | None = None,
    trials: int = TRIALS,
    confidence: float = CONFIDENCE,
    seed: int = 0,
    fresh: bool = False,
    progress: bool = True,
    run_rows: RowRunner | None = None,
    cache: RowCache | None = None,
    final_trials: int | None = None,
) -> dict[str, Any]:
    """A row per target (default: every target, :func:`select`) on ``base``'s configuration
    (each defense with :func:`run_config`), each on its budget of trials (:func:`plan`,
    fixed here, before any row runs). Runs live in ``OUT/runs``; with a ``cache``, finished
    rows are kept in ``OUT/rows`` and reused (unless ``fresh``) when they check out. Ctrl-C
    raises :class:`Interrupted` carrying the rows finished so far (each already cached).

    ``run_rows``: compute the rows not cached elsewhere, all at once (e.g. as Ray tasks:
    ``privaudit claims --executor ray``), instead of here one after the other; a row that
    could not finish is reported and, once the others are done, raised.

    ``final_trials``: also audit each defense's final models on that many trials
    (:func:`final_result`, on its run of :func:`final_config`; here, after its rows), cached
    in ``OUT/final-models`` as the rows are; None (the default): no such audit, and the
    document is what it was before the column existed.

    Returns the ledger document (:meth:`ClaimsLedger.to_dict`)."""
    targets = targets or select()
    doc = ClaimsLedger(
        setting=setting(base, trials, confidence, seed, targets),  # refuses too few trials
        topologies={},
        sigma={},
        rows=[],
        complete=False,
    )
    if final_trials is not None:  # refuses too few trials, before any work
        doc.setting["final_model"] = final_setting(final_trials, base.delta, confidence, seed)
        doc.final_model = {}
    by_defense: dict[str, list[str]] = {}
    for t in targets:
        tg = Target.parse(t)
        by_defense.setdefault(tg.defense.name, []).append(tg.kind)
    configs = {n: run_config(base, n) for n in by_defense}
    doc.topologies = {n: c.topology for n, c in configs.items()}
    study = _Study(doc, Path(out), cache, fresh, progress, run_rows is not None)
    t0 = time.perf_counter()
    finals = 0 if final_trials is None else len(by_defense)
    bar, task = _bar(len(targets) + finals, progress and run_rows is None)
    with bar, interrupts_noted() as interrupted:
        try:
            for name, kinds in by_defense.items():
                run = study.run(name, configs[name])
                for kind in kinds:
                    bar.update(task, description=f"claims {run.defense.name}-{kind}")
                    study.add(run, kind, interrupted)
                    bar.advance(task)
                if final_trials is not None:
                    bar.update(task, description=f"claims {name}: final models")
                    study.final(name, final_config(base, name), interrupted)
                    bar.advance(task)
            if study.jobs and run_rows is not None:
                _run_elsewhere(study, run_rows, len(targets) - len(study.jobs), progress)
        except (KeyboardInterrupt, RunStopped):  # RunStopped: a run's own stop request
            doc.rows = [r for r in doc.rows if not isinstance(r, RowJob)]
            doc.seconds = round(time.perf_counter() - t0, 1)
            raise Interrupted(doc.to_dict()) from None
    doc.complete = True
    doc.seconds = round(time.perf_counter() - t0, 1)
    return doc.to_dict()


@dataclasses.dataclass
class _Study:
    """A ledger being computed: its document, where its runs and rows live, the row cache
    (None: none), whether cached rows are ignored (``fresh``), whether to draw the audits'
    bars, and whether rows are computed elsewhere (``remote``: :attr:`jobs` collects them)."""

    doc: ClaimsLedger
    out: Path
    cache: RowCache | None
    fresh: bool
    progress: bool
    remote: bool
    jobs: list[RowJob] = dataclasses.field(default_factory=list)

    def run(self, name: str, cfg: RunConfig) -> Run:
        """The run of defense ``name`` on ``cfg``, in ``OUT/runs``; its σ noted."""
        try:
            run = Run.create(cfg, self.out / "runs" / f"{name}-{digest(cfg.identity())}")
        except PrivauditError as e:
            raise PrivauditError(f"{name}: {e}") from None
        self.doc.sigma[name] = run.resolved["sigma"]
        return run

    def add(self, run: Run, kind: str, interrupted: InterruptNote) -> None:
        """Put ``kind``'s row in the ledger: read from the cache, computed here, or (remote)
        a :class:`RowJob` in its place, computed later; ``interrupted``: whether Ctrl-C cut
        the row's audit short (a row of fewer trials than asked is neither kept nor
        followed)."""
        a = self.doc.setting["audit"]
        target = f"{run.defense.name}-{kind}"
        trials = a["plan"][target]["trials"]
        privacy = run.defense.privacy(run.params, kind, run.ctx.W.cpu(), 0)
        # the row's own setting: the ledger's without the other rows' budgets, with its own
        audit_key = {**{k: v for k, v in a.items() if k != "plan"}, "trials": trials}
        key = [run.cfg.identity(), run.resolved["kinds"][kind], privacy_facts(privacy), audit_key]
        path = self.out / "rows" / f"{target}-{digest(key)}.json"
        r = None if self.fresh or self.cache is None else self.cache.read_value(path, key)
        if r is not None:
            self.doc.rows.append({**r, "cached": True})
            return
        if self.remote:
            rdir = str(Path(run.dir.path).resolve())
            job = RowJob(target, kind, run.cfg, rdir, str(path), key, trials, *self._audit())
            self.jobs.append(job)
            self.doc.rows.append(job)  # its place, filled when it is done
            return
        # the audit's own bar per trial, under the row bar: on a terminal only (elsewhere
        # each nested bar leaves an empty line on stdout)
        inner = self.progress and sys.stdout.isatty()
        confidence, seed, family = self._audit()
        r = row(run, kind, trials, confidence, seed, inner, family)
        if interrupted.seen:
            raise KeyboardInterrupt
        self.keep(path, key, r)
        self.doc.rows.append(r)

    def final(self, name: str, cfg: RunConfig, interrupted: InterruptNote) -> None:
        """Put defense ``name``'s final-model audit (:func:`final_result`) on its run of
        ``cfg`` in the ledger: read from ``OUT/final-models`` or computed here (and kept
        there), keyed by everything it depends on — the run's configuration, every kind's
        resolved accounting and mechanism facts, the audit's setting and its target."""
        f = self.doc.setting["final_model"]
        if self.doc.final_model is None:
            self.doc.final_model = {}
        results = self.doc.final_model
        try:
            run = Run.create(cfg, self.out / "runs" / f"{name}-{digest(cfg.identity())}")
        except PrivauditError as e:  # this column's failure, not the ledger's
            results[name] = {"defense": name, "target": None, "error": str(e)}
            return
        target, W = final_target(run), run.ctx.W.cpu()
        facts = {
            k: privacy_facts(run.defense.privacy(run.params, k, W, f["victim"]))
            for k in run.defense.kinds
        }
        key = [cfg.identity(), run.resolved["kinds"], facts, f, target]
        path = self.out / "final-models" / f"{name}-{digest(key)}.json"
        r = None if self.fresh or self.cache is None else self.cache.read_value(path, key)
        if r is not None:
            results[name] = {**r, "cached": True}
            return
        inner = self.progress and sys.stdout.isatty()
        r = final_result(run, f["trials"], f["confidence"], f["seed"], inner)
        if interrupted.seen:
            raise KeyboardInterrupt
        self.keep(path, key, r)
        results[name] = r

    def _audit(self) -> tuple[float, int, int]:
        """The audit's confidence, seed and family (the number of rows)."""
        a = self.doc.setting["audit"]
        return a["confidence"], a["seed"], a["family"]

    def keep(self, path: str | Path, key: Any, r: dict[str, Any]) -> None:
        """Cache the finished row (or final-model audit) ``r``, not one whose audit could
        not be made."""
        if r["error"] is None and self.cache is not None:
            self.cache.write_value(Path(path), key, r)


def _run_elsewhere(study: _Study, run_rows: RowRunner, cached: int, progress: bool) -> None:
    """Compute ``study``'s jobs through ``run_rows``, cache each row and put it in its place
    in the ledger; report each job that could not finish as it happens, and raise once all
    are done."""
    doc, jobs = study.doc, study.jobs
    done = 0
    failed: list[str] = []
    for job, r in run_rows(jobs, cached, progress):
        if isinstance(r, str):
            failed.append(f"{job.target}: {r}")
            print(f"failed: {job.target}: {r}", file=sys.stderr)
        else:
            done += 1
            study.keep(job.path, job.key, r)
            place = next(i for i, x in enumerate(doc.rows) if x is job)
            doc.rows[place] = r
    if failed:
        doc.rows = [r for r in doc.rows if not isinstance(r, RowJob)]
        raise PrivauditError(
            f"{len(failed)} of {len(jobs)} rows failed (each line above); the {done} "
            "finished are kept in OUT/rows: fix the cause and run the same command again"
        )


def _bar(total: int, enabled: bool) -> tuple[Any, Any]:
    """The ledger's bar over its rows (and its task), with the time elapsed."""
    return progress(total, "claims", enabled, elapsed=True)


def public(doc: dict[str, Any]) -> dict[str, Any]:
    """The ledger as it is written and printed: what was computed, without how long it took
    or where each row and final-model audit came from (this run or the cache), so that it is
    the same, byte for byte, wherever, under whatever load and however often it is computed."""
    rows = [
        r if isinstance(r, RowJob) else {k: v for k, v in r.items() if k != "cached"}
        for r in doc["rows"]
    ]
    out = {**{k: v for k, v in doc.items() if k != "seconds"}, "rows": rows}
    if "final_model" in doc:
        out["final_model"] = {
            name: {k: v for k, v in f.items() if k != "cached"}
            for name, f in doc["final_model"].items()
        }
    return out


def write(doc: dict[str, Any], out: str | Path, markdown_path: str | Path | None = None) -> None:
    """``OUT/ledger.json`` and ``OUT/claims.md``, and the markdown at ``markdown_path``: the
    :func:`public` ledger."""
    out = Path(out)
    doc = public(doc)
    write_json(out / "ledger.json", to_jsonable(doc))
    text = markdown(doc)
    for path in [out / "claims.md", *([Path(markdown_path)] if markdown_path else [])]:
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))
