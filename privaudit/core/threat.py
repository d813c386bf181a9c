"""Threat models: who sees which messages (README, "Threat models: who listens").

A threat model decides two things: which links the tap must record for an attack on a
target message, and which of the recorded messages go into the adversary's :class:`View`.
The View holds those messages plus the public parameters (W, η, β, σ, C, B, the
architecture and the shared initial model); secrets never enter it.

Four adversaries, weakest first (:data:`ORDER`):

- ``link``: an eavesdropper on one undirected link ``a ↔ b`` (both directions);
- ``neighbor``: one honest-but-curious agent ``a`` — every message on its links, both what
  it sends and what it receives; its private state (data, batches, noise draws, values it
  never sends) is not in the View;
- ``coalition``: a set of agents pooling what each of them sees;
- ``global``: every message on every link.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from privaudit.core.errors import PrivauditError, Unobservable, unknown

Key = tuple[int, int, int, str]
ORDER = ("link", "neighbor", "coalition", "global")


@dataclass
class View:
    """What one adversary sees: messages keyed ``(round, src, dst, kind)`` and public facts."""

    threat: str
    messages: dict[Key, Tensor]
    public: dict[str, Any] = field(default_factory=dict)
    _sent: dict[tuple[int, int, str], Tensor] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for (t, s, _, k), v in self.messages.items():
            self._sent.setdefault((t, s, k), v)

    def get(self, t: int, src: int, dst: int, kind: str) -> Tensor:
        key = (t, src, dst, kind)
        if key not in self.messages:
            raise Unobservable(
                f"the {self.threat} adversary does not see the {kind!r} message {src}->{dst} "
                f"of round {t}; an adversary that does: --threat neighbor --attacker {dst}, "
                "or --threat global"
            )
        return self.messages[key]

    def has(self, t: int, src: int, dst: int, kind: str) -> bool:
        return (t, src, dst, kind) in self.messages

    def sent(self, t: int, src: int, kind: str) -> Tensor | None:
        """A ``kind`` message ``src`` sent in round ``t`` on any link the View holds, or None.

        Only meaningful for *broadcast* kinds (one payload on every out-link: models,
        momenta, tracking variables); per-link kinds (``cg``, ``noise``) use :meth:`get`."""
        return self._sent.get((t, src, kind))


@dataclass(frozen=True)
class Threat:
    """One adversary. ``link`` is set for ``link``; ``agents`` for ``neighbor`` (one agent)
    and ``coalition``; ``global`` needs neither."""

    name: str
    agents: frozenset[int] = frozenset()
    link: tuple[int, int] | None = None

    def sees(self, src: int, dst: int) -> bool:
        if self.name == "global":
            return True
        if self.link is not None:
            return {src, dst} == set(self.link)
        return src in self.agents or dst in self.agents

    def links(self, edges: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
        """The directed links of the graph this adversary taps."""
        return {e for e in edges if self.sees(*e)}

    def view(self, messages: dict[Key, Tensor], public: dict[str, Any]) -> View:
        seen = {k: v for k, v in messages.items() if self.sees(k[1], k[2])}
        return View(self.name, seen, dict(public))

    def receiver(self, victim: int, receivers: list[int], what: str) -> int:
        """The agent whose incoming copy of the victim's message this adversary attacks:
        the link's other end, the attacker, the first coalition member that receives it, or
        (global) the victim's first receiver. ``receivers``: who gets ``what`` from the
        victim; ``what`` names it in errors."""
        if victim in self.agents:
            raise Unobservable(
                f"agent {victim} is one of the attackers; choose a --victim outside "
                f"{sorted(self.agents)}"
            )
        if not receivers:
            raise Unobservable(f"agent {victim} sends no {what}; pick another round or victim")
        if self.name == "global":
            return receivers[0]
        pool = [b for b in receivers if self.sees(victim, b)]
        if not pool:
            who = (
                f"the link {self.link[0]}<->{self.link[1]}"
                if self.link
                else f"agent(s) {sorted(self.agents)}"
            )
            raise Unobservable(
                f"{who} receive no {what} from agent {victim}; it goes to "
                f"{', '.join(map(str, receivers))}: e.g. --threat neighbor --attacker "
                f"{receivers[0]}, or --threat global"
            )
        return pool[0]

    def describe(self) -> str:
        if self.link is not None:
            return f"link {self.link[0]}<->{self.link[1]}"
        if self.name == "neighbor":
            return f"neighbor {next(iter(self.agents))}"
        if self.name == "coalition":
            return f"coalition {','.join(map(str, sorted(self.agents)))}"
        return "global"


def parse_agents(text: str, n: int) -> list[int]:
    """``"3"`` or ``"1,4,7"`` → agent ids in ``0..n-1``, or one clear error."""
    try:
        ids = [int(s) for s in str(text).split(",") if s.strip()]
    except ValueError:
        raise PrivauditError(f"agents must be comma-separated ids, got {text!r}") from None
    bad = [i for i in ids if not 0 <= i < n]
    if not ids or bad:
        raise PrivauditError(f"agent ids must be in 0..{n - 1}, got {text!r}")
    return ids


def parse_link(text: str, edges: list[tuple[int, int]]) -> tuple[int, int]:
    """``"SRC,DST"`` → a directed edge of the graph, or one clear error."""
    try:
        src, dst = (int(s) for s in text.split(","))
    except ValueError:
        raise PrivauditError(f"--link must be SRC,DST (two agent ids), got {text!r}") from None
    if (src, dst) not in edges:
        near = ", ".join(f"{s},{d}" for s, d in edges[:6])
        raise PrivauditError(f"{src},{dst} is not a link of the topology; links are e.g. {near}")
    return src, dst


def parse_links(texts: Iterable[str], edges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Every ``--link`` as a directed edge (:func:`parse_link`); a link named twice is an
    error (it would be attacked and counted twice)."""
    links = [parse_link(text, edges) for text in texts]
    twice = sorted({link for link in links if links.count(link) > 1})
    if twice:
        names = " ".join(f"--link {s},{d}" for s, d in twice)
        raise PrivauditError(f"{names} is given more than once; name each link once")
    return links


def build_threat(
    name: str,
    *,
    link: tuple[int, int] | None = None,
    attackers: Iterable[int] = (),
) -> Threat:
    """A :class:`Threat` from its name and what it needs: ``link`` for ``link``, one
    attacker for ``neighbor``, one or more for ``coalition``."""
    if name not in ORDER:
        raise unknown("threat model", name, ORDER)
    agents = frozenset(attackers)
    if name == "link":
        if link is None:
            raise PrivauditError("--threat link needs the link: --link SRC,DST")
        return Threat("link", link=link)
    if name == "neighbor":
        if len(agents) != 1:
            raise PrivauditError("--threat neighbor needs one agent: --attacker A")
        return Threat("neighbor", agents)
    if name == "coalition":
        if not agents:
            raise PrivauditError("--threat coalition needs its members: --attacker A,B,...")
        return Threat("coalition", agents)
    return Threat("global")


def victim_threat(
    name: str, victim: int, receivers: list[int], attackers: Iterable[int] = ()
) -> Threat:
    """The adversary that attacks ``victim``'s message when no link is named, with the
    defaults of ``privaudit attack`` and ``privaudit audit``: ``link`` taps the link to the
    first receiver; ``neighbor`` without ``attackers`` is the first receiver, ``coalition``
    without them every receiver. ``receivers``: who gets the message from the victim."""
    attackers = list(attackers)
    if name == "link":
        return build_threat("link", link=(victim, receivers[0]) if receivers else (victim, victim))
    if name == "neighbor" and not attackers:
        return build_threat("neighbor", attackers=receivers[:1])
    if name == "coalition" and not attackers:
        return build_threat("coalition", attackers=receivers)  # all who receive it
    return build_threat(name, attackers=attackers)
