"""The target registry: ``<defense>-<message kind>``, built from the defenses' own kinds."""

from __future__ import annotations

from privaudit.core.errors import MISSING, PrivauditError, unknown
from privaudit.defenses import DEFENSES, Defense


def all_targets() -> dict[str, tuple[Defense, str, str]]:
    """``{target: (defense, kind, one-line description)}`` in registry order."""
    return {
        f"{d.name}-{kind}": (d, kind, text)
        for d in DEFENSES.values()
        for kind, text in d.kinds.items()
    }


def parse_target(name: str) -> tuple[Defense, str]:
    targets = all_targets()
    if name not in targets:
        raise PrivauditError(f"{unknown('target', name, targets)}; {MISSING}")
    defense, kind, _ = targets[name]
    return defense, kind
