"""Decentralized training algorithms, each producing exactly the messages it sends.

Every module of this package defines its defenses and adds them to the one registry,
:data:`DEFENSES`, with the ``@register`` decorator; importing the package imports them all.
"""

import importlib
import pkgutil

from privaudit.core.context import Context
from privaudit.core.errors import MISSING, PrivauditError, unknown
from privaudit.defenses.base import DEFENSES, Defense, register

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _m != "base":
        importlib.import_module(f"{__name__}.{_m}")


def get_defense(name: str) -> Defense:
    """The registered defense ``name``; unknown, one error listing the names and saying how
    a plugin's defense (a run trained with one records only its name) is loaded again."""
    if name not in DEFENSES:
        raise PrivauditError(f"{unknown('defense', name, DEFENSES)}; {MISSING}")
    return DEFENSES[name]


__all__ = ["DEFENSES", "Context", "Defense", "get_defense", "register"]
