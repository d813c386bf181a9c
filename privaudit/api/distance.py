"""Privacy against graph distance: what an attacker learns of an agent d hops away.

For one attacker u and victims v at hop distance d = 1, 2, 3, … (issue 35, "Beyond the
neighbourhood"), :func:`distance_sweep` gives at each d

- the white-box audit's ε lower bound (:func:`privaudit.experiments.audit.audit`): a canary in
  v's round-t batch, scored on v's own message at d = 1 and, past the neighbourhood, on every
  message u receives in rounds t..t+span, the span the smallest at which the canary's
  influence reaches u (:func:`reach_span`);
- beside it the upper bounds the audit compares with: the local-DP bound of v's releases
  over those rounds and, for a defense that states one (Muffliato,
  :attr:`~privaudit.core.privacy.Privacy.pairwise`), its pairwise network-DP bound towards u
  from the exact view of what u holds, with the paper's own number beside it (Cyffers et
  al., NeurIPS 2022, Theorem 1), each with its verdict;
- the reconstruction PSNR of the gossip attack (``privaudit attack --threat coalition
  --attacker u --victim v``: the direct observation at d = 1, the gossip algebra past it,
  :func:`privaudit.api.gossip.observe_beyond`), None where v's update is not identifiable
  (D-PSGD past the neighbourhood) or its batch is empty, with the reason.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from privaudit.api.pipeline import reconstruct
from privaudit.attacks.gossip_algebra import unroll
from privaudit.core.errors import PrivauditError, Unobservable
from privaudit.experiments.audit import audit
from privaudit.scenario.topology import distances
from privaudit.sim.run import Run
from privaudit.sim.targets import Target


@dataclass
class DistancePoint:
    """One victim at ``distance`` hops from the attacker: the audit over rounds
    ``round``..``round + span`` (``epsilon_lo`` at ``confidence``, the canary's L2 shift of
    the observation per round in ``shift``), every upper bound and verdict, and the gossip
    attack's PSNR (None with ``psnr_note`` saying why)."""

    distance: int
    victim: int
    span: int
    trials: int
    epsilon_lo: float
    upper: dict[str, float]
    verdicts: dict[str, str]
    shift: list[float]
    psnr: float | None = None
    psnr_note: str | None = None
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def victims_by_distance(adj: Tensor, attacker: int, wanted: Sequence[int] | None = None) -> dict:
    """{d: the lowest-numbered agent exactly d hops from ``attacker``} for each d of
    ``wanted`` (default every d ≥ 1 the graph has); a d with no agent is left out."""
    hops = distances(adj.cpu())[attacker].tolist()
    far = max(hops)
    ds = list(wanted) if wanted is not None else list(range(1, far + 1))
    out = {}
    for d in ds:
        at = [v for v, h in enumerate(hops) if h == d]
        if at:
            out[int(d)] = at[0]
    return out


def reach_span(run: Run, target: str, t: int, attackers: Sequence[int], victim: int) -> int:
    """The fewest rounds after ``t`` until a message the ``attackers`` receive depends on
    ``victim``'s round-t update: from the defense's recursion (the round whose unrolled
    message rows first give the update a non-zero coefficient; Muffliato's K gossip steps
    reach K hops within the round), else one hop per round (d − 1)."""
    tgt = Target.parse(target)
    adj = run.ctx.adj.cpu()
    members = set(int(a) for a in attackers)
    d = int(min(distances(adj)[a, victim] for a in members))
    rec = tgt.defense.recursion(run.params, run.ctx.W.cpu(), run.cfg.batch_size)
    if rec is None:
        return max(d - 1, 0)
    heard = sorted({int(w) for a in members for w in adj[a].nonzero().flatten().tolist()} - members)
    n, horizon = rec.n, t + d
    col = rec.variables(horizon).index((rec.update, victim, t))
    comps = [rec.component(c) for c in dict.fromkeys(rec.carries.values())]
    for s, phi in unroll(rec, horizon):
        if s < t:
            continue
        if any(abs(phi[c * n + w, col]) > 1e-12 for c in comps for w in heard):
            return s - t
    return max(d - 1, 0)


def distance_sweep(
    run: Run,
    target: str,
    attacker: int,
    *,
    wanted: Sequence[int] | None = None,
    round: int = 1,
    trials: int = 300,
    confidence: float = 0.95,
    seed: int = 0,
    attack: str | None = "ig",
    attack_options: dict[str, Any] | None = None,
    progress: bool = False,
    **audit_kw: Any,
) -> list[DistancePoint]:
    """One :class:`DistancePoint` per hop distance of ``wanted`` (default: every distance the
    graph has from ``attacker``), the victim the lowest-numbered agent at that distance.
    ``attack`` None skips the reconstruction; ``attack_options`` go to it (``iterations``,
    ``restarts``, …); ``audit_kw`` to the audit (``canary_norm``, ``canary_shape``)."""
    n = run.cfg.agents
    if not 0 <= attacker < n:
        raise PrivauditError(f"the attacker must be an agent 0..{n - 1}, got {attacker}")
    picks = victims_by_distance(run.ctx.adj, attacker, wanted)
    if not picks:
        raise PrivauditError(
            f"no agent at distances {list(wanted or [])} from agent {attacker}; "
            "choose distances the graph has"
        )
    out = []
    for d, v in sorted(picks.items()):
        t0 = time.perf_counter()
        span = reach_span(run, target, round, [attacker], v)
        res = audit(
            run,
            target,
            "white-box",
            round,
            trials=trials,
            confidence=confidence,
            threat="coalition",
            attackers=[attacker],
            victim=v,
            span=span,
            seed=seed,
            progress=progress,
            **audit_kw,
        )
        search = res.details["search"]  # a white-box audit's canary search
        chosen = search["candidates"][search["chosen"]]
        point = DistancePoint(
            distance=d,
            victim=v,
            span=span,
            trials=res.trials,
            epsilon_lo=float(res.epsilon_lo),
            upper={k: float(u) for k, u in res.upper.items()},
            verdicts=dict(res.verdicts),
            shift=list(chosen.get("shift", [chosen["impact"]])),
            extra={"pairwise_share": res.accounting.get("pairwise_share")},
        )
        if attack is not None:
            point.psnr, point.psnr_note = _psnr(
                run, target, round, attacker, v, attack, seed, attack_options, progress
            )
        point.seconds = float(f"{time.perf_counter() - t0:.3f}")
        out.append(point)
    return out


def _psnr(
    run: Run,
    target: str,
    t: int,
    attacker: int,
    victim: int,
    attack: str,
    seed: int,
    options: dict[str, Any] | None,
    progress: bool,
) -> tuple[float | None, str | None]:
    """The gossip attack's PSNR on ``victim``'s round-t batch, or None and why."""
    opts = dict(options or {})
    kw = {k: opts.pop(k) for k in ("iterations", "restarts") if k in opts}
    try:
        a = reconstruct(
            run,
            target,
            t,
            attack=attack,
            threat="coalition",
            attackers=[attacker],
            victims=[victim],
            seed=seed,
            options=opts,
            lpips=False,
            progress=progress,
            **kw,
        )
    except Unobservable as e:
        why = str(e).rpartition("nor past its links: ")[2]
        return None, f"not identifiable: {why}"
    psnr = a.result.metrics["psnr"]
    if psnr is None or not math.isfinite(psnr):
        return None, "the victim's batch is empty in that round"
    return float(psnr), None
