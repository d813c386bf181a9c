"""Empirical DP auditing of a target's own messages with canaries.

Two experiments, both on the defense's real round code, stepped by the engine's round loop
(:class:`privaudit.sim.loop.RoundLoop`, over a Network whose tap captures what it sends), and
scored on what the threat model's View lets an adversary
compute (``defense.observe``):

- **white box** (:func:`white_box`): the run is restored to the state before round ``t``
  and the victim's batch of round t is fixed. Each trial flips a fair coin: heads, a canary
  *gradient* is added to the victim's batch as one extra example (add/remove adjacency, the
  convention of the accountant; the defense's own clip applies to it); tails, it is not.
  The round is re-run — the only randomness left is the defense's fresh noise — and the
  Observation's target is projected on the canary direction (the canary's shift is then one
  coordinate of a Gaussian for a Gaussian channel: the most powerful test). Gradients are
  computed once and replayed (a call whose inputs equal the first trial's, as the fixed
  state and batch make them), and the round loop ends a trial's round as soon as the
  messages the View needs have crossed the network, so thousands of trials are cheap.
  Bounds: Clopper–Pearson at a threshold chosen on held-out trials, and, where the
  Observation is exactly a Gaussian release (``meta["exact"]``), a Gaussian-DP estimate with
  a confidence interval (:mod:`privaudit.eval.bounds`); each at 1 − α/2, so the larger holds
  at 1 − α. The upper bound is the ε of the ``copies`` releases the Observation combines.
- **one run** (:func:`one_run`, Steinke, Nasr & Jagielski 2023): m Dirac canary gradients on
  distinct coordinates, each included with probability ½; an included canary joins the
  victim's batch in each round with the run's sampling rate q (Poisson, as accounted). One
  training run; each canary is scored by the sum over rounds of its coordinate of the
  observed target, and top/bottom guesses give the bound.

The canary (Nasr et al. 2023, "Tight auditing"): a Dirac gradient whose norm is the clip C
for per-example clipping (its clipped contribution is C·e_k, the worst case); for a flat
clip of the batch mean it points against the victim's clean gradient with a norm that
dominates the batch (the clipped mean then swings from ≈ C·u to ≈ −C·u: sensitivity 2C);
without any clip its norm is ``canary_norm`` (default 1), and the paper rules stated in Δf
are evaluated at the canary's actual change of the released vector.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
from torch import Tensor

from privaudit.core import sampling
from privaudit.core.accounting import account
from privaudit.core.errors import PrivauditError, Unobservable
from privaudit.core.messages import CaptureSpec, Tap
from privaudit.core.network import SimNetwork
from privaudit.core.threat import build_threat, victim_threat
from privaudit.grads import clip_rows
from privaudit.sim.run import Run
from privaudit.sim.targets import parse_target

from . import bounds

LOOSE = 0.5  # a lower bound below LOOSE × the upper bound is "loose"
DOMINATE = 1e4  # flat-clip canary norm, in units of B·C: the clipped mean is ≈ C·direction
HELD_OUT = 0.5  # share of white-box trials kept to evaluate the threshold chosen on the rest
CANARY_NORM = 1.0  # canary norm where nothing is clipped


# -- the canary, added where the defense computes its gradients -------------------------------
@dataclass
class CanaryGrads:
    """A stand-in for ``ctx.grads`` that adds canary gradients to the victim's pairs.

    Rows whose (padded) batch equals ``victim_x`` get ``canaries (k, D)`` as k extra
    examples of the batch with the defense's fixed normalisation B, the expected batch size
    (``inner.denominator``; :mod:`privaudit.core.sampling`): ``clipped_mean`` adds Σ clip_C(c)/B
    (each canary clipped by the defense's own C), ``mean`` adds Σ c/B (a flat clip applies
    after), ``per_example`` adds them to the first example (the add-one batch, normalised
    by B). Batches come from :func:`audit_batch`, whose padded slots tell the agents apart
    even when the victim's batch is empty. With ``replay`` the k-th call of a trial returns
    the k-th result of the first trial when its inputs match (same state, same batch), so
    trials pay for noise only."""

    inner: Any
    victim_x: Tensor
    canaries: Tensor | None = None
    replay: bool = True
    clean: list[Tensor] = field(default_factory=list)  # victim rows' clean results (probe)
    _store: dict[tuple[str, int], tuple[tuple, Tensor, Tensor]] = field(default_factory=dict)
    _calls: int = 0

    def start(self, canaries: Tensor | None) -> None:
        """A new trial: ``canaries`` (k, D) or None."""
        self.canaries, self._calls = canaries, 0

    def _rows(self, x: Tensor) -> Tensor:
        v = self.victim_x
        if x.shape[1:] != v.shape:
            return torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
        return (x.reshape(x.shape[0], -1) == v.reshape(1, -1)).all(-1)

    def _call(
        self,
        name: str,
        fn: Callable[..., Tensor],
        flat: Tensor,
        x: Tensor,
        *rest: Any,
        owner: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``fn``'s result (replayed when this call's inputs are those of the first trial's
        call at the same position: the same tensors, or equal ones element for element) and
        the mask of the victim's rows (pair p's batch is ``x[owner[p]]`` with ``owner``)."""
        key = (name, self._calls)
        self._calls += 1
        inputs = (flat, x, *[r for r in rest if isinstance(r, Tensor)], owner)
        hit = self._store.get(key) if self.replay else None
        if hit is not None and _same(hit[0], inputs):
            return hit[1], hit[2]
        if owner is None:
            out, rows = fn(flat, x, *rest), self._rows(x)
        else:
            out, rows = fn(flat, x, *rest, owner), self._rows(x)[owner]
        if self.replay:
            self._store[key] = (inputs, out, rows)
        if rows.any() and name != "per_example" and len(self.clean) < 64:
            self.clean.append(out[rows].detach())
        return out, rows

    def mean(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        out, rows = self._call("mean", self.inner.mean, flat, x, y)
        return self._add(out, rows, self.inner.denominator(x), lambda c: c)

    def clipped_mean(
        self, flat: Tensor, x: Tensor, y: Tensor, clip: float | None, owner: Tensor | None = None
    ) -> Tensor:
        out, rows = self._call(
            "clipped_mean", self.inner.clipped_mean, flat, x, y, clip, owner=owner
        )
        B = self.inner.denominator(x)
        return self._add(out, rows, B, lambda c: c if clip is None else clip_rows(c, clip))

    def per_example(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        out, rows = self._call("per_example", self.inner.per_example, flat, x, y)
        if self.canaries is None or not rows.any():
            return out
        out = out.clone()
        out[rows, 0] += self.canaries.sum(0).to(out.dtype)
        return out

    def _add(self, out: Tensor, rows: Tensor, B: int, clip: Callable[[Tensor], Tensor]) -> Tensor:
        if self.canaries is None or not rows.any():
            return out
        out = out.clone()
        out[rows] += clip(self.canaries.to(out.dtype)).sum(0) / B
        return out


def _same(a: tuple[Tensor | None, ...], b: tuple[Tensor | None, ...]) -> bool:
    """Whether two calls' inputs are the same: each pair one tensor, or equal tensors."""
    return len(a) == len(b) and all(
        u is v or (u is not None and v is not None and torch.equal(u, v))
        for u, v in zip(a, b, strict=True)
    )


def audit_batch(ctx: Any, index: Tensor) -> tuple[Tensor, Tensor]:
    """The padded batches of ``index`` (:meth:`Context.gather`) with every padded input set
    to its row's number + 1: a padded slot's gradient is 0 whatever it holds, and an empty
    batch is then told apart from every other by its inputs (:class:`CanaryGrads`)."""
    x, y = ctx.gather(index)
    pad = ~sampling.real(index).view(*index.shape, *[1] * (x.dim() - 2))
    row = torch.arange(1, len(index) + 1, dtype=x.dtype, device=x.device)
    return torch.where(pad, row.view(-1, *[1] * (x.dim() - 1)), x), y


def check_trials(
    trials: int, delta: float, confidence: float = 0.95, mode: str = "white-box"
) -> int:
    """The fewest trials any bound needs — white box: Clopper–Pearson at 1 − α/2 on the
    held-out half; one run: canaries for Steinke et al.'s bound — and the error for fewer
    ``trials``."""
    bounds.check_levels(confidence, delta)
    if mode == "white-box":
        need, what = bounds.trials_needed(delta, 1 - (1 - confidence) / 2, HELD_OUT), "trials"
    else:
        need, what = bounds.one_run_canaries_needed(delta, confidence), "canaries"
    if trials < need:
        raise PrivauditError(
            f"--trials {trials} is too few for any bound at confidence {confidence} "
            f"(δ = {delta:g}); the {mode} audit needs at least {need} {what}"
        )
    return need


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


# -- the setting: run, target, adversary, canary ----------------------------------------------
@dataclass
class Setting:
    run: Run
    defense: Any
    kind: str
    t: int
    threat: Any
    src: int
    dst: int
    privacy: Any
    canary: Tensor  # (D,) the white-box canary gradient
    impact: float  # the canary's L2 change of the released vector (for Δf-rules)


def _setting(
    run: Run,
    target: str,
    t: int,
    threat: str,
    link: tuple[int, int] | None,
    attackers: list[int] | None,
    victim: int | None,
    canary_norm: float | None,
    seed: int,
) -> Setting:
    defense, kind = parse_target(target)
    if defense.name != run.defense.name:
        raise PrivauditError(
            f"target {target} needs a {defense.name} run, but this run trains "
            f"{run.defense.name}; pick a {run.defense.name}-* target or another --run"
        )
    n = run.cfg.agents
    rounds = defense.rounds_needed(kind, t, n)
    if t < 1 or max(rounds) > run.cfg.rounds:
        raise PrivauditError(
            f"--round {t} is outside what a {run.cfg.rounds}-round run can show for {target} "
            f"(it needs rounds {min(rounds)}..{max(rounds)}); pick another round or --rounds"
        )
    adj = run.ctx.adj.cpu()
    if link is not None:
        src, dst = link
        th = (
            build_threat("link", link=link)
            if threat == "link"
            else build_threat(threat, attackers=attackers or [dst])
        )
    else:
        src = 0 if victim is None else victim
        receivers = defense.receivers(kind, t, src, adj)
        th = victim_threat(threat, src, receivers, attackers or [])
        dst = th.receiver(src, receivers, f"{kind!r} message in round {t}")
    privacy = defense.privacy(run.params, kind, run.ctx.W.cpu(), src)
    D = run.ctx.spec.numel
    B = run.cfg.batch_size
    rng = np.random.default_rng(seed)
    direction = torch.zeros(D, dtype=torch.float32)
    direction[int(rng.integers(D))] = 1.0
    C = privacy.clip
    if privacy.clip_unit == "example":
        norm = C if canary_norm is None else canary_norm
        impact = min(norm, C) / B
    elif privacy.clip_unit == "batch":
        norm = DOMINATE * B * C if canary_norm is None else canary_norm
        impact = 2 * C
    else:
        norm = CANARY_NORM if canary_norm is None else canary_norm
        impact = norm / B
    if not norm > 0:
        raise PrivauditError(f"--canary-norm must be > 0, got {norm}")
    return Setting(run, defense, kind, t, th, src, dst, privacy, norm * direction, impact)


def _reseed(ctx: Any, seed: int) -> None:
    """Fresh generators, one per held agent, seeded from ``seed`` (modulo 2^64, the seeds a
    torch generator takes: any --audit-seed in [0, 2^63) and trial count works)."""
    ctx.generators = [
        torch.Generator(device=ctx.device).manual_seed((seed * 65_537 + a) % 2**64)
        for a in ctx.agents
    ]


def _flat(obs: Any, names: tuple[str, ...]) -> Tensor:
    return torch.cat([obs.target[k].reshape(-1) for k in names]).double()


def _progress(total: int, what: str, enabled: bool):
    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        disable=not enabled,
        transient=True,
    )
    return bar, bar.add_task(what, total=total)


# -- white box ----------------------------------------------------------------------------------
def white_box(
    run: Run,
    target: str,
    round: int = 1,
    trials: int = 2000,
    confidence: float = 0.95,
    *,
    threat: str = "link",
    link: tuple[int, int] | None = None,
    attackers: list[int] | None = None,
    victim: int | None = None,
    canary_norm: float | None = None,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Distinguish "canary in" from "canary out" on ``trials`` re-runs of round ``round``;
    returns the scores, the bounds and the accounting side by side (see :func:`verdicts`)."""
    delta = run.cfg.delta
    need = check_trials(trials, delta, confidence)
    s = _setting(run, target, round, threat, link, attackers, victim, canary_norm, seed)
    ctx, defense, t = run.ctx, s.defense, s.t
    edges = run.edges()
    rounds = defense.rounds_needed(s.kind, t, run.cfg.agents)
    earlier = [r for r in rounds if r < t]
    links = s.threat.links(edges)
    fixed: dict = {}
    if earlier:
        fixed = dict(run.messages(CaptureSpec.of(rounds=earlier, links=links), progress=progress))
    state0 = run.train(until=t - 1, progress=progress) if t > 1 else run.restore(0)
    idx = ctx.sample()  # the victim's (and everyone's) real batch of round t
    batch = audit_batch(ctx, idx)
    grads = CanaryGrads(ctx.grads, batch[0][s.src])
    actx = dataclasses.replace(ctx, grads=grads)
    tap = Tap(CaptureSpec.of(rounds=range(t, max(rounds) + 1), links=links))
    net = SimNetwork(ctx.adj, ctx.W, tap).to(ctx.device)
    loop = run.loop.with_ctx(actx)
    public = run.public()
    names = ctx.spec.names
    # the victim's releases the Observation combines, and whether it is exactly (an affine
    # function of) them: only then are the scores Gaussian and the GDP estimate sound
    combined: dict[str, Any] = {"copies": 1, "exact": False}
    # the messages of round t the Observation reads: a trial's round ends once they crossed
    needed: set[tuple[int, int, str]] | None = None

    def trial(i: int, canary: Tensor | None, record: bool = False) -> float:
        _reseed(actx, seed * 1_000_003 + i + 2)  # trial i's noise, whatever ran before
        grads.start(None if canary is None else canary[None].to(ctx.device))
        nonlocal needed
        tap.clear()
        state = loop.step(dict(state0), t, net, batch, stop_after=needed).state
        grads.start(None)
        for r in range(t + 1, max(rounds) + 1):  # needed is None: round t ran to its end
            state = loop.step(state, r, net, audit_batch(actx, actx.sample())).state
        msgs = {**fixed, **{k: m.payload for k, m in tap.messages.items()}}
        view = s.threat.view(msgs, public)
        if record:
            view.messages = _Recorder(view.messages)
        obs = defense.observe(view, s.kind, t, s.src, s.dst)
        if record:
            combined["copies"] = int(obs.meta.get("copies", 1))
            combined["exact"] = bool(obs.meta.get("exact", False))
            used = view.messages.used & set(tap.messages)  # looked up and on the wire
            needed = {(a, b, k) for (r, a, b, k) in used if r == t}
            if max(rounds) > t:
                needed = None  # later rounds need the whole round's state
        return float(_flat(obs, names) @ direction)

    canary = s.canary
    direction = (canary / canary.norm()).double()
    if s.privacy.clip_unit == "batch" and canary_norm is None:
        trial(-1, None, record=True)  # the victim's clean gradient fixes the direction
        u = torch.stack([c.mean(0) for c in grads.clean]).mean(0).float().cpu()
        canary = -canary.norm() * u / u.norm().clamp_min(1e-12)
    direction = (canary / canary.norm()).double()
    trial(-1, None, record=True)
    coins = np.random.default_rng(seed + 1).random(trials) < 0.5
    scores = np.full(trials, np.nan)
    t0 = time.perf_counter()
    bar, task = _progress(trials, f"audit {target} r{t}", progress)
    interrupted = False
    with bar:  # threads: the CLI's --threads (a trial is many tiny ops: 1 is best)
        try:
            for i in range(trials):
                scores[i] = trial(i, canary if coins[i] else None)
                bar.advance(task)
        except KeyboardInterrupt:
            interrupted = True
    done = int(np.isfinite(scores).sum())
    if done < need:
        raise PrivauditError(
            f"interrupted after {done} trials, fewer than the {need} any bound needs; "
            "run the same command again"
        )
    scores, coins = scores[:done], coins[:done]
    gaussian = s.privacy.mechanism == "gaussian" and combined["exact"]
    result = _white_box_bounds(scores, coins, gaussian, delta, confidence)
    result.update(
        mode="white-box",
        target=target,
        round=t,
        trials=done,
        interrupted=interrupted,
        threat=s.threat.describe(),
        victim=s.src,
        receiver=s.dst,
        copies=combined["copies"],
        canary={
            "norm": float(canary.norm()),
            "kind": "opposite" if s.privacy.clip_unit == "batch" else "dirac",
            "impact": s.impact,
        },
        seconds=float(f"{time.perf_counter() - t0:.3f}"),
    )
    return result


def _white_box_bounds(
    scores: np.ndarray, coins: np.ndarray, gaussian: bool, delta: float, confidence: float
) -> dict[str, Any]:
    """Clopper–Pearson (any channel) and, where the scores are a Gaussian shift (``gaussian``),
    the Gaussian-DP estimate; the larger lower bound holds at ``confidence``."""
    n = len(scores)
    # two bounds, each at 1 − α/2, so that the larger of them holds at 1 − α (Bonferroni)
    level = 1 - (1 - confidence) / 2 if gaussian else confidence
    cut = int(n * (1 - HELD_OUT))
    sel_in, sel_out = scores[:cut][coins[:cut]], scores[:cut][~coins[:cut]]
    sign = 1.0 if sel_in.mean() >= sel_out.mean() else -1.0
    thr = bounds.best_threshold(sign * sel_in, sign * sel_out, delta, level)
    ev_in, ev_out = sign * scores[cut:][coins[cut:]], sign * scores[cut:][~coins[cut:]]
    cp = bounds.clopper_pearson_epsilon(ev_in, ev_out, thr, delta, level)
    cap = bounds.max_cp_epsilon(len(ev_in), len(ev_out), delta, level)
    out: dict[str, Any] = {
        "clopper_pearson": {
            "epsilon_lo": cp,
            "threshold": thr,
            "capped": cp >= cap - 1e-9,
            "cap": cap,
            "evaluated": len(ev_in) + len(ev_out),
            "confidence": level,
        }
    }
    lower = cp
    if gaussian:
        g = bounds.gdp_estimate(scores[coins], scores[~coins], delta, level)
        out["gdp"] = {**{k: float(v) for k, v in g.items()}, "confidence": level}
        lower = max(lower, g["epsilon_lo"])
    out["epsilon_lo"] = lower
    out["confidence"] = confidence
    out["delta"] = delta
    return out


# -- one run --------------------------------------------------------------------------------------
def one_run(
    run: Run,
    target: str,
    canaries: int = 1000,
    confidence: float = 0.95,
    *,
    threat: str = "link",
    link: tuple[int, int] | None = None,
    attackers: list[int] | None = None,
    victim: int | None = None,
    canary_norm: float | None = None,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Steinke et al.'s one-run audit over the run's ``rounds`` (a fresh training run with
    the run's configuration and seed, plus the canaries; the run directory is not touched)."""
    delta = run.cfg.delta
    check_trials(canaries, delta, confidence, "one-run")
    s = _setting(run, target, 1, threat, link, attackers, victim, canary_norm, seed)
    ctx, defense = run.ctx, s.defense
    D = ctx.spec.numel
    if canaries > D:
        raise PrivauditError(f"at most {D} Dirac canaries fit this model; lower --trials")
    rng = np.random.default_rng(seed)
    coords = torch.as_tensor(rng.choice(D, size=canaries, replace=False))
    included = rng.random(canaries) < 0.5
    norm = float(s.canary.norm())
    q = run.resolved["agents"][s.src]["sample_rate"]  # the victim's own Poisson rate
    state = run.restore(0)  # the run's own seeds: the same training, plus the canaries
    grads = CanaryGrads(ctx.grads, ctx.train_x[:0], replay=False)
    actx = dataclasses.replace(ctx, grads=grads)
    n, T = run.cfg.agents, run.cfg.rounds
    tap = Tap(CaptureSpec.of(links=s.threat.links(run.edges())))
    net = SimNetwork(ctx.adj, ctx.W, tap).to(ctx.device)
    loop = run.loop.with_ctx(actx)
    public = run.public()
    scores = np.zeros(canaries)
    seen = 0
    history: dict = {}
    bar, task = _progress(T, f"one-run audit {target}", progress)
    t0 = time.perf_counter()
    with bar:
        try:
            for t in range(1, T + 1):
                xb, yb = audit_batch(actx, actx.sample())
                grads.victim_x = xb[s.src]
                now = included & (rng.random(canaries) < q)
                rows = torch.zeros(int(now.sum()), D)
                rows[torch.arange(len(rows)), coords[now]] = norm
                grads.start(rows.to(ctx.device) if len(rows) else None)
                state = loop.step(state, t, net, (xb, yb)).state
                history.update({k: m.payload for k, m in tap.messages.items()})
                tap.clear()
                for r in range(1, t + 1):  # rounds whose observation is now complete
                    if max(defense.rounds_needed(s.kind, r, n)) != t:
                        continue
                    flat = _observe(defense, s, history, public, r)
                    if flat is not None:
                        scores += flat[coords].numpy()
                        seen += 1
                keep = min(defense.rounds_needed(s.kind, t + 1, n))  # oldest round still needed
                history = {k: v for k, v in history.items() if k[0] >= keep}
                bar.advance(task)
        except KeyboardInterrupt:
            raise PrivauditError(
                f"one-run audit interrupted in round {t}; run the same command again "
                "(the one-run audit restarts from round 1)"
            ) from None
    if seen == 0:
        raise PrivauditError(
            f"the {s.threat.describe()} adversary observes no {s.kind!r} message of agent "
            f"{s.src} in {T} rounds; choose another --threat or --link"
        )
    res = bounds.one_run_audit(scores, included, delta, confidence)
    return {
        "mode": "one-run",
        "target": target,
        "rounds": T,
        "observed_rounds": seen,
        "trials": canaries,
        "epsilon_lo": float(res["epsilon"]),
        "one_run": {k: float(v) for k, v in res.items()},
        "threat": s.threat.describe(),
        "victim": s.src,
        "canary": {"norm": norm, "kind": "dirac", "impact": s.impact, "rate": q},
        "confidence": confidence,
        "delta": delta,
        "seconds": float(f"{time.perf_counter() - t0:.3f}"),
    }


def _observe(defense: Any, s: Setting, history: dict, public: dict, r: int) -> Tensor | None:
    """The victim's observed target of round r (flat, float64), or None if unseen."""
    th = s.threat
    receivers = defense.receivers(s.kind, r, s.src, s.run.ctx.adj.cpu())
    try:
        dst = th.receiver(s.src, receivers, f"{s.kind!r} message in round {r}")
        obs = defense.observe(th.view(history, public), s.kind, r, s.src, dst)
    except Unobservable:
        return None
    return _flat(obs, s.run.ctx.spec.names)


# -- accounting beside the audit, and the verdict ----------------------------------------------
def verdict(lower: float, upper: float, slack: float = LOOSE) -> str:
    """``violated`` when the lower confidence bound exceeds the upper bound; ``loose`` when
    it is below ``slack`` × the upper bound; ``no guarantee`` when the upper bound is ∞."""
    if math.isinf(upper):
        return "no guarantee"
    if lower > upper:
        return "violated"
    return "loose" if lower < slack * upper else "consistent"


def audit(
    run: Run, target: str, mode: str = "white-box", round: int = 1, **kw: Any
) -> dict[str, Any]:
    """The audit of ``mode`` plus every upper bound and a verdict against each."""
    if mode not in ("white-box", "one-run"):
        raise PrivauditError(f"--mode must be white-box or one-run, got {mode!r}")
    if mode == "white-box":
        res = white_box(run, target, round, **kw)
    else:
        kw["canaries"] = kw.pop("trials", 1000)
        res = one_run(run, target, **kw)
    defense, kind = parse_target(target)
    victim = res["victim"]
    privacy = defense.privacy(run.params, kind, run.ctx.W.cpu(), victim)
    q = run.resolved["agents"][victim]["sample_rate"]
    acc = account(
        privacy, run.cfg.delta, q, run.cfg.rounds, run.cfg.accountant, res.get("copies", 1)
    )
    impact = res["canary"]["impact"]
    acc["paper_epsilon"] = (
        privacy.paper_epsilon(run.cfg.delta, impact) if privacy.paper_epsilon else None
    )
    unit = "release" if mode == "white-box" else "run"
    uppers = {
        "accountant": acc[unit],
        "paper's count": acc[f"{unit}_claimed"],
    }
    if acc["paper_epsilon"] is not None and mode == "white-box":  # the rules are per round
        uppers["paper"] = acc["paper_epsilon"]
    lower = res["epsilon_lo"]
    res["accounting"] = acc
    res["upper"] = uppers
    res["verdicts"] = {k: verdict(lower, u) for k, u in uppers.items()}
    res["verdict"] = res["verdicts"]["accountant"]
    return res
