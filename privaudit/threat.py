"""Threat models: who sees which messages (DESIGN.md, "Threat models").

A threat model decides two things: which messages the tap must record for an attack on a
target message, and which of the recorded messages go into the adversary's :class:`View`.
The View holds those messages plus the public parameters (W, η, β, σ, C, B, the
architecture and the shared initial model); secrets never enter it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from .errors import PrivauditError, unknown

Key = tuple[int, int, int, str]


@dataclass
class View:
    """What one adversary sees: messages keyed ``(round, src, dst, kind)`` and public facts."""

    threat: str
    messages: dict[Key, Tensor]
    public: dict[str, Any] = field(default_factory=dict)

    def get(self, t: int, src: int, dst: int, kind: str) -> Tensor:
        key = (t, src, dst, kind)
        if key not in self.messages:
            raise PrivauditError(
                f"the {self.threat!r} adversary does not see the {kind!r} message {src}->{dst} "
                f"of round {t}; choose a link that carries it (--link {src},{dst})"
            )
        return self.messages[key]

    def has(self, t: int, src: int, dst: int, kind: str) -> bool:
        return (t, src, dst, kind) in self.messages


@dataclass(frozen=True)
class Link:
    """An eavesdropper on one undirected link: both directions of ``a ↔ b``."""

    a: int
    b: int
    name: str = "link"

    @property
    def links(self) -> frozenset[tuple[int, int]]:
        return frozenset({(self.a, self.b), (self.b, self.a)})

    def view(self, messages: dict[Key, Tensor], public: dict[str, Any]) -> View:
        seen = {k: v for k, v in messages.items() if (k[1], k[2]) in self.links}
        return View(self.name, seen, dict(public))


THREATS = {"link": Link}


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


def build_threat(name: str, link: tuple[int, int]) -> Link:
    if name not in THREATS:
        raise unknown("threat model", name, THREATS)
    return THREATS[name](*link)
