"""The final-model audit: an adversary who sees only the models a run ships.

The white-box and one-run audits (:mod:`privaudit.experiments.audit`) score the messages a
defense sends. Users ship models, not transcripts. Here the adversary sees only the final
models after round T — the hidden-state threat model of Cebere, Bellet & Papernot ("Tighter
Privacy Auditing of DP-SGD in the Hidden State Threat Model", ICLR 2025) — and is allowed
what their strongest adversary has: a crafted gradient canary inserted into the victim's
update in *every* round.

One trial re-simulates the whole run, rounds 1..T, with the run's own round loop
(:class:`~privaudit.sim.loop.RoundLoop` over a :class:`~privaudit.core.network.SimNetwork`:
a copy of the run, :mod:`privaudit.sim.copies`) from the run's initial state:

- **the canary** (:class:`~privaudit.experiments.canary_grads.CanaryGrads`): a Dirac gradient
  c = N·e_k on one coordinate k (drawn from the audit seed), N the clip C for a per-example
  clip (Nasr et al. 2023's worst case: its clipped contribution is C·e_k), added to the
  victim's batch as one extra example in every round 1..T, clipped by the defense's own
  clip and noised with the rest: the victim's update of round t carries clip_C(c)/B;
- **fixed batches** (:data:`BATCHES`): every trial uses the same batch per round — ``run``:
  the run's own realised Poisson batches (the run replayed once from its seeds, as
  :meth:`~privaudit.sim.run.Run.simulate` draws them); ``empty``: no example in any
  agent's batch (the canary alone). DP holds for every pair of adjacent datasets, so the
  empty one is a legitimate worst case, the one where the gradient-canary adversary
  controls every other gradient;
- **fresh noise**: each trial reseeds the agents' generators (trial i's own noise), and a
  fair coin decides whether the canary is present (add/remove adjacency). So only the
  canary and the noise differ between trials.

The observation (:data:`OBSERVERS`) is the final model x^T of one ``agent`` (default: the
victim's lowest-numbered neighbour), a ``coalition``'s models stacked, or the ``average`` of
every agent's model. The statistic is the projection of the observation on the canary's
mean shift Δ, measured on :data:`~privaudit.experiments.audit_trials.SHIFT_PAIRS` paired trials
(the same noise with and without the canary) that are never scored; for a coalition, whose
models mix every agent's noise, the whitened direction Σ⁺Δ
(:func:`~privaudit.experiments.audit_stats.gls_direction`), the likelihood-ratio statistic of a
Gaussian shift.

**When the observation is exactly Gaussian.** D-PSGD with noised gradients (``dp-dpsgd``)
runs x^t = W(x^{t-1} − η(g_t + c_t + ζ_t)), so x^T = W^T x_0 − η Σ_{t=1}^T W^{T−t+1}
(g_t + c_t + ζ_t), with c_t the victim's canary row and ζ_t the noise. x^T is affine in the
noise when g_t does not depend on the trajectory: with ``empty`` batches (g_t = 0) and a
defense that states a linear recursion (:meth:`~privaudit.defenses.base.Defense.recursion`).
The scores are then Gaussian with one variance, in or out, and the Gaussian-DP estimate
applies beside Clopper–Pearson. With the run's batches a real example's gradient is
evaluated at a model that carries the earlier rounds' noise, so x^T is not affine in it:
Clopper–Pearson alone.

**Bounds** (:func:`~privaudit.experiments.audit_stats.white_box_bounds`, the white-box audit's):
the ε lower bound — Clopper–Pearson at a threshold chosen on held-out trials, and the
Gaussian-DP estimate where exact — at 1 − α/2; beside it the trade-off curve's band and the
μ it rules out (:func:`privaudit.eval.fdp.mu_lower_bound`, valid for any score
distribution) at 1 − α/2: the two tests hold together at 1 − α.

**Upper bounds.** The canary is present in every round, deterministically: the audited
mechanism is not subsampled, whatever the run's rate q. Its T rounds of r Gaussian
releases at multiplier z compose, at sample rate 1, into one Gaussian mechanism at
z/√(T·r), i.e. μ = √(T·r)/z Gaussian DP (Dong, Roth & Su 2022), and the final models are
post-processing of them (for a formal defense, by the evaluation-point rule). The verdict
is called against that ε (``accountant``: PRV at sample rate 1) and, where every kind is a
formal Gaussian one, against that μ (``mu``: the band's μ lower bound). The run's own ε, at
its rate q (as it reports it), is stated beside, not compared: a canary that joins every
round is not the example q accounts for. The two coincide in kind at q = 1
(``--sampling full``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from privaudit.core import sampling, text
from privaudit.core.accounting import ADJACENCY, kind_epsilon, release_epsilon
from privaudit.core.errors import PrivauditError
from privaudit.eval.canaries import candidates, check_canary, make_canaries
from privaudit.experiments.audit_stats import (
    check_trials,
    gls_direction,
    verdict,
    white_box_bounds,
)
from privaudit.experiments.audit_trials import SHIFT_PAIRS, reseed
from privaudit.experiments.canary_grads import CanaryGrads, audit_batch
from privaudit.scenario.topology import distances
from privaudit.sim.copies import Batch, Copy
from privaudit.sim.run import Run
from privaudit.sim.targets import Target

SAMPLING = "none: the canary joins the victim's update in every round 1..T (sample rate 1)"


# -- what the adversary observes ------------------------------------------------------------
@dataclass(frozen=True)
class ObserverKind:
    """One observation of the final models: ``members(adj, victim, attackers)`` picks the
    agents whose final models it reads (or refuses the ``attackers`` given), ``view(x, m)``
    makes it from the final models x (n, D) and those members, flat; ``stacked``: it is
    the members' models stacked (their noise correlated, so the statistic is whitened)."""

    describe: str
    members: Callable[[Tensor, int, list[int] | None], list[int]]
    view: Callable[[Tensor, list[int]], Tensor]
    stacked: bool = False


def _neighbours(adj: Tensor, victim: int) -> list[int]:
    return [int(j) for j in torch.nonzero(adj[victim]).flatten()]


def _one_agent(adj: Tensor, victim: int, attackers: list[int] | None) -> list[int]:
    if attackers is not None and len(attackers) != 1:
        raise PrivauditError(
            f"the agent observer reads one agent's model, got --attacker {attackers}; "
            "use --observer coalition for several"
        )
    return list(attackers) if attackers else _neighbours(adj, victim)[:1]


def _coalition(adj: Tensor, victim: int, attackers: list[int] | None) -> list[int]:
    return sorted(attackers) if attackers else _neighbours(adj, victim)


def _everyone(adj: Tensor, victim: int, attackers: list[int] | None) -> list[int]:
    if attackers:
        raise PrivauditError(
            "the average observer reads every agent's model; drop --attacker, or use "
            "--observer agent or coalition"
        )
    return list(range(len(adj)))


OBSERVERS: dict[str, ObserverKind] = {
    "agent": ObserverKind("agent {m}'s final model", _one_agent, lambda x, m: x[m[0]]),
    "coalition": ObserverKind(
        "agents {m}'s final models, stacked", _coalition, lambda x, m: x[m].reshape(-1), True
    ),
    "average": ObserverKind(
        "the average of every agent's final model", _everyone, lambda x, m: x.mean(0)
    ),
}


# -- the batches every trial uses ------------------------------------------------------------
def _run_batches(run: Run, replay: Copy) -> list[tuple[Tensor, Tensor]]:
    """The run's own realised batches of rounds 1..T: the run replayed once from its seeds
    (``replay``: a copy of it), sampling then stepping as :meth:`Run.simulate` does (its
    noise drawn in between)."""
    drawn = []

    def sample(t: int) -> Batch:
        index, batch = replay.loop.sample()
        drawn.append(index)
        return batch

    replay.simulate(replay.restore(0), range(1, run.cfg.rounds + 1), batches=sample)
    return [audit_batch(replay.ctx, index) for index in drawn]


def _empty_batches(run: Run, replay: Copy) -> list[tuple[Tensor, Tensor]]:
    """No example in any agent's batch, every round: the canary alone."""
    empty = torch.full((run.ctx.n_held, 1), sampling.PAD, dtype=torch.long)
    return [audit_batch(run.ctx, empty) for _ in range(run.cfg.rounds)]


@dataclass(frozen=True)
class BatchKind:
    """The fixed batches of rounds 1..T (``draw``) and whether, with them, a defense that
    states a linear recursion has final models affine in its noise (``affine``)."""

    describe: str
    draw: Callable[[Run, Copy], list[tuple[Tensor, Tensor]]]
    affine: bool


BATCHES: dict[str, BatchKind] = {
    "run": BatchKind("the run's own realised batches, fixed", _run_batches, False),
    "empty": BatchKind("no example in any batch (the canary alone)", _empty_batches, True),
}


# -- one trial: the whole run re-simulated ---------------------------------------------------
class FinalRerun:
    """Rounds 1..T of ``run`` from its initial state on fixed ``batches`` (one
    :data:`BATCHES` name): a call is one trial, the final models (n, D) in float64 on trial
    ``i``'s noise, with the canary gradient ``canary`` (1, D) in the ``victim``'s batch in
    every round, or without it (None)."""

    def __init__(self, run: Run, victim: int, batches: str, seed: int) -> None:
        ctx = run.ctx
        if ctx.n_held != run.cfg.agents:
            raise PrivauditError("the final-model audit needs a run that holds every agent")
        self.victim, self.seed, self.rounds = victim, seed, run.cfg.rounds
        replay = Copy.of(run.loop)  # nothing on the wire is kept
        self.batches = BATCHES[batches].draw(run, replay)
        self.state0 = run.restore(0)
        self.grads = CanaryGrads(ctx.grads, self.batches[0][0][victim], replay=False)
        self.ctx = dataclasses.replace(ctx, grads=self.grads)
        self.simulation = replay.with_ctx(self.ctx)

    def __call__(self, i: int, canary: Tensor | None) -> Tensor:
        reseed(self.ctx, self.seed * 1_000_003 + i + 2)  # trial i's noise, whatever ran before

        def plant(t: int, batch: Batch) -> None:
            self.grads.victim_x = batch[0][self.victim]  # the victim's rows of round t
            self.grads.start(canary)

        state = self.simulation.simulate(
            dict(self.state0),
            range(1, len(self.batches) + 1),
            batches=lambda t: self.batches[t - 1],
            before=plant,
        )
        return state["x"].double().cpu()


# -- the upper bounds ------------------------------------------------------------------------
def final_accounting(run: Run, victim: int) -> dict[str, Any]:
    """What the final models of ``run`` may reveal of ``victim``'s data, every message kind
    of the defense taken (the final models are built from everything on the wire; per
    agent the run takes the worst kind, as :func:`~privaudit.core.accounting.run_privacy`):

    - ``unamplified``: the T·r releases composed at sample rate 1 (PRV, tight for a
      composition of Gaussians): the mechanism the final-model audit runs, its canary in
      every round; ``unamplified_claimed`` the same at the paper's count;
    - ``mu``: their Gaussian-DP μ = √(T·r)/z where every kind is a formal Gaussian one;
    - ``unamplified_run_accountant``: the same at sample rate 1 by the run's accountant;
    - ``run``: the victim's ε as the run reports it, at its Poisson rate q (amplified):
      stated beside, not what the audit is compared with unless q = 1."""
    T, delta, W = run.cfg.rounds, run.cfg.delta, run.ctx.W.cpu()
    row = run.resolved["agents"][victim]
    facts = {k: run.defense.privacy(run.params, k, W, victim) for k in run.defense.kinds}
    eps, claimed, mus, rdp = [], [], [], []
    for pr in facts.values():
        r, rc = max(pr.releases, 1), max(pr.claimed_releases, 1)
        z = pr.noise_multiplier if pr.formal else 0.0
        eps.append(release_epsilon(z / math.sqrt(T * r), delta))
        claimed.append(release_epsilon(pr.claimed_multiplier / math.sqrt(T * rc), delta))
        rdp.append(kind_epsilon(pr, delta, 1.0, T, run.cfg.accountant))
        gaussian = pr.formal and pr.mechanism == "gaussian" and z > 0
        mus.append(math.sqrt(T * r) / z if gaussian else None)
    informal = [k for k, pr in facts.items() if not pr.formal]
    return {
        "adjacency": ADJACENCY,
        "sampling": SAMPLING,
        "rounds": T,
        "kinds": {k: pr.reason for k, pr in facts.items()},
        "no_guarantee": informal,
        "unamplified": max(eps),
        "unamplified_claimed": max(claimed),
        "mu": None if None in mus else max(mus),
        "unamplified_run_accountant": max(rdp),
        "accountant": run.cfg.accountant,
        "run": row["epsilon"],
        "sample_rate": row["sample_rate"],
        "delta": delta,
    }


# -- the audit -------------------------------------------------------------------------------
def _members(
    run: Run, observer: str, victim: int | None, attackers: list[int] | None
) -> tuple[int, list[int], int]:
    """The victim, the observer's members, and the fewest hops from a member to the victim."""
    if observer not in OBSERVERS:
        raise PrivauditError(f"--observer must be one of {', '.join(OBSERVERS)}, got {observer!r}")
    n, adj = run.cfg.agents, run.ctx.adj.cpu()
    if victim is None:
        victim = min(set(range(n)) - set(attackers or []), default=0)
    members = OBSERVERS[observer].members(adj, victim, attackers)
    if not members:
        raise PrivauditError(f"agent {victim} has no neighbour; name the observers with --attacker")
    hops = distances(adj)[members, victim]
    if not bool((hops >= 0).any()):
        raise PrivauditError(f"agent {victim} cannot be reached from agents {members}")
    return victim, members, int(hops[hops >= 0].min())


def _direction(
    kind: ObserverKind, shift: Tensor, outs: list[Tensor], rows: int
) -> tuple[Tensor, str]:
    """The statistic's direction and name: whitened (Σ⁺Δ) over a stack of several models
    whose noise is correlated, when the noise-only trials estimate Σ well; else Δ/‖Δ‖."""
    if kind.stacked and rows > 1 and (len(outs) - 1) * shift.numel() >= 10 * rows**2:
        return gls_direction(shift, outs, rows), "whitened"
    return shift / shift.norm(), "projection"


def _exact(run: Run, privacy: Any, batches: str) -> bool:
    """Whether the scores are exactly Gaussian with one variance: Gaussian noise of a
    data-independent std, a defense that states a linear recursion, and batches with which
    its final models are affine in the noise (no example: no gradient that depends on the
    trajectory)."""
    if not (BATCHES[batches].affine and privacy.mechanism == "gaussian"):
        return False
    return run.defense.recursion(run.params, run.ctx.W.cpu(), run.cfg.batch_size) is not None


def final_model_audit(
    run: Run,
    target: str | Target,
    trials: int = 2000,
    confidence: float = 0.95,
    *,
    observer: str = "agent",
    attackers: list[int] | None = None,
    victim: int | None = None,
    batches: str = "run",
    canary_norm: float | None = None,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Distinguish "canary in every round" from "no canary" on ``trials`` re-simulations of
    the whole run, from the final models the ``observer`` sees (module docstring): the ε
    lower bound at ``confidence``, the upper bounds of the unamplified mechanism and the
    verdicts. ``target`` names the run's defense (its clip sizes the canary)."""
    delta, alpha = run.cfg.delta, 1 - confidence
    need = check_trials(trials, delta, confidence)
    check_canary(canary_norm, None)
    if batches not in BATCHES:
        raise PrivauditError(f"--batches must be one of {', '.join(BATCHES)}, got {batches!r}")
    tgt = Target.of(target)
    target = tgt.name  # the name, in what is written
    tgt.check_run(run, 1)
    victim, members, d = _members(run, observer, victim, attackers)
    kind = OBSERVERS[observer]
    privacy = tgt.privacy(run, victim)
    canary = candidates(privacy, run.cfg.batch_size, canary_norm, "dirac")[0]
    canary = make_canaries([canary], run.ctx, [], seed)[0]
    grad = canary.grad[None].to(run.ctx.device)
    rerun = FinalRerun(run, victim, batches, seed)
    look = lambda x: kind.view(x, members)  # noqa: E731
    who = kind.describe.format(m=",".join(map(str, members)))
    t0 = time.perf_counter()
    outs = [look(rerun(-2 - p, None)) for p in range(SHIFT_PAIRS)]
    shift = torch.stack([look(rerun(-2 - p, grad)) - o for p, o in enumerate(outs)]).mean(0)
    if not float(shift.norm()) > 0:
        raise PrivauditError(
            f"the canary in agent {victim}'s updates does not reach {who} by round "
            f"{run.cfg.rounds} ({d} hops away); audit at least {max(d, run.cfg.rounds + 1)} "
            "rounds (--rounds) or choose a closer --attacker"
        )
    direction, statistic = _direction(kind, shift, outs, len(members))
    exact = _exact(run, privacy, batches)
    coins = np.random.default_rng(seed + 1).random(trials) < 0.5
    scores, interrupted = _score(rerun, grad, coins, lambda x: float(look(x) @ direction), progress)
    done = len(scores)
    if done < need:
        raise PrivauditError(
            f"interrupted after {done} trials, fewer than the {need} any bound needs; "
            "run the same command again"
        )
    # the ε bound and the trade-off band, each at 1 − α/2: together at 1 − α (Bonferroni)
    found = white_box_bounds(scores, coins[:done], exact, delta, 1 - alpha / 2)
    acc = final_accounting(run, victim)
    res = {
        **found,
        "confidence": confidence,
        "mode": "final",
        "target": target,
        "rounds": run.cfg.rounds,
        "round": run.cfg.rounds,  # the models observed are those after this round
        "threat": f"final models: {who}",
        "trials": done,
        "interrupted": interrupted,
        "victim": victim,
        "observer": observer,
        "attackers": members,
        "observed": who,
        "distance": d,
        "batches": batches,
        "exact": exact,
        "statistic": statistic,
        "canary": {
            "kind": "dirac",
            "norm": canary.norm,
            "coordinate": int(torch.argmax(canary.grad.abs())),
            "rounds": f"every round 1..{run.cfg.rounds}",
            "shift": float(shift.norm()),  # its mean L2 change of the observation
        },
        "seconds": float(f"{time.perf_counter() - t0:.3f}"),
        "raw": {"coin": coins[:done], "score": scores},
    }
    return _judge(res, acc, alpha)


def _score(
    rerun: FinalRerun,
    grad: Tensor,
    coins: np.ndarray,
    score: Callable[[Tensor], float],
    progress: bool,
) -> tuple[np.ndarray, bool]:
    """Trial i with the canary when ``coins[i]``, scored; the scores of the trials run and
    whether a Ctrl-C ended them early."""
    out: list[float] = []
    bar, task = text.progress(len(coins), f"final-model audit, {rerun.rounds} rounds", progress)
    interrupted = False
    with bar:
        try:
            for i, coin in enumerate(coins):
                out.append(score(rerun(i, grad if coin else None)))
                bar.advance(task)
        except KeyboardInterrupt:
            interrupted = True
    return np.asarray(out, dtype=float), interrupted


def _judge(res: dict[str, Any], acc: dict[str, Any], alpha: float) -> dict[str, Any]:
    """The upper bounds of the unamplified mechanism, the verdict against each, and the
    μ test where the mechanism is Gaussian: ``violated`` when either test says so."""
    upper = {"accountant": acc["unamplified"], "paper's count": acc["unamplified_claimed"]}
    verdicts = {k: verdict(res["epsilon_lo"], u) for k, u in upper.items()}
    mu_lo = res["tradeoff"]["mu_lo"]
    mu = {"lower": mu_lo, "upper": acc["mu"], "confidence": 1 - alpha / 2, "verdict": None}
    if acc["mu"] is not None:
        mu["verdict"] = verdict(mu_lo, acc["mu"])
    res["accounting"] = acc
    res["upper"] = upper
    res["verdicts"] = verdicts
    res["mu"] = mu
    res["verdict"] = "violated" if mu["verdict"] == "violated" else verdicts["accountant"]
    return res
