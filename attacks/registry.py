"""The attack registry: every attack — built in or from a plugin — is added the same way.

An attack is a function of the signature in :mod:`privaudit.attacks`, registered with
:func:`register_attack` (a decorator) together with the range of each of its own options
(:class:`Rule`, declared beside the attack). A *preset* (:func:`preset`) registers one
implementation under another name with some options fixed — DLG, iDLG and the hybrid are
presets of one L-BFGS gradient-matching loop, as breaching's attack configurations are
presets over one optimiser.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_type_hints

from privaudit.core import schema
from privaudit.core.errors import NameTaken, PrivauditError, unknown
from privaudit.core.limits import SEED_END
from privaudit.core.observation import Reconstruction

from .labels import METHODS as LABEL_METHODS

Attack = Callable[..., list[Reconstruction]]

# the keyword-only options every attack takes: privaudit passes them to any attack
COMMON_OPTIONS = ("iterations", "restarts", "seed", "device", "progress")


@dataclass(frozen=True)
class Rule:
    """An option's range: in words (for the error line) and as a check of a coerced value."""

    text: str
    ok: Callable[[Any], bool]


POSITIVE = Rule("a finite number > 0", lambda v: v > 0)
NON_NEGATIVE = Rule("a finite number ≥ 0", lambda v: v >= 0)
UNIT_OPEN = Rule("a number in (0, 1)", lambda v: 0 < v < 1)


def one_of(values: tuple[str, ...]) -> Rule:
    return Rule(f"one of {', '.join(values)}", lambda v: v in values)


LABEL_METHOD = one_of(LABEL_METHODS)


COMMON_RULES: dict[str, Rule] = {
    "iterations": Rule("an integer in 1..10^7", lambda v: 1 <= v <= 10**7),
    "restarts": Rule("an integer in 1..1024", lambda v: 1 <= v <= 1024),
    "seed": Rule("an integer in [0, 2^63)", lambda v: 0 <= v < SEED_END),
}

ATTACKS: dict[str, Attack] = {}
RULES: dict[str, dict[str, Rule]] = {}  # attack → its own options' rules
SUMMARIES: dict[str, str] = {}  # attack → one line (privaudit targets --list attacks)


def check_attack(name: str, fn: Any) -> None:
    """Raise one clear error unless ``fn`` takes the attack signature (module docstring of
    :mod:`privaudit.attacks`): the observations as its first, positional argument, then
    keyword-only options with defaults, :data:`COMMON_OPTIONS` among them."""
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


def register_attack(
    name: str,
    fn: Attack | None = None,
    *,
    rules: dict[str, Rule] | None = None,
    summary: str | None = None,
) -> Any:
    """Add an attack under ``name``, with the ranges of its own options (``rules``) and a
    one-line ``summary`` (default: its docstring's first line): as a
    decorator (``@register_attack("mine", rules={"lr": POSITIVE})``) or a call
    (``register_attack("mine", fn)``: how a plugin's entry point is added). Refused when the
    name is taken (:class:`~privaudit.core.errors.NameTaken`) or the function does not take
    the attack signature (:func:`check_attack`). Returns the function."""

    def add(f: Attack) -> Attack:
        if name in ATTACKS:
            raise NameTaken("attack", name)
        check_attack(name, f)
        unknown_rules = set(rules or {}) - set(_keyword_options(f))
        if unknown_rules:
            raise PrivauditError(
                f"attack {name!r} declares rules for options it does not take: "
                f"{', '.join(sorted(unknown_rules))}"
            )
        ATTACKS[name] = f
        RULES[name] = dict(rules or {})
        SUMMARIES[name] = summary or (f.__doc__ or "").strip().split("\n")[0]
        return f

    return add if fn is None else add(fn)


def preset(
    name: str,
    base: Callable[..., list[Reconstruction]],
    *,
    doc: str,
    summary: str,
    fixed: dict[str, Any],
    defaults: dict[str, Any] | None = None,
    rules: dict[str, Rule] | None = None,
) -> Attack:
    """Register ``base`` under ``name`` with the options ``fixed`` set and hidden (not
    options of the preset) and ``defaults`` changed; the preset's signature, type hints and
    ``doc`` are its own, so ``-a`` options, their checks and ``--help`` see a plain attack."""
    defaults = defaults or {}
    sig = inspect.signature(base)
    params = [
        p.replace(default=defaults[p.name]) if p.name in defaults else p
        for p in sig.parameters.values()
        if p.name not in fixed
    ]
    hints = {k: v for k, v in get_type_hints(base).items() if k not in fixed}

    def attack(observations: Any, **kw: Any) -> list[Reconstruction]:
        return base(observations, **{**defaults, **kw, **fixed})

    attack.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    attack.__annotations__ = hints
    attack.__name__ = attack.__qualname__ = name.replace("-", "_")
    attack.__doc__ = doc
    attack.__module__ = base.__module__
    return register_attack(name, attack, rules=rules, summary=summary)


def _keyword_options(fn: Attack) -> list[str]:
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]


def options(name: str) -> list[str]:
    """The keyword options an attack accepts."""
    if name not in ATTACKS:
        raise unknown("attack", name, ATTACKS)
    return _keyword_options(ATTACKS[name])


def rule(name: str, option: str) -> Rule | None:
    """The range of ``option`` of the attack ``name`` (a common option's, or its own)."""
    return COMMON_RULES.get(option) or RULES.get(name, {}).get(option)


def check_options(name: str, kw: dict[str, Any]) -> dict[str, Any]:
    """``kw`` checked for the attack ``name``: known options only, each of its declared type
    and in its declared range; returns them coerced (an int given for a float option becomes
    a float). Callers check before any training, :func:`run_attack` again."""
    valid = options(name)
    bad = sorted(set(kw) - set(valid))
    if bad:
        raise PrivauditError(
            f"attack {name!r} takes no option {', '.join(map(repr, bad))}; "
            f"its options: {', '.join(valid)}"
        )
    out = schema.coerce_all(kw, schema.hints(ATTACKS[name]), what="attack option")
    for k, v in out.items():
        r = rule(name, k)
        if v is not None and r is not None and not r.ok(v):
            raise PrivauditError(f"attack option {k} must be {r.text}, got {v!r}")
    return out
