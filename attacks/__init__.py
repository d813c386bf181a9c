"""Gradient inversion and label inference (imported as ``privaudit.attacks``).

Attacks see only :class:`~privaudit.observation.Observation` objects — never a defense.
Every attack takes a *list* of Observations sharing one architecture and solves them as one
batched problem (``torch.func.vmap`` over observations; see :mod:`.common`), returning one
:class:`~privaudit.observation.Reconstruction` per Observation, in order::

    attack(observations, *, iterations=None, restarts=None, seed=0, device=None,
           progress=False, **options) -> list[Reconstruction]

Observation ``i`` of a call uses seed ``seed + i``. Results are put on the device of each
observation's params; the work runs on ``device`` (default: that same device).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from privaudit.errors import PrivauditError, unknown
from privaudit.observation import Observation, Reconstruction

from .analytic import analytic
from .dlg import dlg
from .idlg import idlg
from .ig import ig
from .labels import infer_labels

Attack = Callable[..., list[Reconstruction]]

ATTACKS: dict[str, Attack] = {
    "ig": ig,
    "dlg": dlg,
    "idlg": idlg,
    "analytic": analytic,
}

DEFAULT_ATTACK = "ig"


def options(name: str) -> list[str]:
    """The keyword options an attack accepts."""
    if name not in ATTACKS:
        raise unknown("attack", name, ATTACKS)
    params = inspect.signature(ATTACKS[name]).parameters.values()
    return [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]


def run_attack(
    name: str, observations: Observation | Sequence[Observation], **kw: Any
) -> list[Reconstruction]:
    """Run the attack ``name`` (a key of :data:`ATTACKS`) on ``observations``."""
    if name not in ATTACKS:
        raise unknown("attack", name, ATTACKS)
    valid = options(name)
    bad = sorted(set(kw) - set(valid))
    if bad:
        raise PrivauditError(
            f"attack {name!r} takes no option {', '.join(map(repr, bad))}; "
            f"its options: {', '.join(valid)}"
        )
    return ATTACKS[name](observations, **kw)


__all__ = [
    "ATTACKS",
    "DEFAULT_ATTACK",
    "analytic",
    "dlg",
    "idlg",
    "ig",
    "infer_labels",
    "options",
    "run_attack",
]
