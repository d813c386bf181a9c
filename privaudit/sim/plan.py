"""The observation planner: which message of which victim, seen by which adversary.

One answer for every command that observes a target (attack, audit, compare, claims,
membership inference), with one set of defaults:

- the victim: ``--victim``, else the first agent that is not an attacker;
- the adversary: ``--threat``; else, with ``--attacker`` given, ``neighbor`` for one agent
  and ``coalition`` for several; else the weakest searched threat model that observes the
  message (``link``, then ``neighbor`` — the victim's first receiver — then ``global``);
- the copy attacked: the one the adversary receives (:meth:`Threat.receiver`), or the
  ``--link`` named;
- beyond the adversary's own links (:meth:`Adversary.reaches_beyond`): only for named
  attackers of a threat model made of agents.

What the user named travels as one :class:`Adversary`, built once by the command.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from privaudit.core.errors import PrivauditError, Unobservable
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


@dataclass(frozen=True)
class Adversary:
    """Who observes which messages, as the user named them — built once by a command (or
    the API's entry point, :meth:`of`) and handed down, the planner filling in what is left
    open: ``threat`` (a registered threat model's name; None: the module's default search),
    ``links`` (the copies ``src → dst`` attacked; None: each victim's copy to the
    adversary), ``attackers`` (the agents the adversary is made of) and ``victims`` (whose
    messages are attacked; None: the first agent that is not an attacker)."""

    threat: str | None = None
    links: tuple[tuple[int, int], ...] | None = None
    attackers: tuple[int, ...] | None = None
    victims: tuple[int, ...] | None = None

    @classmethod
    def of(
        cls,
        adversary: Adversary | None = None,
        *,
        threat: str | None = None,
        links: Sequence[tuple[int, int]] | None = None,
        attackers: Sequence[int] | None = None,
        victims: Sequence[int] | None = None,
    ) -> Adversary:
        """``adversary`` as given, else one built from the loose arguments (the API's older
        form, kept); both at once is refused rather than merged."""
        loose = (threat, links, attackers, victims)
        if adversary is not None:
            if any(v is not None for v in loose):
                raise PrivauditError(
                    "give the adversary once: either adversary=Adversary(...) or threat=, "
                    "links=, attackers=, victims=, not both"
                )
            return adversary
        return cls(
            threat,
            None if links is None else tuple((int(s), int(d)) for s, d in links),
            None if attackers is None else tuple(int(a) for a in attackers),
            None if victims is None else tuple(int(v) for v in victims),
        )

    def threats(self) -> list[str]:
        """The threat models to try, in order: the one named; else, with attackers,
        ``neighbor`` for one agent and ``coalition`` for several; else every searched
        threat model, weakest first."""
        if self.threat is not None:
            return [self.threat]
        if self.attackers:
            return ["neighbor" if len(self.attackers) == 1 else "coalition"]
        return [n for n in threat_names() if THREATS[n].searched]

    def reaches_beyond(self) -> bool:
        """Whether this adversary, receiving no copy of a victim's message, may still be
        given it through the gossip algebra over what it received
        (:mod:`privaudit.api.gossip`): only named ``attackers`` of a threat model made of
        agents (``uses_attackers``: a neighbour, a coalition), never an eavesdropper on
        named ``links``. The one rule for every command."""
        if self.links or not self.attackers:
            return False
        return THREATS[self.threats()[0]].uses_attackers

    def victims_of(self, agents: int) -> list[int]:
        """The victims attacked in a run of ``agents``: those named, else the default."""
        if self.victims is not None:
            return list(self.victims)
        return [default_victim(agents, self.attackers or ())]

    def victim(self) -> int | None:
        """The one victim named (None: the default), for commands that attack one."""
        if self.victims is None:
            return None
        if len(self.victims) != 1:
            raise PrivauditError(f"one victim is attacked here, got {list(self.victims)}")
        return self.victims[0]

    def link(self) -> tuple[int, int] | None:
        """The one link named (None: the planner's), for commands that attack one."""
        if self.links is None:
            return None
        if len(self.links) != 1:
            raise PrivauditError(f"one link is attacked here, got {list(self.links)}")
        return self.links[0]


def receiver(run: Run, target: Target, threat: Threat, victim: int, t: int) -> int:
    """The agent whose copy of ``victim``'s round-``t`` message ``threat`` attacks."""
    receivers = target.defense.receivers(target.kind, t, victim, run.ctx.adj.cpu())
    return threat.receiver(victim, receivers, f"{target.kind!r} message in round {t}")


def sightings(
    run: Run, target: Target, t: int, threat: str, adversary: Adversary
) -> list[Sighting]:
    """One :class:`Sighting` per message of round ``t`` that ``adversary``, as the threat
    model ``threat``, observes: each named link, else each victim's copy to it
    (:class:`Unobservable` where it sees none)."""
    attackers = list(adversary.attackers or [])
    links = adversary.links
    if links:
        if threat == "link":
            return [Sighting(build_threat("link", link=link), *link) for link in links]
        th = build_threat(threat, attackers=attackers or [links[0][1]])
        return [Sighting(th, s, d) for s, d in links]
    out = []
    for v in adversary.victims_of(run.cfg.agents):
        receivers = target.defense.receivers(target.kind, t, v, run.ctx.adj.cpu())
        th = victim_threat(threat, v, receivers, attackers)
        out.append(
            Sighting(th, v, th.receiver(v, receivers, f"{target.kind!r} message in round {t}"))
        )
    return out


def sight(run: Run, target: Target, t: int, adversary: Adversary) -> list[Sighting]:
    """The sightings of the first of ``adversary``'s threat models that observes ``target``'s
    round-``t`` message (:func:`sightings`, :func:`first_observable`)."""
    return first_observable(
        target.name, t, adversary.threats(), lambda n: sightings(run, target, t, n, adversary)
    )


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
    adversary: Adversary | None = None,
    *,
    progress: bool = True,
    **loose: Any,
) -> list[tuple[Sighting, Observation]]:
    """Every message of ``target``'s round ``t`` that ``adversary`` observes, with the
    module's defaults, and its Observation as the adversary sees it (``obs.meta`` names
    target, round, link and adversary), capturing — or re-simulating from the nearest
    checkpoint — only the links and rounds it needs. ``loose``: ``threat``, ``links``,
    ``attackers``, ``victims`` in place of ``adversary`` (:meth:`Adversary.of`). The one
    answer to "which message, which adversary" for every command."""
    adv = Adversary.of(adversary, **loose)
    tgt = Target.of(target)
    target = tgt.name  # the name, in what is written
    tgt.check_run(run, t)
    rounds = [r for r in tgt.rounds_needed(t, run.cfg.agents) if r >= 1]

    def attempt(name: str) -> list[tuple[Sighting, Observation]]:
        plan = sightings(run, tgt, t, name, adv)
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

    return first_observable(target, t, adv.threats(), attempt)


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
