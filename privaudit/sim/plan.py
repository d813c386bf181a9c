"""The observation planner: which message of which victim, seen by which adversary.

One answer for every command that observes a target (attack, audit, compare, claims,
membership inference), with one set of defaults:

- the victim: ``--victim``, else the first agent that is not an attacker;
- the adversary: ``--threat``; else, with ``--attacker`` given, ``neighbor`` for one agent
  and ``coalition`` for several; else the weakest searched threat model that observes the
  message (``link``, then ``neighbor`` — the victim's first receiver — then ``global``);
- the copy attacked: the one the adversary receives (:meth:`Threat.receiver`), or the
  ``--link`` named;
- beyond the adversary's own links (:func:`reaches_beyond`): only for named attackers of a
  threat model made of agents.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from privaudit.core.errors import Unobservable
from privaudit.core.messages import CaptureSpec
from privaudit.core.observation import Observation
from privaudit.core.threat import THREATS, Threat, build_threat, threat_names, victim_threat
from privaudit.sim.loop import calling
from privaudit.sim.run import Run
from privaudit.sim.targets import Target

X = TypeVar("X")


@dataclass(frozen=True)
class Sighting:
    """One observed message: the adversary, and the copy ``src → dst`` it attacks."""

    threat: Threat
    src: int
    dst: int


def default_victim(agents: int, attackers: Sequence[int] = ()) -> int:
    """The first agent that is not an attacker."""
    return next(i for i in range(agents) if i not in attackers)


def candidate_threats(threat: str | None, attackers: Sequence[int] | None) -> list[str]:
    """The threat models to try, in order (the module's defaults)."""
    if threat is not None:
        return [threat]
    if attackers:
        return ["neighbor" if len(attackers) == 1 else "coalition"]
    return [n for n in threat_names() if THREATS[n].searched]


def reaches_beyond(
    threat: str | None,
    attackers: Sequence[int] | None,
    links: Sequence[tuple[int, int]] | None = None,
) -> bool:
    """Whether an adversary that receives no copy of a victim's message may still be given
    it through the gossip algebra over what it received (:mod:`privaudit.api.gossip`): only
    named ``attackers`` of a threat model made of agents (``uses_attackers``: a neighbour, a
    coalition), never an eavesdropper on named ``links``. The one rule for every command."""
    if links or not attackers:
        return False
    return THREATS[candidate_threats(threat, attackers)[0]].uses_attackers


def receiver(run: Run, target: Target, threat: Threat, victim: int, t: int) -> int:
    """The agent whose copy of ``victim``'s round-``t`` message ``threat`` attacks."""
    receivers = target.defense.receivers(target.kind, t, victim, run.ctx.adj.cpu())
    return threat.receiver(victim, receivers, f"{target.kind!r} message in round {t}")


def sightings(
    run: Run,
    target: Target,
    t: int,
    threat: str,
    *,
    links: Sequence[tuple[int, int]] | None = None,
    attackers: Sequence[int] | None = None,
    victims: Sequence[int] | None = None,
) -> list[Sighting]:
    """One :class:`Sighting` per observed message of round ``t``: each named link, else each
    victim's copy to the adversary (:class:`Unobservable` where it sees none)."""
    attackers = list(attackers or [])
    if links:
        if threat == "link":
            return [Sighting(build_threat("link", link=link), *link) for link in links]
        th = build_threat(threat, attackers=attackers or [links[0][1]])
        return [Sighting(th, s, d) for s, d in links]
    if victims is None:
        victims = [default_victim(run.cfg.agents, attackers)]
    out = []
    for v in victims:
        receivers = target.defense.receivers(target.kind, t, v, run.ctx.adj.cpu())
        th = victim_threat(threat, v, receivers, attackers)
        out.append(
            Sighting(th, v, th.receiver(v, receivers, f"{target.kind!r} message in round {t}"))
        )
    return out


def first_observable(target: str, t: int, threats: Sequence[str], attempt: Callable[[str], X]) -> X:
    """``attempt(threat)`` for each of ``threats`` in turn, until one observes the message;
    only :class:`Unobservable` moves on (an interrupt or a broken run ends the command)."""
    errors = []
    for name in threats:
        try:
            return attempt(name)
        except Unobservable as e:
            if len(threats) == 1:
                raise
            errors.append(f"{name}: {e}")
    raise Unobservable(f"no adversary observes {target} at round {t} ({errors[-1]})")


def locate(
    run: Run,
    target: str | Target,
    t: int,
    *,
    threat: str | None = None,
    links: Sequence[tuple[int, int]] | None = None,
    attackers: Sequence[int] | None = None,
    victims: Sequence[int] | None = None,
    progress: bool = True,
) -> list[tuple[Sighting, Observation]]:
    """Every observed message of ``target``'s round ``t`` with the module's defaults, and its
    Observation as the adversary sees it (``obs.meta`` names target, round, link and
    adversary), capturing — or re-simulating from the nearest checkpoint — only the links and
    rounds it needs. The one answer to "which message, which adversary" for every command."""
    tgt = Target.of(target)
    target = tgt.name  # the name, in what is written
    tgt.check_run(run, t)
    rounds = [r for r in tgt.rounds_needed(t, run.cfg.agents) if r >= 1]

    def attempt(name: str) -> list[tuple[Sighting, Observation]]:
        plan = sightings(run, tgt, t, name, links=links, attackers=attackers, victims=victims)
        capture = CaptureSpec.of(
            rounds=rounds, links=set().union(*(p.threat.links(run.edges()) for p in plan))
        )
        messages = run.messages(capture, progress=progress)
        public = run.public()
        out = []
        for p in plan:
            with calling(tgt.defense, "observe", t):  # a plugin's bug: one line naming it
                obs = tgt.defense.observe(
                    p.threat.view(messages, public), tgt.kind, t, p.src, p.dst
                )
            obs.meta.update(
                target=target, round=t, src=p.src, dst=p.dst, threat=p.threat.describe()
            )
            out.append((p, obs))
        return out

    return first_observable(target, t, candidate_threats(threat, attackers), attempt)


def given_batch_size(run: Run, obs: Observation, t: int) -> Observation:
    """``obs`` for an attacker told the realised size b of the victim's batch of round ``t``
    (from the run's secrets): ``batch_size`` b, and ``scale`` × b/B, because a defense's
    batch mean is (1/B) Σ over the b real examples = (b/B) × their mean (B the expected size,
    :mod:`privaudit.core.sampling`). A term on another batch (``meta["term_rounds"]``, else
    round ``t``) of b' examples gets its coefficient × b'/b: the attack models that batch
    with b dummies too. b = 0 leaves nothing to reconstruct (scale 0)."""
    B = run.cfg.batch_size
    src = obs.meta["src"]
    rounds = obs.meta.get("term_rounds", [t] * len(obs.terms))
    size = {r: run.batch_sizes(r)[src] for r in {t, *rounds}}  # one secrets read per round
    b = size[t]
    terms = []
    for (params, coef, same), r in zip(obs.terms, rounds, strict=True):
        if not same and b > 0:
            coef = coef * size[r] / b
        terms.append((params, coef, same))
    return dataclasses.replace(obs, batch_size=b, scale=obs.scale * b / B, terms=terms)
