"""``neighbor``: one honest-but-curious agent: every message on its links."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from privaudit.core.errors import PrivauditError
from privaudit.core.threat.base import Threat, register_threat


@register_threat
@dataclass(frozen=True)
class Neighbor(Threat):
    """One honest-but-curious agent: every message on its links."""

    name = "neighbor"
    strength = 10
    summary = "one honest-but-curious agent: its own links"
    searched = True

    @classmethod
    def build(cls, *, link: tuple[int, int] | None = None, attackers: Iterable[int] = ()) -> Threat:
        agents = frozenset(attackers)
        if len(agents) != 1:
            raise PrivauditError("--threat neighbor needs one agent: --attacker A")
        return cls(agents)

    @classmethod
    def for_victim(cls, victim: int, receivers: list[int], attackers: Iterable[int]) -> Threat:
        return cls.build(attackers=list(attackers) or receivers[:1])  # default: 1st receiver

    def describe(self) -> str:
        return f"neighbor {next(iter(self.agents))}"
