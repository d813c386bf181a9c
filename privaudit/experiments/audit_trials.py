"""The audits' trials: the run simulated again with a canary, and each trial scored.

- **white box** (:func:`white_box`): a copy of the run (:mod:`privaudit.sim.copies`) re-runs
  round t, and the rounds a span observes, from the state before it on fixed batches, with
  canary gradients (:class:`~privaudit.experiments.canary_grads.CanaryGrads`) and trial i's
  own noise (:func:`reseed`); a trial's observation is what the adversary's View computes
  (``defense.observe``), or everything a coalition beyond the victim's neighbourhood holds,
  scored along its canary's direction. The canary search's pilot and final phase spend the
  trials as :class:`~privaudit.experiments.audit_stats.SearchPlan` says;
- **one run** (:func:`one_run`): a copy of the whole run from its seeds, its Dirac canaries
  drawn round by round at the victim's sampling rate, each scored over the rounds observed.

The method, its statistics and its references: :mod:`privaudit.experiments.audit`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from privaudit.core import text
from privaudit.core.errors import PrivauditError, Unobservable
from privaudit.core.messages import CaptureSpec
from privaudit.core.threat import Public
from privaudit.eval import bounds, fdp
from privaudit.eval.canaries import (
    CANARY_NORM,
    DOMINATE,
    EXAMPLES,
    Canary,
    candidates,
    check_canary,
    make_canaries,
)
from privaudit.experiments.audit_setting import Setting, audited, audited_message
from privaudit.experiments.audit_stats import (
    SearchPlan,
    check_trials,
    epsilon_lo_of,
    gls_direction,
    one_run_level,
    search_size,
)
from privaudit.experiments.canary_grads import CanaryGrads, Diracs, audit_batch
from privaudit.sim.copies import Batch, Copy
from privaudit.sim.loop import Step
from privaudit.sim.plan import Adversary, receiver
from privaudit.sim.run import Run
from privaudit.sim.targets import Target

SHIFT_PAIRS = 8  # paired trials that measure a span audit's mean shift (one without a span)


class _Recorder(dict):
    """The View's message dict, remembering which keys ``observe`` looked up."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.used: set[tuple[int, int, int, str]] = set()

    def __getitem__(self, key: Any) -> Any:
        self.used.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        self.used.add(key)
        return super().__contains__(key)


def _receiver(s: Setting, r: int) -> int:
    """The agent whose copy of the victim's round-r message the adversary attacks."""
    return receiver(s.run, s.target, s.threat, s.src, r)


def reseed(ctx: Any, seed: int) -> None:
    """Fresh generators, one per held agent, seeded from ``seed`` (modulo 2^64, the seeds a
    torch generator takes: any --audit-seed in [0, 2^63) and trial count works)."""
    ctx.generators = [
        torch.Generator(device=ctx.device).manual_seed((seed * 65_537 + a) % 2**64)
        for a in ctx.agents
    ]


def _flat(obs: Any, names: tuple[str, ...]) -> Tensor:
    return torch.cat([obs.target[k].reshape(-1) for k in names]).double()


class Rerun:
    """Round ``t`` and the rounds a span observes, re-run from the state before round t on
    fixed batches (the victim's of round t, and one draw for each later round): a call is
    one trial, the observed targets of rounds t..t+span, flat, on trial ``i``'s noise."""

    def __init__(self, s: Setting, span: int, seed: int, progress: bool) -> None:
        run, ctx, t = s.run, s.run.ctx, s.t
        self.s, self.seed, self.names = s, seed, ctx.spec.names
        self.observed = list(range(t, t + span + 1))
        n = run.cfg.agents
        if s.beyond:  # what the coalition receives in rounds t..t+span, nothing before
            rounds = set(self.observed)
        else:
            rounds = {r for o in self.observed for r in s.defense.rounds_needed(s.kind, o, n)}
        self.last = max(rounds)
        links = s.threat.links(run.edges())
        earlier = sorted(r for r in rounds if r < t)
        self.fixed: dict = {}
        if earlier:
            capture = CaptureSpec.of(rounds=earlier, links=links)
            self.fixed = dict(run.messages(capture, progress=progress))
        self.state0 = run.train(until=t - 1, progress=progress) if t > 1 else run.restore(0)
        # the victim's (and everyone's) real batch of round t, then one of each later round
        self.batches = {r: audit_batch(ctx, ctx.sample()) for r in range(t, self.last + 1)}
        self.grads = CanaryGrads(ctx.grads, self.batches[t][0][s.src])
        self.ctx = dataclasses.replace(ctx, grads=self.grads)
        capture = CaptureSpec.of(rounds=range(t, self.last + 1), links=links)
        self.simulation = Copy.of(run.loop.with_ctx(self.ctx), capture)
        self.public = run.public()
        self.receivers = [] if s.beyond else [s.dst] + [_receiver(s, r) for r in self.observed[1:]]
        # the victim's releases the Observations combine, and whether they are exactly (an
        # affine function of) them: only then are the scores Gaussian and the GDP estimate sound
        self.copies, self.exact = 1, False
        # each observed round's share of the flat observation (its number of coordinates)
        self.blocks: list[int] = []
        # the messages of the last round the Observations read: a trial ends once they crossed
        self.needed: set[tuple[int, int, str]] | None = None
        # beyond the neighbourhood: the number of messages stacked, when all have one size
        self.rows: int | None = None
        # how a trial is scored: "projection" on the mean shift, or "whitened" (Σ⁺ shift)
        self.statistic = "projection"
        self(-1, None, record=True)

    def __call__(self, i: int, canary: Canary | Diracs | None, record: bool = False) -> Tensor:
        s = self.s
        reseed(self.ctx, self.seed * 1_000_003 + i + 2)  # trial i's noise, whatever ran before
        if isinstance(canary, Diracs):  # several Dirac canaries at once (the pooled audit)
            self.grads.start(canary)
        else:
            c = canary or Canary("none", None)
            grad = None if c.grad is None else c.grad[None].to(self.ctx.device)
            self.grads.start(grad, c.example)
        self.simulation.tap.clear()
        self.simulation.simulate(
            dict(self.state0),
            range(s.t, self.last + 1),
            batches=self.batches.__getitem__,
            after=lambda r, step: self.grads.stop(),  # the victim's round is over
            stop_after=self.needed,
        )
        msgs = {**self.fixed, **self.simulation.messages()}
        if s.beyond:
            return self._received(msgs, record)
        view = s.threat.view(msgs, self.public)
        if record:
            view.messages = _Recorder(view.messages)
        obs = [
            s.defense.observe(view, s.kind, r, s.src, dst)
            for r, dst in zip(self.observed, self.receivers, strict=True)
        ]
        if record:
            self.copies = sum(int(o.meta.get("copies", 1)) for o in obs)
            self.exact = all(bool(o.meta.get("exact", False)) for o in obs)
            # looked up, and on the wire
            used = view.messages.used & set(self.simulation.tap.messages)
            self.needed = {(a, b, k) for (r, a, b, k) in used if r == self.last}
            self.blocks = [sum(int(v.numel()) for v in o.target.values()) for o in obs]
        return torch.cat([_flat(o, self.names) for o in obs])

    def _received(self, msgs: dict, record: bool) -> Tensor:
        """Everything the coalition holds of the observed rounds: every message a member
        receives or sends (its own values, whose noise it knows), flat and stacked in key
        order (round, sender, receiver, kind). Recording counts the victim's releases of
        those rounds (``copies``: everything held is a function of them, of other agents'
        data and of fresh noise), and whether the stack is affine in the round's noise
        (``exact``: one round, state and batches fixed, of a defense whose messages are
        linear in its updates — it states a
        :meth:`~privaudit.defenses.base.Defense.recursion`), so that a linear statistic of
        it is Gaussian with one variance, in or out."""
        s, members = self.s, self.s.threat.agents
        ours = [k for k in msgs if k[0] in self.observed and members & {k[1], k[2]}]
        if all(k[1] in members for k in ours):
            raise Unobservable(
                f"{s.threat.who()} receive no message in rounds {self.observed[0]}.."
                f"{self.observed[-1]}; choose attackers with neighbours outside them"
            )
        keys = sorted(ours)
        if record:
            releases = max(int(s.privacy.releases), 1)
            self.copies = releases * len(self.observed)
            p, run = s.run.params, s.run
            linear = s.defense.recursion(p, run.ctx.W.cpu(), run.cfg.batch_size) is not None
            self.exact = linear and len(self.observed) == 1
            self.blocks = [
                sum(int(msgs[k].numel()) for k in keys if k[0] == r) for r in self.observed
            ]
            sizes = {int(msgs[k].numel()) for k in keys}
            self.rows = len(keys) if len(sizes) == 1 else None
        return torch.cat([msgs[k].reshape(-1).double() for k in keys])

    def per_round(self, shift: Tensor) -> list[float]:
        """The L2 norm of ``shift`` (a flat observation) in each observed round."""
        return [float(b.norm()) for b in torch.split(shift, self.blocks)]

    def shift(self, canary: Canary, outs: list[Tensor]) -> Tensor:
        """The canary's mean shift of the observed targets: trials on the same noise as
        ``outs`` (trials −2, −3, …, none of the scored ones), with it minus without."""
        return torch.stack([self(-2 - p, canary) - out for p, out in enumerate(outs)]).mean(0)

    def direction(self, shift: Tensor, outs: list[Tensor]) -> Tensor:
        """The statistic's direction for a canary of mean ``shift``: the whitened one
        (:func:`gls_direction`) over what a coalition holds beyond its neighbourhood, whose
        messages mix the agents' noise with known weights; the shift itself elsewhere (one
        observed message with isotropic noise, where the projection on the shift is the
        likelihood-ratio statistic)."""
        rows = self.rows if self.s.beyond else None
        if rows is not None and len(outs) > 1 and (len(outs) - 1) * shift.numel() >= 10 * rows**2:
            self.statistic = "whitened"
            return gls_direction(shift, outs, rows)
        return shift / shift.norm() if float(shift.norm()) > 0 else shift


def white_box(
    run: Run,
    target: str | Target,
    round: int = 1,
    trials: int = 2000,
    confidence: float = 0.95,
    *,
    threat: str | None = None,
    link: tuple[int, int] | None = None,
    attackers: list[int] | None = None,
    victim: int | None = None,
    canary_norm: float | None = None,
    canary_shape: str | None = None,
    span: int = 0,
    seed: int = 0,
    progress: bool = True,
    adversary: Adversary | None = None,
) -> dict[str, Any]:
    """Distinguish "canary in" from "canary out" on ``trials`` re-runs of round ``round``
    (and the ``span`` rounds after it) of the message ``adversary`` (or ``threat``,
    ``link``, ``attackers``, ``victim``) observes, searching the canary (:func:`candidates`,
    pilot and final phase as in the module docstring); returns the scores' bounds, every
    candidate's, and the canary that gave the reported one (see :func:`audit`)."""
    adv = audited(adversary, threat, link, attackers, victim)
    delta = run.cfg.delta
    need = check_trials(trials, delta, confidence)
    if isinstance(span, bool) or not isinstance(span, int) or span < 0:
        raise PrivauditError(f"--span must be an integer ≥ 0, got {span!r}")
    tgt = Target.of(target)
    target = tgt.name  # the name, in what is written
    s = audited_message(run, tgt, round, adv, span, progress)
    rerun = Rerun(s, span, seed, progress)
    cands = candidates(s.privacy, run.cfg.batch_size, canary_norm, canary_shape)
    cands = make_canaries(cands, run.ctx, rerun.grads.clean, seed)
    k = search_size(len(cands), trials, delta, confidence)
    cands = cands[:k]
    t0 = time.perf_counter()
    outs = [rerun(-2 - p, None) for p in range(SHIFT_PAIRS if span or s.beyond else 1)]
    shifts = [rerun.shift(c, outs) for c in cands]
    if s.beyond and not any(float(d.norm()) > 0 for d in shifts):
        raise PrivauditError(
            f"the canary in agent {s.src}'s round-{s.t} batch does not reach "
            f"{s.threat.who()} by round {s.t + span} (agent {s.src} is {s.distance} hops "
            f"away); raise --span (try {max(s.distance - 1, span + 1)})"
        )
    dirs = [rerun.direction(d, outs) for d in shifts]
    gaussian = s.privacy.mechanism == "gaussian" and rerun.exact and span == 0
    plan = SearchPlan.of(k, trials, confidence, gaussian, delta)
    coins = np.random.default_rng(seed + 1).random(trials) < 0.5
    scores, who, chosen, interrupted = _score(rerun, cands, dirs, plan, coins, target, progress)
    done = int(np.isfinite(scores).sum())
    if done < need:
        raise PrivauditError(
            f"interrupted after {done} trials, fewer than the {need} any bound needs; "
            "run the same command again"
        )
    pilots = plan.bounds(scores, coins, who, range(min(plan.pilot, done)), plan.levels[0])
    final = None
    if done > plan.pilot:
        final = plan.bounds(scores, coins, who, range(plan.pilot, done), plan.levels[1])[chosen]
    found = [(p, j) for j, p in enumerate(pilots) if p is not None]
    found += [(final, chosen)] if final is not None else []
    if not found:
        raise PrivauditError(
            f"fewer than 3 of the {done} trials had the canary in (or out); raise --trials"
        )
    best, winner = max(found, key=lambda f: f[0]["epsilon_lo"])
    entries = _entries(rerun, cands, shifts, pilots, final, chosen, bool(span or s.beyond))
    return {
        **best,
        "confidence": confidence,
        "mode": "white-box",
        "target": target,
        "round": s.t,
        "span": span,
        "trials": done,
        "interrupted": interrupted,
        "threat": s.threat.describe(),
        "victim": s.src,
        "receiver": s.dst,
        "beyond": s.beyond,
        "distance": s.distance,
        # the attacking agents (the pairwise bound's observers); none for a link or global
        "attackers": sorted(s.threat.agents) if s.threat.uses_attackers else [],
        "copies": rerun.copies,
        "statistic": rerun.statistic,
        "canary": {key: entries[winner][key] for key in ("kind", "norm", "impact")},
        "search": {
            "candidates": entries,
            "pilot_trials": min(plan.pilot, done),
            "chosen": chosen,
            "levels": {"pilot": plan.levels[0], "final": plan.levels[1]},
        },
        "seconds": float(f"{time.perf_counter() - t0:.3f}"),
        # every trial run: its coin (canary in), candidate and score — the raw outcome
        "raw": {"coin": coins[:done], "candidate": who[:done], "score": scores[:done]},
    }


def _entries(
    rerun: Rerun,
    cands: list[Canary],
    shifts: list[Tensor],
    pilots: list[dict[str, Any] | None],
    final: dict[str, Any] | None,
    chosen: int,
    per_round: bool,
) -> list[dict[str, Any]]:
    """Every searched candidate: kind, norm, impact (and, ``per_round``, its change of each
    observed release), its pilot and final bounds and the larger of them."""
    entries = []
    for j, c in enumerate(cands):
        blocks = rerun.per_round(shifts[j])
        norm = rerun.grads.example_norm if c.kind in EXAMPLES else c.norm
        e: dict[str, Any] = {"kind": c.kind, "norm": norm, "impact": blocks[0]}
        if per_round:
            e["shift"] = blocks  # per observed round: the canary's change of that release
        e["pilot"], e["final"] = pilots[j], final if j == chosen else None
        e["epsilon_lo"] = max(epsilon_lo_of(pilots[j]), epsilon_lo_of(e["final"]), 0.0)
        entries.append(e)
    return entries


def _score(
    rerun: Rerun,
    cands: list[Canary],
    dirs: list[Tensor],
    plan: SearchPlan,
    coins: np.ndarray,
    target: str,
    progress: bool,
) -> tuple[np.ndarray, np.ndarray, int, bool]:
    """Run the trials of ``plan`` (trial i: the canary when ``coins[i]``, scored along its
    candidate's direction); the scores (NaN where not run), each trial's candidate, the
    candidate the pilot chose and whether a Ctrl-C ended it early."""
    n = len(coins)
    scores, who = np.full(n, np.nan), np.zeros(n, dtype=int)
    chosen, interrupted = 0, False
    bar, task = text.progress(n, f"audit {target} r{rerun.s.t}", progress)
    with bar:  # threads: the CLI's --threads (a trial is many tiny ops: 1 is best)
        try:
            for i in range(n):
                if 0 < plan.pilot == i:  # the pilot is over: its best candidate takes the rest
                    pilots = plan.bounds(scores, coins, who, range(i), plan.levels[0])
                    chosen = max(range(plan.k), key=lambda j: epsilon_lo_of(pilots[j]))
                who[i] = i % plan.k if i < plan.pilot else chosen
                obs = rerun(i, cands[who[i]] if coins[i] else None)
                scores[i] = float(obs @ dirs[who[i]])
                bar.advance(task)
        except KeyboardInterrupt:
            interrupted = True
    return scores, who, chosen, interrupted


def one_run(
    run: Run,
    target: str | Target,
    canaries: int = 1000,
    confidence: float = 0.95,
    *,
    threat: str | None = None,
    link: tuple[int, int] | None = None,
    attackers: list[int] | None = None,
    victim: int | None = None,
    canary_norm: float | None = None,
    seed: int = 0,
    progress: bool = True,
    adversary: Adversary | None = None,
) -> dict[str, Any]:
    """Steinke et al.'s one-run game over a fresh copy of the run (its seeds, plus the
    canaries) on what ``adversary`` (or ``threat``, …) observes, read at :func:`one_run_level`
    by Mahloujifar et al.'s f-DP analysis — ε (``epsilon_lo``) and μ, which
    :func:`~privaudit.experiments.audit.audit` holds to the accounted μ — and by Steinke
    et al.'s beside (``one_run``)."""
    adv = audited(adversary, threat, link, attackers, victim)
    delta = run.cfg.delta
    check_trials(canaries, delta, confidence, "one-run")
    tgt = Target.of(target)
    target = tgt.name  # the name, in what is written
    s = audited_message(run, tgt, 1, adv, progress=progress)
    if s.beyond:
        raise PrivauditError(
            f"{s.threat.who()} receive no message of agent {s.src}, and the one-run audit "
            "scores the victim's own messages; use --mode white-box (with --span)"
        )
    ctx = run.ctx
    norm, impact = _one_run_canary(s.privacy, run.cfg.batch_size, canary_norm)
    D = ctx.spec.numel
    if canaries > D:
        raise PrivauditError(f"at most {D} Dirac canaries fit this model; lower --trials")
    rng = np.random.default_rng(seed)
    coords = torch.as_tensor(rng.choice(D, size=canaries, replace=False))
    included = rng.random(canaries) < 0.5
    q = run.resolved["agents"][s.src]["sample_rate"]  # the victim's own Poisson rate
    state = run.restore(0)  # the run's own seeds: the same training, plus the canaries
    grads = CanaryGrads(ctx.grads, ctx.train_x[:0], replay=False)
    actx = dataclasses.replace(ctx, grads=grads)
    T = run.cfg.rounds
    capture = CaptureSpec.of(links=s.threat.links(run.edges()))
    simulation = Copy.of(run.loop.with_ctx(actx), capture)
    tally = _Tally(s, run.public(), coords, np.zeros(canaries))

    def draw(t: int) -> Batch:
        tally.round = t
        return audit_batch(actx, actx.sample())

    def plant(t: int, batch: Batch) -> None:  # each included canary joins at the rate q
        grads.victim_x = batch[0][s.src]
        now = included & (rng.random(canaries) < q)
        grads.start(Diracs(coords[now], norm, D) if now.any() else None)

    def observe(t: int, step: Step) -> None:
        tally.add(t, simulation.messages())
        simulation.tap.clear()
        bar.advance(task)

    bar, task = text.progress(T, f"one-run audit {target}", progress)
    t0 = time.perf_counter()
    with bar:
        try:
            simulation.simulate(state, range(1, T + 1), batches=draw, before=plant, after=observe)
        except KeyboardInterrupt:
            raise PrivauditError(
                f"one-run audit interrupted in round {tally.round}; run the same command "
                "again (the one-run audit restarts from round 1)"
            ) from None
    scores, seen = tally.scores, tally.seen
    if seen == 0:
        raise PrivauditError(
            f"the {s.threat.describe()} adversary observes no {s.kind!r} message of agent "
            f"{s.src} in {T} rounds; choose another --threat or --link"
        )
    level = one_run_level(confidence)
    res = bounds.one_run_audit(scores, included, delta, level)  # beside, for comparison
    res_fdp = fdp.one_run_fdp_audit(scores, included, delta, level)
    return {
        "mode": "one-run",
        "target": target,
        "rounds": T,
        "observed_rounds": seen,
        "trials": canaries,
        "epsilon_lo": float(res_fdp["epsilon_lo"]),
        "level": level,
        "one_run": {k: float(v) for k, v in res.items()},
        "one_run_fdp": {k: float(v) for k, v in res_fdp.items()},
        "threat": s.threat.describe(),
        "victim": s.src,
        "canary": {"norm": norm, "kind": "dirac", "impact": impact, "rate": q},
        "confidence": confidence,
        "delta": delta,
        "seconds": float(f"{time.perf_counter() - t0:.3f}"),
        "raw": {"included": included, "score": scores},  # per canary: its coin and score
    }


@dataclass
class _Tally:
    """The one-run audit's scores as its rounds go: each canary's sum of its coordinate of
    the victim's observed target over the rounds observed so far (``seen``), from the
    messages of the rounds an observation still needs (``history``); ``round``: the round
    under way."""

    s: Setting
    public: Public
    coords: Tensor
    scores: np.ndarray
    seen: int = 0
    round: int = 0
    history: dict = field(default_factory=dict)

    def add(self, t: int, messages: dict) -> None:
        """Round ``t``'s ``messages``: score every round whose observation they complete."""
        s, n = self.s, self.s.run.cfg.agents
        self.history.update(messages)
        for r in range(1, t + 1):  # rounds whose observation is now complete
            if max(s.defense.rounds_needed(s.kind, r, n)) != t:
                continue
            flat = _observe(s.defense, s, self.history, self.public, r)
            if flat is not None:
                self.scores += flat[self.coords].numpy()
                self.seen += 1
        # the oldest round an observation not yet complete (of rounds up to t + 1) needs
        needs = [s.defense.rounds_needed(s.kind, r, n) for r in range(1, t + 2)]
        keep = min(min(need) for need in needs if max(need) > t)
        self.history = {k: v for k, v in self.history.items() if k[0] >= keep}


def _one_run_canary(privacy: Any, batch_size: int, norm: float | None) -> tuple[float, float]:
    """The one-run audit's Dirac norm — C per example, 10⁴·B·C for a flat clip (a Dirac that
    dominates the batch), else ``norm`` or :data:`CANARY_NORM` — and its impact on one
    release as the mechanism states its clip (min(norm, C)/B, 2C, norm/B)."""
    check_canary(norm, None)
    C, B = privacy.clip, batch_size
    if privacy.clip_unit == "example":
        norm = C if norm is None else norm
        return norm, min(norm, C) / B
    if privacy.clip_unit == "batch":
        return (DOMINATE * B * C if norm is None else norm), 2 * C
    norm = CANARY_NORM if norm is None else norm
    return norm, norm / B


def _observe(defense: Any, s: Setting, history: dict, public: Public, r: int) -> Tensor | None:
    """The victim's observed target of round r (flat, float64), or None if unseen."""
    try:
        obs = defense.observe(s.threat.view(history, public), s.kind, r, s.src, _receiver(s, r))
    except Unobservable:
        return None
    return _flat(obs, s.run.ctx.spec.names)
