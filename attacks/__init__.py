"""Gradient inversion and label inference (imported as ``privaudit.attacks``).

Attacks see only :class:`~privaudit.core.observation.Observation` objects — never a defense.
Every attack takes a *list* of Observations sharing one architecture and solves them as one
batched problem (``torch.func.vmap`` over observations; see :mod:`.common`), returning one
:class:`~privaudit.core.observation.Reconstruction` per Observation, in order::

    attack(observations, *, iterations=None, restarts=None, seed=0, device=None,
           progress=False, **options) -> list[Reconstruction]

Observation ``i`` of a call uses seed ``seed + i``. Results are put on the device of each
observation's params; the work runs on ``device`` (default: that same device).
:func:`run_attack` also takes observations of different batch sizes (Poisson batches: the
realised size of each victim's batch), attacking each run of equal sizes as one problem, and
answers an observation of an empty batch with an empty Reconstruction.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from privaudit.core import schema
from privaudit.core.errors import NameTaken, PrivauditError, unknown
from privaudit.core.limits import SEED_END
from privaudit.core.observation import Observation, Reconstruction, check_finite

from .analytic import analytic
from .auto import auto
from .dlg import dlg
from .fi import fi
from .hybrid import hybrid
from .idlg import idlg
from .ig import ig
from .labels import METHODS as LABEL_METHODS
from .labels import infer_labels
from .rgap import rgap

Attack = Callable[..., list[Reconstruction]]

ATTACKS: dict[str, Attack] = {
    "ig": ig,
    "dlg": dlg,
    "idlg": idlg,
    "analytic": analytic,
    "rgap": rgap,
    "fi": fi,
    "hybrid": hybrid,
    "auto": auto,
}

DEFAULT_ATTACK = "ig"

# the keyword-only options every attack takes: privaudit passes them to any attack
COMMON_OPTIONS = ("iterations", "restarts", "seed", "device", "progress")


def check_attack(name: str, fn: Any) -> None:
    """Raise one clear error unless ``fn`` takes the attack signature (module docstring):
    the observations as its first, positional argument, then keyword-only options with
    defaults, :data:`COMMON_OPTIONS` among them (run without them, it would fail later)."""
    fix = (
        f"; fix: define it as def {name}(observations, *, iterations=None, restarts=None, "
        "seed=0, device=None, progress=False, <your options, with defaults>) "
        "-> list[Reconstruction]"
    )
    if not callable(fn) or isinstance(fn, type):
        raise PrivauditError(f"attack {name!r} is a {type(fn).__name__}, not a function{fix}")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        raise PrivauditError(f"attack {name!r} has no signature Python can inspect{fix}") from None
    P = inspect.Parameter
    variadic = (P.VAR_POSITIONAL, P.VAR_KEYWORD)
    keyword = {p.name for p in params if p.kind is P.KEYWORD_ONLY}
    required = [p.name for p in params[1:] if p.default is P.empty and p.kind not in variadic]
    missing = [o for o in COMMON_OPTIONS if o not in keyword]
    if not params or params[0].kind not in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD):
        problem = "takes no positional argument for the observations"
    elif required:
        problem = f"requires {', '.join(required)} (every option needs a default)"
    elif missing:
        problem = f"lacks the keyword-only option(s) {', '.join(missing)}"
    else:
        return
    raise PrivauditError(f"attack {name!r} {problem}{fix}")


def register_attack(name: str, fn: Attack) -> Attack:
    """Add the attack ``fn`` to :data:`ATTACKS` under ``name``: how a plugin adds one
    (:mod:`privaudit.plugins`). Refused when the name is taken
    (:class:`~privaudit.core.errors.NameTaken`) or ``fn`` does not take the attack signature
    (:func:`check_attack`). Returns ``fn``."""
    if name in ATTACKS:
        raise NameTaken("attack", name)
    check_attack(name, fn)
    ATTACKS[name] = fn
    return fn


def options(name: str) -> list[str]:
    """The keyword options an attack accepts."""
    if name not in ATTACKS:
        raise unknown("attack", name, ATTACKS)
    params = inspect.signature(ATTACKS[name]).parameters.values()
    return [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]


# option → (its range in words, the check) for every attack that takes it; a value is first
# coerced to the option's annotation (privaudit.core.schema), and None keeps an option's default
RULES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "iterations": ("an integer in 1..10^7", lambda v: 1 <= v <= 10**7),
    "restarts": ("an integer in 1..1024", lambda v: 1 <= v <= 1024),
    "seed": ("an integer in [0, 2^63)", lambda v: 0 <= v < SEED_END),
    "lr": ("a finite number > 0", lambda v: v > 0),
    "tv": ("a finite number ≥ 0", lambda v: v >= 0),
    "max_iter": ("an integer in 1..10^4", lambda v: 1 <= v <= 10**4),
    "history_size": ("an integer in 1..10^4", lambda v: 1 <= v <= 10**4),
    "label_method": (f"one of {', '.join(LABEL_METHODS)}", lambda v: v in LABEL_METHODS),
    "line_search_fn": ("'strong_wolfe' or null", lambda v: v == "strong_wolfe"),
    "rcond": ("a number in (0, 1)", lambda v: 0 < v < 1),
    "refine": ("an integer in 0..10^7", lambda v: 0 <= v <= 10**7),
    "refine_lr": ("a finite number > 0", lambda v: v > 0),
    "feature_weight": ("a finite number ≥ 0", lambda v: v >= 0),
    "fi_residual": ("a finite number ≥ 0", lambda v: v >= 0),
}


def check_options(name: str, kw: dict[str, Any]) -> dict[str, Any]:
    """``kw`` checked for the attack ``name``: known options only, each of its declared type
    and in its range (:data:`RULES`); returns them coerced (an int given for a float option
    becomes a float). Callers check before any training, :func:`run_attack` again."""
    valid = options(name)
    bad = sorted(set(kw) - set(valid))
    if bad:
        raise PrivauditError(
            f"attack {name!r} takes no option {', '.join(map(repr, bad))}; "
            f"its options: {', '.join(valid)}"
        )
    out = schema.coerce_all(kw, schema.hints(ATTACKS[name]), what="attack option")
    for k, v in out.items():
        if v is not None and k in RULES and not RULES[k][1](v):
            raise PrivauditError(f"attack option {k} must be {RULES[k][0]}, got {v!r}")
    return out


def run_attack(
    name: str, observations: Observation | Sequence[Observation], **kw: Any
) -> list[Reconstruction]:
    """Run the attack ``name`` (a key of :data:`ATTACKS`) on ``observations``: consecutive
    observations of one batch size as one batched problem (observation i keeps seed
    ``seed + i``); one with ``batch_size`` 0 (an empty Poisson batch) gets an empty
    Reconstruction (``meta["empty"]``), as there is nothing to reconstruct. A non-finite
    observation is refused first (:func:`~privaudit.core.observation.check_finite`)."""
    if name not in ATTACKS:
        raise unknown("attack", name, ATTACKS)
    kw = check_options(name, kw)
    obs = [observations] if isinstance(observations, Observation) else list(observations)
    check_finite(obs)
    sizes = [int(o.batch_size) for o in obs]
    if not obs or (min(sizes) > 0 and len(set(sizes)) == 1):
        return ATTACKS[name](obs, **kw)
    seed = kw.pop("seed", 0)
    out: list[Reconstruction] = []
    start = 0
    while start < len(obs):
        end = start + 1
        while end < len(obs) and sizes[end] == sizes[start]:
            end += 1
        group = obs[start:end]
        if sizes[start] == 0:
            out += [_empty(o) for o in group]
        else:
            out += ATTACKS[name](group, seed=seed + start, **kw)
        start = end
    return out


def _empty(obs: Observation) -> Reconstruction:
    """The answer for an observation of an empty batch: no images, no labels."""
    device = next(iter(obs.params.values())).device
    return Reconstruction(
        images=torch.zeros(0, *obs.input_shape, device=device),
        labels=torch.zeros(0, dtype=torch.long, device=device),
        loss=0.0,
        meta={"empty": "the victim's batch has no example: nothing to reconstruct"},
    )


__all__ = [
    "ATTACKS",
    "COMMON_OPTIONS",
    "DEFAULT_ATTACK",
    "RULES",
    "analytic",
    "auto",
    "check_attack",
    "check_options",
    "dlg",
    "fi",
    "hybrid",
    "idlg",
    "ig",
    "infer_labels",
    "options",
    "register_attack",
    "rgap",
    "run_attack",
]
