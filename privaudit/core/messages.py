"""What crosses a link, and the tap that records only what was asked for.

A 200-round run of 10 agents sends tens of thousands of parameter-sized tensors; the tap
keeps only the (round, link, kind) triples a threat model needs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor


@dataclass(frozen=True)
class Message:
    """One tensor sent on the directed link ``src → dst`` in round ``round``."""

    round: int
    src: int
    dst: int
    kind: str
    payload: Tensor
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[int, int, int, str]:
        return (self.round, self.src, self.dst, self.kind)


@dataclass
class CaptureSpec:
    """Which messages to keep. ``None`` for a field means "all of them"."""

    rounds: frozenset[int] | None = None
    links: frozenset[tuple[int, int]] | None = None
    kinds: frozenset[str] | None = None

    @classmethod
    def of(
        cls,
        rounds: Iterable[int] | None = None,
        links: Iterable[tuple[int, int]] | None = None,
        kinds: Iterable[str] | None = None,
    ) -> CaptureSpec:
        f = lambda xs: None if xs is None else frozenset(xs)  # noqa: E731
        return cls(f(rounds), f(links), f(kinds))

    def wants_round(self, t: int) -> bool:
        return self.rounds is None or t in self.rounds

    def wants(self, t: int, src: int, dst: int, kind: str) -> bool:
        return (
            self.wants_round(t)
            and (self.links is None or (src, dst) in self.links)
            and (self.kinds is None or kind in self.kinds)
        )


class Tap:
    """Records the messages a :class:`CaptureSpec` selects, as detached CPU copies."""

    def __init__(self, spec: CaptureSpec | None = None):
        self.spec = spec if spec is not None else CaptureSpec(rounds=frozenset())
        self.messages: dict[tuple[int, int, int, str], Message] = {}

    def record(
        self,
        t: int,
        kind: str,
        edges: list[tuple[int, int]],
        payload: Tensor,
        rows: list[int] | None = None,
    ) -> None:
        """``payload[e]`` is what ``edges[e] = (src, dst)`` carries in round ``t``; with
        ``rows`` it is ``payload[rows[e]]`` (a broadcast: one row per sender, never copied
        per link), and the links that carry the same row share one recorded copy."""
        if not self.spec.wants_round(t):
            return
        copies: dict[int, Tensor] = {}
        for e, (src, dst) in enumerate(edges):
            if self.spec.wants(t, src, dst, kind):
                r = e if rows is None else rows[e]
                if r not in copies:
                    copies[r] = payload[r].detach().to("cpu", copy=True)
                m = Message(t, src, dst, kind, copies[r])
                self.messages[m.key] = m

    def clear(self) -> None:
        self.messages.clear()
