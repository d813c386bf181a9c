"""Decentralized training algorithms, each producing exactly the messages it sends."""

from privaudit.errors import unknown

from .base import Context, Defense
from .dpdl import DPDL, ND
from .dsgd import DSGD

DEFENSES: dict[str, Defense] = {d.name: d for d in (DSGD(), ND(), DPDL())}


def get_defense(name: str) -> Defense:
    if name not in DEFENSES:
        raise unknown("defense", name, DEFENSES)
    return DEFENSES[name]


__all__ = ["DEFENSES", "Context", "Defense", "get_defense"]
