"""The claims ledger's final-model column (``privaudit claims --final-model``): each
defense's final-model audit (:func:`privaudit.experiments.final_audit.final_model_audit`),
the hidden-state adversary of Cebere et al. (ICLR 2025), who sees only the final models and
plants a gradient canary in the victim's update in every round, on the defense's run over
:data:`FINAL_ROUNDS` rounds (:func:`final_config`), its canary that of the defense's first
formal kind (:func:`final_target`). The ledger states its setting (:func:`final_setting`),
puts the result on every row of the defense (:func:`final_result`) and keeps it under
``OUT/final-models`` as it keeps the rows (:class:`FinalModels`).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from privaudit.core.config import RunConfig
from privaudit.core.errors import Interrupted as RunStopped
from privaudit.core.errors import PrivauditError
from privaudit.core.files import digest
from privaudit.core.interrupts import InterruptNote
from privaudit.experiments.audit import check_trials
from privaudit.experiments.claims_cache import Kept
from privaudit.experiments.claims_plan import CONFIDENCE, privacy_facts, run_config
from privaudit.experiments.final_audit import final_model_audit
from privaudit.sim.run import Run

# the final-model audit of each defense (--final-model), at privaudit audit --observe final's
# defaults: its trials, the rounds of its run, the victim, whose final model it reads (the
# victim's first neighbour) and the batches every trial uses (the run's own); a test keeps
# FINAL_TRIALS equal to final_model_audit's default
FINAL_TRIALS = 2000
FINAL_ROUNDS = 3
FINAL_VICTIM = 0
FINAL_OBSERVER = "agent"
FINAL_BATCHES = "run"


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
class FinalModels:
    """A ledger's final-model audits: on its ``setting`` (:func:`final_setting`), each on a
    run in ``OUT/runs`` (``out``), kept in ``OUT/final-models`` (``kept``), the audit's own
    bar drawn where ``progress`` is asked on a terminal."""

    setting: dict[str, Any]
    out: Path
    kept: Kept
    progress: bool

    def result(self, name: str, cfg: RunConfig, interrupted: InterruptNote) -> dict[str, Any]:
        """Defense ``name``'s final-model audit (:func:`final_result`) on its run of ``cfg``:
        read from ``OUT/final-models`` or computed here (and kept there), keyed by everything
        it depends on — the run's configuration, every kind's resolved accounting and
        mechanism facts, the audit's setting and its target. A run that cannot be made is
        this column's error, not the ledger's; ``interrupted``: whether Ctrl-C cut the audit
        short (an audit of fewer trials than asked is neither kept nor returned)."""
        f = self.setting
        try:
            run = Run.create(cfg, self.out / "runs" / f"{name}-{digest(cfg.identity())}")
        except PrivauditError as e:  # this column's failure, not the ledger's
            return {"defense": name, "target": None, "error": str(e)}
        target, W = final_target(run), run.ctx.W.cpu()
        facts = {
            k: privacy_facts(run.defense.privacy(run.params, k, W, f["victim"]))
            for k in run.defense.kinds
        }
        key = [cfg.identity(), run.resolved["kinds"], facts, f, target]
        path = self.out / "final-models" / f"{name}-{digest(key)}.json"
        r = self.kept.read(path, key)
        if r is not None:
            return {**r, "cached": True}
        inner = self.progress and sys.stdout.isatty()
        r = final_result(run, f["trials"], f["confidence"], f["seed"], inner)
        if interrupted.seen:
            raise KeyboardInterrupt
        self.kept.keep(path, key, r)
        return r
