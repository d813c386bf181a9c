"""``global``: every message on every link."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from privaudit.core.threat.base import Threat, register_threat


@register_threat
@dataclass(frozen=True)
class Global(Threat):
    """Every message on every link."""

    name = "global"
    strength = 30
    summary = "every message on every link"
    uses_attackers = False
    searched = True

    def sees(self, src: int, dst: int) -> bool:
        return True

    @classmethod
    def build(cls, *, link: tuple[int, int] | None = None, attackers: Iterable[int] = ()) -> Threat:
        return cls()

    @classmethod
    def for_victim(cls, victim: int, receivers: list[int], attackers: Iterable[int]) -> Threat:
        return cls()

    def describe(self) -> str:
        return "global"
