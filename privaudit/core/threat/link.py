"""``link``: an eavesdropper on one undirected link ``a ↔ b`` (both directions)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from privaudit.core.errors import PrivauditError
from privaudit.core.threat.base import Threat, register_threat


@register_threat
@dataclass(frozen=True)
class Link(Threat):
    """An eavesdropper on one undirected link ``a ↔ b`` (both directions)."""

    name = "link"
    strength = 0
    summary = "an eavesdropper on one link (both directions)"
    uses_attackers = False
    searched = True

    def sees(self, src: int, dst: int) -> bool:
        return self.link is not None and {src, dst} == set(self.link)

    @classmethod
    def build(cls, *, link: tuple[int, int] | None = None, attackers: Iterable[int] = ()) -> Threat:
        if link is None:
            raise PrivauditError("--threat link needs the link: --link SRC,DST")
        return cls(link=link)

    @classmethod
    def for_victim(cls, victim: int, receivers: list[int], attackers: Iterable[int]) -> Threat:
        return cls(link=(victim, receivers[0]) if receivers else (victim, victim))

    def who(self) -> str:
        assert self.link is not None
        return f"the link {self.link[0]}<->{self.link[1]}"

    def describe(self) -> str:
        assert self.link is not None
        return f"link {self.link[0]}<->{self.link[1]}"
