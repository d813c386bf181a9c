"""``coalition``: a set of agents pooling what each of them sees."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from privaudit.core.threat.base import Threat, register_threat


@register_threat
@dataclass(frozen=True)
class Coalition(Threat):
    """A set of agents pooling what each of them sees."""

    name = "coalition"
    strength = 20
    summary = "several agents pooling their links"

    @classmethod
    def for_victim(cls, victim: int, receivers: list[int], attackers: Iterable[int]) -> Threat:
        return cls.build(attackers=list(attackers) or receivers)  # default: all who receive it
