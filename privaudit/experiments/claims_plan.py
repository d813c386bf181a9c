"""The claims ledger's plan (:mod:`privaudit.experiments.claims`), fixed before any row runs:
which targets it has (:func:`select`), each defense's run (:func:`run_config`), each row's
budget of trials and canaries (:func:`plan`, :data:`TRIAL_DIVISORS`), what a budget cannot
do (:func:`budget_warnings`), and the setting the ledger states all of it in (:func:`setting`).

Nothing here runs an audit: every number is a pure function of the ledger's configuration,
the same on every machine and under any load, so that a ledger is the same byte for byte.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from privaudit.core.accounting import ADJACENCY, SAMPLING
from privaudit.core.config import RunConfig
from privaudit.core.errors import PrivauditError, unknown
from privaudit.defenses import DEFENSES, get_defense
from privaudit.experiments.audit import check_trials, search_size
from privaudit.sim.targets import all_targets

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
