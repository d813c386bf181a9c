"""Typed values at the edge: a parsed value coerced to its declared annotation, or one error.

Values come in untyped: JSON from ``-p NAME=VALUE`` and ``-a NAME=VALUE``, or a field of a
run directory's ``config.json``. Every one goes through :func:`coerce` against the type its
dataclass field or keyword argument declares, so the CLI and a run read back from disk
obey the same schema. The rules: a bool is never a number; an int is accepted for a float
(and becomes one); a float must be finite; ``X | None`` takes null; ``Literal[...]`` takes
one of its values; a class annotation takes its instances. Ranges are the owner's job
(a Params ``validate``, :mod:`privaudit.core.limits`).
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any, Literal, Union

from privaudit.core.errors import PrivauditError

_NAMES = {
    bool: "true or false",
    int: "an integer (int)",
    float: "a number (float)",
    str: "a string (str)",
    type(None): "null",
    dict: "an object (dict)",
    list: "a list",
}


def describe(annotation: Any) -> str:
    """What a value of ``annotation`` looks like, in words (for error messages)."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in typing.get_args(annotation))
    if origin is Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(annotation))
    if origin is not None:
        return describe(origin)
    if annotation in _NAMES:
        return _NAMES[annotation]
    return f"a {getattr(annotation, '__name__', annotation)}"


class _Mismatch(Exception):
    """``value`` does not fit the annotation tried (internal: one member of a union)."""


def _fit(value: Any, annotation: Any) -> Any:
    if annotation is Any or annotation is object:
        return value
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        for member in typing.get_args(annotation):
            try:
                return _fit(value, member)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin is Literal:
        for allowed in typing.get_args(annotation):
            if value == allowed and type(value) is type(allowed):
                return value
        raise _Mismatch
    if origin is not None:  # dict[str, Any], list[int]: the container's type only
        annotation = origin
    if annotation is type(None) or annotation is None:
        if value is None:
            return None
        raise _Mismatch
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return int(value)
        raise _Mismatch
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                out = float(value)
            except OverflowError:  # an int beyond the float range
                raise _Mismatch from None
            if math.isfinite(out):
                return out
        raise _Mismatch
    if isinstance(annotation, type):
        if isinstance(value, annotation):
            return value
        raise _Mismatch
    return value  # an annotation this schema does not model (a Callable, a TypeVar)


def coerce(name: str, value: Any, annotation: Any, what: str = "parameter") -> Any:
    """``value`` as ``annotation`` declares it, or a :class:`PrivauditError` naming ``what``
    and ``name``, the expected type and the value given."""
    try:
        return _fit(value, annotation)
    except _Mismatch:
        expected = describe(annotation)
        if isinstance(value, float) and not math.isfinite(value):
            expected = expected.replace("a number", "a finite number")
        raise PrivauditError(f"{what} {name} must be {expected}, got {value!r}") from None


def hints(obj: Any) -> dict[str, Any]:
    """The resolved annotations of a dataclass or a function (strings under
    ``from __future__ import annotations`` are evaluated in their module)."""
    return typing.get_type_hints(obj)


def coerce_all(
    values: dict[str, Any], annotations: dict[str, Any], what: str = "parameter"
) -> dict[str, Any]:
    """Every entry of ``values`` coerced to its annotation (names without one pass as they
    are: unknown names are the caller's error to report)."""
    return {
        k: coerce(k, v, annotations[k], what) if k in annotations else v for k, v in values.items()
    }
