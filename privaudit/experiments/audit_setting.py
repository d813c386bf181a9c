"""The audited message: which round, sender and receiver an audit scores, as which adversary.

:func:`audited_message` takes the message an attack on a target's round observes, by the
planner's defaults (:func:`privaudit.sim.plan.locate`). Named attackers that receive no copy of
the victim's message (a victim beyond their neighbourhood) give a ``beyond`` setting instead:
everything the coalition receives is audited, the victim ``distance`` hops away.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from privaudit.core.errors import Unobservable
from privaudit.core.threat import victim_threat
from privaudit.scenario.topology import distances
from privaudit.sim.plan import Adversary, locate
from privaudit.sim.run import Run
from privaudit.sim.targets import Target


@dataclass
class Setting:
    """The audited message: ``target``'s round-``t`` message ``src → dst`` as ``threat`` sees
    it, and the mechanism facts of the victim's data. ``beyond``: the adversary receives no
    copy of it (``dst`` None); what it receives over the span is observed instead, the victim
    ``distance`` hops from the nearest attacker."""

    run: Run
    target: Target
    t: int
    threat: Any
    src: int
    dst: int | None
    privacy: Any
    beyond: bool = False
    distance: int = 1

    @property
    def defense(self) -> Any:
        return self.target.defense

    @property
    def kind(self) -> str:
        return self.target.kind


def audited(
    adversary: Adversary | None,
    threat: str | None = None,
    link: tuple[int, int] | None = None,
    attackers: list[int] | None = None,
    victim: int | None = None,
) -> Adversary:
    """The audit's adversary: ``adversary``, else the loose ``threat``, ``link``,
    ``attackers`` and ``victim`` (:meth:`Adversary.of`); an audit attacks one link and one
    victim's message."""
    adv = Adversary.of(
        adversary,
        threat=threat,
        links=None if link is None else [link],
        attackers=attackers,
        victims=None if victim is None else [victim],
    )
    adv.link()  # refuses more than one link
    adv.victim()  # refuses more than one victim
    return adv


def audited_message(
    run: Run,
    target: str | Target,
    t: int,
    adversary: Adversary | None = None,
    span: int = 0,
    progress: bool = False,
) -> Setting:
    """The audited message: the one an attack on ``target``'s round ``t`` by ``adversary``
    observes, by the planner's defaults (:func:`privaudit.sim.plan.locate`), on a run that
    shows ``span`` rounds more. Attackers that receive no copy of the victim's message (a
    victim beyond their neighbourhood) give a ``beyond`` setting: what they receive is
    audited. ``adversary`` None: the planner's default."""
    adversary = adversary or Adversary()
    tgt = Target.of(target)
    target = tgt.name  # the name, in what is written
    tgt.check_run(run, t, span)
    far = _beyond(run, tgt, t, adversary)
    if far is not None:
        return far
    ((p, _),) = locate(run, tgt, t, adversary, progress=progress)
    return Setting(run, tgt, t, p.threat, p.src, p.dst, tgt.privacy(run, p.src))


def _beyond(run: Run, tgt: Target, t: int, adversary: Adversary) -> Setting | None:
    """The ``beyond`` setting when named attackers (a neighbor or a coalition) receive no
    copy of the named victim's round-``t`` message; None otherwise (the planner decides,
    and explains any other failure)."""
    victim, attackers = adversary.victim(), adversary.attackers or ()
    if not adversary.reaches_beyond() or victim is None or victim in attackers:
        return None
    name = adversary.threats()[0]
    adj = run.ctx.adj.cpu()
    receivers = tgt.defense.receivers(tgt.kind, t, victim, adj)
    th = victim_threat(name, victim, receivers, list(attackers))
    if any(th.sees(victim, b) for b in receivers):
        return None
    hops = distances(adj)[sorted(th.agents), victim]
    if bool((hops < 0).all()):
        raise Unobservable(f"agent {victim} cannot be reached from agents {sorted(th.agents)}")
    d = int(hops[hops >= 0].min())
    privacy = tgt.privacy(run, victim)
    return Setting(run, tgt, t, th, victim, None, privacy, beyond=True, distance=d)
