"""An attack on a victim at any distance: the gossip algebra on a run's captured messages.

El Mrini, Cyffers & Bellet ("Privacy Attacks in Decentralized Learning", ICML 2024): when a
defense's messages follow a known linear recursion in the public gossip matrix W
(:meth:`~privaudit.defenses.base.Defense.recursion`,
s_t = A_t s_{t-1} + B_t u_t), a coalition A that records every message it receives over
rounds 1..T holds a linear system y = K u + C k + M z in everyone's updates u (k: what it
knows, the shared x_0; z: Gaussian noise of known std). Agent v's round-t update g_v^t is
reconstructable — even when v is no neighbour of A — exactly when e_{g_v^t} ∈ row(K); it is
then the best linear unbiased estimate r^T (y − C k) with Kᵀ r = e, of per-coordinate std
‖Mᵀ r‖ (0 without noise). :func:`observe_beyond` does this on a run: it builds the system
from the defense's recursion, checks identifiability before capturing anything, captures
the coalition's links, solves, and hands an ordinary
:class:`~privaudit.core.observation.Observation` to the attacks — the recovered update as
``target``, the victim's model at its evaluation point (itself estimated the same way) as
``params``, the estimator's std as ``noise_std``.

Which defenses it reaches past the neighbourhood is a property of their recursion. D-PSGD
(``dsgd``, ``dp-dpsgd``) gossips one value per agent and round, and each carries a fresh
unknown update: in the coordinates of the half-steps x̃ the coalition observes exactly the
x̃ of its members and their neighbours, so g_v^t = (Σ_j w_vj x̃_j^{t-1} − x̃_v^t)/η is
identifiable iff v is heard and, for t ≥ 2, so are all of v's neighbours — the exact case of
``observe``, and never a non-neighbour, however many rounds are recorded. El Mrini et al.'s
D-GD attack goes further by assuming each agent's gradient constant over the rounds
(``tie=True``, :func:`privaudit.attacks.gossip_algebra.tie`): an approximation, first order in the
step size, and only offered for full-batch runs (q = 1: every round's batch is the whole
shard), since a fresh Poisson batch each round makes it wrong by the batch noise. Gradient
tracking (``dsgt``) sends two values (θ, γ) per agent and round with one fresh unknown, and
there a single attacker on a ring of 5 recovers both agents two hops away, exactly
(:func:`privaudit.core.recursion.tracking`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from privaudit.api.gossip_forecast import RunForecast, applies
from privaudit.attacks.gossip_algebra import (
    STATE,
    Identifiability,
    LinearSystem,
    Message,
    Recovery,
    estimate,
    gossip_messages,
    identifiability,
    knowledge,
    relative_error,
    state_functional,
    unit_roundoff,
)
from privaudit.attacks.gossip_drift import EXPLAIN, Drifted, solve_tied
from privaudit.core.accounting import sample_rates
from privaudit.core.errors import PrivauditError, Unobservable
from privaudit.core.messages import CaptureSpec
from privaudit.core.observation import Observation
from privaudit.core.recursion import Key, Recursion
from privaudit.core.threat import build_threat
from privaudit.defenses.base import neighbours
from privaudit.scenario.topology import distances
from privaudit.sim.plan import default_victim, given_batch_size
from privaudit.sim.run import Run
from privaudit.sim.targets import Target


def observe_beyond(
    run: Run,
    target: str | Target,
    round: int,
    attackers: Sequence[int],
    victims: Sequence[int] | None = None,
    *,
    rounds_back: int | None = None,
    rounds_ahead: int | None = None,
    tie: bool = False,
    progress: bool = True,
    max_error: float | None = 1.0,
    forecast: bool = True,
) -> list[Observation]:
    """One Observation per victim of its round-``round`` update, reconstructed by the
    coalition ``attackers`` from every ``target``-defense message it receives (the gossip
    algebra, module docstring) — also for a victim beyond the coalition's neighbourhood.

    ``victims``: default the first agent outside the coalition. ``rounds_back``: use the
    messages of rounds round − rounds_back .. (≥ 1; the recursion restarts there with every
    state unknown), default every round from 1 (x_0 public). ``rounds_ahead``: use rounds up
    to round + rounds_ahead (capped at the run's last), default the victims' largest hop
    distance from the coalition (an update two hops out reaches the coalition's neighbours a
    round later, and is separated from the next updates a round after that); with ``tie``,
    every round to the run's last. ``tie``: El Mrini et al.'s gradient-similarity
    approximation — every non-member's update is taken to be the same in every round used
    (:func:`~privaudit.attacks.gossip_algebra.tie`, its error stated there), which reaches agents
    beyond the neighbourhood under D-PSGD; refused unless every agent's batch is its whole
    shard (``--sampling full``: full-batch D-GD), ``meta["exact"]`` is then False.
    ``max_error``: after the capture, a victim whose recovered update carries an estimated
    rounding error (:func:`~privaudit.attacks.gossip_algebra.float_error`, from the payloads' float
    type) of at least this fraction of its signal
    (:func:`~privaudit.attacks.gossip_algebra.relative_error`) is refused as lost to rounding,
    though structurally identifiable; None: never.

    Identifiability is decided on the recursion alone, before anything is captured; a
    victim whose update (or whose model at its evaluation point) lies outside the knowledge
    matrix's row space raises :class:`Unobservable` with the rank, the rounds used and the
    fix. The Observation is what the defense's own ``observe`` would give for that update:
    ``target`` the recovered gradient, ``params`` the victim's model where it was computed,
    ``noise_std`` the estimator's per-coordinate std ‖Mᵀr‖ (σC/B for ``dp-dpsgd``),
    ``clip`` as the recursion states, and the realised batch size told
    (:func:`~privaudit.api.pipeline.given_batch_size`). ``meta``: target, round, src (the
    victim), dst None, threat ``coalition A (gossip algebra, N rounds, rank r, agent v:
    rounding error e of its update)``,
    ``identifiable``, ``rank``, ``distance`` (hops from the coalition), ``gain`` (‖r‖, what
    unit noise on every row would become), ``float_error`` and ``float_error_rel`` (the
    estimated per-coordinate rounding error of the update, absolute and relative to its
    signal; also in ``threat``), ``rounds`` (first and last used) and ``attackers``.

    ``forecast`` (with ``tie``): the drift forecast — every identifiable non-member solved,
    the run re-simulated from what was recovered and the tied system solved again with the
    forecast drift taken out (:mod:`privaudit.api.gossip_forecast`), where the run allows it
    (one example per agent, the window from x_0); the victim's update and model at rounds
    after the first carry their forecast drift. ``meta["forecast"]``: the agents forecast,
    the trust kept and the passes' misfits, or why none was used."""
    tgt = Target.of(target)
    target = tgt.name  # the name, in what is written
    tgt.check_run(run, round)
    members, victims, rec = _coalition(run, tgt, target, attackers, victims, tie)
    adj = run.ctx.adj.cpu()
    hops, first, last = _window(run, adj, members, victims, round, rounds_back, rounds_ahead, tie)

    sub = rec.shifted(first)
    system = coalition_system(sub, adj, members, first, last, tie)
    analysis = identifiability(system)
    plans: list[tuple[Recovery, list[dict[Key, float]]]] = []
    for v in victims:
        if analysis.status((sub.update, v, round - first)) != "identifiable":
            raise Unobservable(
                _why(run, rec, adj, members, v, round, first, last, analysis, hops, tie)
            )
        plans.append(_plan(system, analysis, sub, v, round, first, last, members))
    return _observations(
        run,
        tgt,
        target,
        round,
        members,
        victims,
        hops,
        first,
        last,
        tie,
        progress,
        rec,
        sub,
        system,
        plans,
        max_error,
        forecast,
        analysis,
    )


def identifiable_victims(
    run: Run, target: str | Target, round: int, attackers: Sequence[int], *, tie: bool = False
) -> list[int]:
    """The agents outside the coalition ``attackers`` whose round-``round`` update
    :func:`observe_beyond` (default window; ``tie`` as there) finds identifiable, decided on
    the recursion alone (nothing is captured) — the victims to hand it. A victim it then
    refuses as lost to rounding is told by the payloads only (``max_error``)."""
    tgt = Target.of(target)
    tgt.check_run(run, round)
    members, _, rec = _coalition(run, tgt, tgt.name, attackers, None, tie)
    adj = run.ctx.adj.cpu()
    inside = set(members)
    reach = [v for v in range(rec.n) if v not in inside]
    hops = _window(run, adj, members, reach[:1], round, None, None, tie)[0]
    out, analyses = [], {}
    # each victim in its own window (more rows never hide an update, so it stays
    # identifiable in the longer window of a victim farther out)
    for h in sorted({hops[v] for v in reach if hops[v] >= 0}):
        group = [v for v in reach if hops[v] == h]
        _, first, last = _window(run, adj, members, group, round, None, None, tie)
        sub = rec.shifted(first)
        if (first, last) not in analyses:
            system = coalition_system(sub, adj, members, first, last, tie)
            analyses[first, last] = identifiability(system)
        analysis = analyses[first, last]
        out += [
            v for v in group if analysis.status((sub.update, v, round - first)) == "identifiable"
        ]
    return sorted(out)


def _coalition(
    run: Run,
    tgt: Target,
    target: str,
    attackers: Sequence[int],
    victims: Sequence[int] | None,
    tie: bool,
) -> tuple[list[int], list[int], Recursion]:
    """The checked coalition, the victims (default: the first agent outside it) and the
    defense's recursion — :func:`observe_beyond`'s refusals that need no topology, raised
    before anything else is built."""
    n = run.cfg.agents
    members = sorted({int(a) for a in attackers})
    if not members or not 0 <= members[0] <= members[-1] < n:
        raise PrivauditError(
            f"the gossip algebra needs a coalition of agents in 0..{n - 1}, got {list(attackers)}; "
            "name its agents (--attacker A,B)"
        )
    if len(members) == n:
        raise PrivauditError("every agent is an attacker; leave at least one victim outside")
    victims = list(victims) if victims else [default_victim(n, members)]
    if tie:
        _full_batch(run)
    rec = tgt.defense.recursion(run.params, run.ctx.W.cpu(), run.cfg.batch_size)
    if rec is None:
        raise Unobservable(
            f"{tgt.defense.name} states no linear recursion (Defense.recursion), so the gossip "
            "algebra cannot see past the coalition's links; attack a neighbour of it instead"
        )
    if tgt.kind not in rec.carries:
        raise Unobservable(
            f"{target}'s messages are not part of {tgt.defense.name}'s recursion; use "
            f"{', '.join(f'{tgt.defense.name}-{k}' for k in rec.carries)}"
        )
    return members, victims, rec


def _window(
    run: Run,
    adj: Tensor,
    members: list[int],
    victims: list[int],
    round: int,
    rounds_back: int | None,
    rounds_ahead: int | None,
    tie: bool,
) -> tuple[list[int], int, int]:
    """Every agent's hop distance from the coalition (−1: unreachable) and the rounds
    ``first``..``last`` whose messages are used — checked against the victims, since how
    far ahead to look depends on how far out they are (:func:`observe_beyond`)."""
    n = run.cfg.agents
    dist = distances(adj)[members]
    far = n + 1  # unreachable (−1) counts as farther than any path
    hops = [-1 if h == far else h for h in torch.where(dist < 0, far, dist).min(0).values.tolist()]
    for v in victims:
        if not 0 <= v < n:
            raise PrivauditError(f"victim {v} is not an agent of this run (0..{n - 1})")
        if v in members:
            raise Unobservable(
                f"agent {v} is one of the attackers; choose a victim outside {members}"
            )
        if hops[v] < 0:
            raise Unobservable(f"agent {v} cannot be reached from the coalition {members}")
    if rounds_back is not None and rounds_back < 1:
        raise PrivauditError(f"rounds_back must be at least 1, got {rounds_back}")
    first = 0 if rounds_back is None else max(0, round - rounds_back)
    if rounds_ahead is None:
        ahead = run.cfg.rounds - round if tie else max(hops[v] for v in victims)
    else:
        ahead = rounds_ahead
    if ahead < 0:
        raise PrivauditError(f"rounds_ahead must be at least 0, got {rounds_ahead}")
    last = min(run.cfg.rounds, round + ahead)
    return hops, first, last


def _observations(
    run: Run,
    tgt: Target,
    target: str,
    round: int,
    members: list[int],
    victims: list[int],
    hops: list[int],
    first: int,
    last: int,
    tie: bool,
    progress: bool,
    rec: Recursion,
    sub: Recursion,
    system: LinearSystem,
    plans: list[tuple[Recovery, list[dict[Key, float]]]],
    max_error: float | None = 1.0,
    forecast: bool = True,
    analysis: Identifiability | None = None,
) -> list[Observation]:
    """Capture the coalition's links over the rounds used and apply each victim's planned
    estimator to them: the capture comes last, after every victim is known identifiable,
    so a refusal costs no replay. Under ``tie`` with ``forecast``, the rows lose the drift
    the forecast predicts first (:func:`_forecast`)."""
    threat = build_threat("coalition", attackers=members)
    # every kind on the coalition's links, as the planner captures (a round's file records
    # which links were tapped, not which kinds)
    capture = CaptureSpec.of(rounds=range(max(first, 1), last + 1), links=threat.links(run.edges()))
    messages = run.messages(capture, progress=progress)
    view = threat.view(messages, run.public())
    drift: Drifted | None = None
    told: dict[str, Any] | str | None = None
    if tie:
        why = applies(run, first) if forecast else "forecast=False"
        if why is None:
            drift, told = _forecast(
                run,
                tgt,
                sub,
                system,
                analysis or identifiability(system),
                members,
                messages,
                view,
                last,
            )
        else:
            told = f"not used: {why}"
    out = []
    for v, (plan, targets) in zip(victims, plans, strict=True):
        shift = None if drift is None else drift.shift
        g, at, fe = _apply(system, sub, plan, targets, messages, first, run.ctx.x0.cpu(), shift)
        if drift is not None:
            g, at = (
                g + _drifted(targets[0], drift.drift),
                at + _drifted(targets[1], drift.drift),
            )
        rel = float(relative_error(g.numpy()[None], np.array([fe]))[0])
        if max_error is not None and rel >= max_error:
            gain = float(np.linalg.norm(plan.weights[0]))
            raise Unobservable(
                f"agent {v}'s round-{round} update is identifiable from coalition {members}'s "
                f"messages but lost to their rounding: its estimated error is {rel:.2g}× its "
                f"size ({hops[v]} hops away, estimator gain {gain:.2g}); attack a nearer "
                "agent, or add attackers around it (--attacker)"
            )
        meta = {
            "target": target,
            "round": round,
            "src": v,
            "dst": None,
            "threat": f"coalition {','.join(map(str, members))} (gossip algebra"
            f"{_tied_words(told)}, {last - max(first, 1) + 1} rounds, "
            f"rank {plan.rank}, agent {v}: rounding error {rel:.1g} of its update)",
            "identifiable": True,
            "rank": plan.rank,
            "distance": int(hops[v]),
            "gain": float(np.linalg.norm(plan.weights[0])),
            # the payloads' rounding in the recovered update: per-coordinate RMS, and
            # relative to the update's signal (what decides whether it is still one)
            "float_error": fe,
            "float_error_rel": rel,
            "rounds": [max(first, 1), last],
            "attackers": members,
            # unbiased, no approximation (noise_std says the rest) unless updates are tied
            "exact": not tie,
            "tied": tie,
            "forecast": told,
        }
        obs = tgt.defense.make_observation(
            view, at, g, noise_std=float(plan.std[0]), meta=meta, **dict(rec.facts)
        )
        out.append(given_batch_size(run, obs, round))
    return out


def _forecast(
    run: Run,
    tgt: Target,
    rec: Recursion,
    system: LinearSystem,
    analysis: Identifiability,
    members: list[int],
    messages: dict,
    view: Any,
    last: int,
) -> tuple[Drifted, dict[str, Any]]:
    """The drift forecast on the captured rows (rounds 1..``last`` from x_0): every
    identifiable non-member solved on the tied ``system``, then re-solved with the drift of
    the run re-simulated from them taken out (:func:`~privaudit.attacks.gossip_drift.
    solve_tied`, :class:`~privaudit.api.gossip_forecast.RunForecast`). Returns what it
    settled on and what it says of it (``meta["forecast"]``)."""
    sent = _by_sender(messages)
    x0 = run.ctx.x0.detach().cpu().to(torch.float64).reshape(-1)
    value = _known(system, rec, sent, 0, x0)
    where = {key: j for j, key in enumerate(system.known)}
    observed = np.stack(
        [
            sent[(m.t, m.src, rec.kind_of(m.component))].detach().cpu().double().reshape(-1).numpy()
            for m in system.rows
        ]
    )
    inside = set(members)
    keys = [
        (rec.update, k, 1)
        for k in range(rec.n)
        if k not in inside and analysis.status((rec.update, k, 1)) == "identifiable"
    ]
    carried = next(iter(rec.carries))
    states = {
        (m, t): sent[(t, m, carried)].detach().cpu().double().reshape(-1).numpy()
        for m in members
        for t in range(1, last + 1)
        if (t, m, carried) in sent
    }
    forecast = RunForecast(
        run,
        rec,
        last,
        lambda g: tgt.defense.make_observation(view, run.ctx.x0.cpu(), g, **dict(rec.facts)),
        states,
    )
    drift = solve_tied(
        system,
        coalition_system(rec, run.ctx.adj.cpu(), members, 0, last),
        observed,
        lambda key: value(where[key])[0].numpy(),
        analysis,
        keys,
        reference=x0.numpy(),
        forecast=forecast,
    )
    told = {
        # a held agent's drift is 0 exactly: the re-simulated ones are those with any
        "agents forecast": len({key[1] for key, o in drift.drift.items() if o.any()}),
        "non-members solved": len(drift.got),
        "trust": drift.trust,
        "misfits": drift.misfits,
    }
    return drift, told


def _tied_words(told: dict[str, Any] | str | None) -> str:
    """The threat line's words for the tie and its drift forecast (``meta["forecast"]``)."""
    if told is None:
        return ""
    if isinstance(told, str):
        return f", tied updates, drift forecast {told}"
    passes = len(told["misfits"]) - 1
    if not passes:
        return (
            ", tied updates, drift forecast not used: none explained the messages "
            f"{EXPLAIN:g}× better than the tie"
        )
    return (
        f", tied updates less the drift forecast from {told['agents forecast']} re-simulated "
        f"agents ({passes} pass{'es' if passes > 1 else ''})"
    )


def _drifted(coeffs: dict[Key, float], offsets: Mapping[Key, np.ndarray]) -> Tensor:
    """Σ c · o over the drift ``offsets`` a functional's coefficients name: what the tied
    estimate of that functional misses of its drifted value."""
    total = torch.zeros(())
    for key, c in coeffs.items():
        if key in offsets:
            total = total + c * torch.from_numpy(offsets[key])
    return total


def _plan(
    system: LinearSystem,
    analysis: Identifiability,
    rec: Recursion,
    v: int,
    t: int,
    first: int,
    last: int,
    members: list[int],
) -> tuple[Recovery, list[dict[Key, float]]]:
    """The estimator of victim v's round-t update and of its model at the evaluation point,
    on the structure alone (zero payloads): their weights over the rows and their stds. The
    update is identifiable (checked); a point outside row(K) is refused. Returns the plan
    and its two targets (coefficients over the variables)."""
    targets = [{(rec.update, v, t - first): 1.0}, _point(system, rec, t - first, v)]
    rows = np.zeros((len(system.rows), 1))
    try:
        plan = estimate(system, targets, rows, _zeros, analysis, names=["update", "point"])
    except PrivauditError as e:
        if "not identifiable" not in str(e):
            raise
        raise Unobservable(
            f"agent {v}'s model at its round-{t} update is not identifiable from coalition "
            f"{members}'s messages of rounds {max(first, 1)}..{last} (its update is); add "
            "attackers around the victim (--attacker)"
        ) from None
    return plan, targets


def _apply(
    system: LinearSystem,
    rec: Recursion,
    plan: Recovery,
    targets: list[dict[Key, float]],
    messages: dict,
    first: int,
    x0: Tensor,
    shift: np.ndarray | None = None,
) -> tuple[Tensor, Tensor, float]:
    """The plan's estimates on the recorded payloads, row by row in float64 (memory of two
    models, whatever the number of rows): r_qᵀ (y − C k) + c_kᵀ k for each of ``targets``
    (the plan's), k the public x_0 and the coalition's own states. Each row is computed
    around x_0, (y − x_0) − Σ c (k − x_0) − x_0 (Σ c − 1) (every payload is x_0 plus small
    steps: no large, nearly equal numbers are subtracted). Also returns the update's
    per-coordinate rounding error (:func:`~privaudit.attacks.gossip_algebra.float_error`: u of the
    payloads' float type, times the weighted RMS of the rounded numbers). ``shift``: (R × d)
    taken off each row first (the forecast drift, :func:`_forecast`)."""
    sent = _by_sender(messages)
    x0 = x0.to(torch.float64).reshape(-1)
    known = _known(system, rec, sent, first, x0)
    acc = torch.zeros(plan.weights.shape[0], x0.numel(), dtype=torch.float64)
    power = np.zeros(len(system.rows))  # each row's rounded numbers, mean square
    roundoff = 0.0
    C = system.C.tocsr()
    for r, m in enumerate(system.rows):
        w = plan.weights[:, r]
        if not w.any():
            continue
        t, kind = m.t + first, rec.kind_of(m.component)
        payload = sent.get((t, m.src, kind))
        if payload is None:
            raise PrivauditError(
                f"the run holds no {kind!r} message of agent {m.src} in round {t}, which the "
                "defense's recursion says it sends; capture that round again (delete its "
                "messages folder)"
            )
        roundoff = max(roundoff, unit_roundoff(payload))
        y = payload.detach().cpu().to(torch.float64).reshape(-1) - x0
        if shift is not None:
            y -= torch.from_numpy(shift[r])
        power[r] = float((y + x0).pow(2).mean())
        total = 0.0
        for j, c in zip(C[r].indices.tolist(), C[r].data.tolist(), strict=True):
            k, rounded = known(j)
            y -= c * (k - x0)
            total += c
            power[r] += c * c * float(k.pow(2).mean()) if rounded else 0.0
        y -= (total - 1.0) * x0
        acc += torch.from_numpy(w)[:, None] * y
    for i, target in enumerate(targets):
        ck = system.functional(target)[1]
        for j in np.flatnonzero(ck).tolist():
            acc[i] += float(ck[j]) * known(j)[0]
    err = roundoff / np.sqrt(3.0) * float(np.sqrt(plan.weights[0] ** 2 @ power))
    return acc[0], acc[1], err


def _by_sender(messages: dict) -> dict[tuple[int, int, str], Tensor]:
    """The captured messages keyed (round, sender, kind): a payload is the same on each of
    its sender's links."""
    sent: dict[tuple[int, int, str], Tensor] = {}
    for (t, src, _, kind), m in messages.items():
        sent.setdefault((t, src, kind), m)
    return sent


def _known(
    system: LinearSystem, rec: Recursion, sent: dict, first: int, x0: Tensor
) -> Callable[[int], tuple[Tensor, bool]]:
    """The value of the system's known variable j, and whether it is a rounded payload: the
    public x_0 (exact), or a coalition member's state — a message it sent (``state:`` keys,
    and its initial state when the window starts after round 0)."""

    def value(j: int) -> tuple[Tensor, bool]:
        key = system.known[j]
        if key[0] in rec.public:
            if key[0] != "x0":
                raise PrivauditError(
                    f"the {rec.name} recursion makes {key} public, but only the shared x_0 "
                    "is known to an adversary; leave it out of Recursion.public"
                )
            return x0, False
        component, t = None, key[2]
        if key[0].startswith(STATE):
            component = key[0][len(STATE) :]
        elif key[2] == 0 and key[0][:-1] in rec.state and first > 0:
            component = key[0][:-1]
        if component is None or key[1] not in system.coalition:
            raise PrivauditError(
                f"the rows involve {key}, a value the coalition holds but no message carries; "
                f"state which message kind carries it in the {rec.name} recursion's carries"
            )
        payload = sent.get((t + first, key[1], rec.kind_of(component)))
        if payload is None:
            raise PrivauditError(
                f"the run holds no message of member {key[1]} in round {t + first}, which the "
                "coalition sent; capture that round again (delete its messages folder)"
            )
        return payload.detach().cpu().to(torch.float64).reshape(-1), True

    return value


def _zeros(key: Key) -> np.ndarray:
    return np.zeros(1)


def _full_batch(run: Run) -> None:
    """Refuse the tied approximation unless every agent's batch is its whole shard (q = 1):
    with fresh Poisson batches the round-to-round change of an agent's gradient is the batch
    noise, not a first-order drift in the step size. The fix names the run's own shards: a
    shard of K examples with batch size K is trained full-batch (``train --sampling full
    --examples-per-agent K``)."""
    sizes = [len(p) for p in run.ctx.parts]
    q = sample_rates(sizes, run.cfg.batch_size)
    if min(q) < 1:
        raise PrivauditError(
            f"tie=True assumes each agent's gradient is the same in every round (El Mrini et "
            f"al.'s D-GD), but this run draws fresh Poisson batches (q = {min(q):.3g} < 1 for "
            f"shards of up to {max(sizes)} examples); train it full-batch with --sampling full "
            "--examples-per-agent K (q = 1; 1: one example per agent), or leave tie off for "
            "the exact system"
        )


def _rows(rec: Recursion, adj: Tensor, members: list[int], first: int, last: int) -> list[Message]:
    """What the coalition records, as rows: for each carried component, every message a
    member receives from a non-member and each member's own, at state indices of rounds
    max(first, 1)..last (index = round − first)."""
    indices = range(max(first, 1) - first, last - first + 1)
    rows: list[Message] = []
    for component in dict.fromkeys(rec.carries.values()):
        rows += gossip_messages(adj, members, indices, component=component, own=(component,))
    return rows


def coalition_system(
    rec: Recursion, adj: Tensor, members: list[int], first: int, last: int, tie: bool = False
) -> LinearSystem:
    """The knowledge system with everything the coalition holds subtracted before solving
    (``cut``, :func:`~privaudit.attacks.gossip_algebra.knowledge`): its own updates and noise draws
    and its initial states are known variables, and so are its states at every later index
    — the messages it sent —, whose recorded values carry whatever reached it from the
    others (under ``tie``, their real, drifting updates rather than tied ones), as El Mrini
    et al. subtract the attackers' values. Public variables (the shared x_0) are known too.
    ``tie``: every non-member's update is one unknown over the rounds
    (:func:`~privaudit.attacks.gossip_algebra.tie`)."""
    rows = _rows(rec, adj, members, first, last)
    inside = set(members)
    others = [k for k in range(rec.n) if k not in inside] if tie else None
    return knowledge(
        rec,
        members,
        rows,
        rounds=last - first,
        known=lambda k: k[0] in rec.public or k[1] in inside,
        tied=others,
        cut=True,
    )


def _point(system: LinearSystem, rec: Recursion, t: int, v: int) -> dict[Key, float]:
    """The victim's model at the evaluation point of its update of (shifted) round t, as
    coefficients over the variables (:attr:`Recursion.point` through the unrolled states)."""
    if rec.point is None:
        raise Unobservable(
            f"the {rec.name} recursion does not say at which model an update is evaluated "
            "(Recursion.point); state it in the defense's recursion"
        )
    out: dict[Key, float] = {}
    for (component, j, s), c in rec.point(t, v).items():
        for key, x in state_functional(system, s, j, component).items():
            out[key] = out.get(key, 0.0) + c * x
    return out


def _identifiable(
    rec: Recursion,
    adj: Tensor,
    members: list[int],
    v: int,
    t: int,
    first: int,
    last: int,
    tie: bool = False,
) -> bool:
    sub = rec.shifted(first)
    a = identifiability(coalition_system(sub, adj, members, first, last, tie))
    return a.status((sub.update, v, t - first)) == "identifiable"


def _why(
    run: Run,
    rec: Recursion,
    adj: Tensor,
    members: list[int],
    v: int,
    t: int,
    first: int,
    last: int,
    analysis: Identifiability,
    hops: list[int],
    tie: bool = False,
) -> str:
    """One line: why agent v's round-t update is hidden, and the fix that works (checked on
    the structure): more rounds after it, or its neighbours in the coalition."""
    fixes = []
    horizon = t + 2 * run.cfg.agents  # checked on the structure, past the run's end too
    if _identifiable(rec, adj, members, v, t, first, horizon, tie):
        lo, hi = last + 1, horizon  # more rows never hide a variable: bisect the horizon
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (
                (lo, mid)
                if _identifiable(rec, adj, members, v, t, first, mid, tie)
                else (mid + 1, hi)
            )
        fixes.append(
            f"observe up to round {lo} (rounds_ahead={lo - t})"
            if lo <= run.cfg.rounds
            else f"use a run of at least {lo} rounds (--rounds {lo})"
        )
    if first > 0 and _identifiable(rec, adj, members, v, t, 0, last, tie):
        fixes.append("use every round from 1 (rounds_back=None)")
    wider = sorted(set(members) | set(neighbours(adj, v)))
    if _identifiable(rec, adj, wider, v, t, first, last, tie):
        fixes.append(
            f"add its neighbours to the coalition (--attacker {','.join(map(str, wider))})"
        )
    fix = " or ".join(fixes) if fixes else "no coalition of its neighbours identifies it either"
    used = int(np.unique(analysis.system.K.indices).size)
    away = f"{hops[v]} hop{'s' * (hops[v] != 1)} away"
    return (
        f"coalition {members} cannot identify agent {v}'s round-{t} update from its "
        f"{rec.name} messages of rounds {max(first, 1)}..{last} (knowledge rank "
        f"{analysis.rank} over {used} unknowns; agent {v} is {away}): {fix}"
    )
