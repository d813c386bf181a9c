"""The old dict interface of a typed result, kept for a while with a deprecation warning.

Results that were plain dicts (an audit's, a membership inference's) are now typed: named
fields for what every such result has, a ``to_dict()`` that gives the old dict, key for key.
Code written against the dict still reads it through :class:`DictView` —
``result[key]``, ``key in result``, ``result.get(key)``, ``keys()``, ``values()``,
``items()``, iteration and ``result[key] = value`` — and each use warns
(:class:`DeprecationWarning`) naming the form that replaces it: the attribute where the key
is a named field, else ``details[key]`` where the result keeps its other entries there, else
``to_dict()[key]``.

:class:`FieldsAndDetails` is the shape those results share: named fields, the other entries
in a ``details`` dict, and the document's key order, so that ``to_dict()`` gives the old
dict's keys in its order and ``from_dict()`` reads it back.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any, ClassVar, TypeVar

R = TypeVar("R", bound="FieldsAndDetails")


class DictView:
    """Mixin: the deprecated dict interface of a typed result (module docstring).

    A subclass provides :meth:`to_dict` (the dict the result was) and ``_set_entry`` (how
    ``result[key] = value`` sets an entry), and says in three class attributes who returns
    it and where its entries live:

    - ``view_returned``: the start of every warning, e.g.
      ``"audit() returns an AuditResult"``;
    - ``view_fields``: the keys that are attributes of the result (its named fields);
    - ``view_details``: the attribute (a dict) holding the other entries, or None.

    ``_entry_form`` names the new form of a key from these, and may be overridden.
    """

    view_returned: ClassVar[str] = "this returns a typed result"
    view_fields: ClassVar[tuple[str, ...]] = ()
    view_details: ClassVar[str | None] = None

    def to_dict(self) -> dict[str, Any]:
        """The result as the dict it was."""
        raise NotImplementedError

    def _set_entry(self, key: str, value: Any) -> None:
        """Set entry ``key`` of the result to ``value`` (``result[key] = value``)."""
        raise NotImplementedError

    def _entry_form(self, key: Any, get: bool = False) -> str | None:
        """The form that reads (or writes) ``key`` where it lives: the attribute of a named
        field, else the details dict's entry (``get``: its ``.get``); None where neither
        holds it (then only ``to_dict()`` does)."""
        if key in self.view_fields:
            return f"result.{key}"
        if self.view_details is None:
            return None
        details = f"result.{self.view_details}"
        return f"{details}.get({key!r})" if get else f"{details}[{key!r}]"

    def _read_form(self, key: Any, get: bool = False) -> str:
        """What replaces a read of ``key``: :meth:`_entry_form`, ``to_dict()`` beside it."""
        read = f"result.to_dict().get({key!r})" if get else f"result.to_dict()[{key!r}]"
        new = self._entry_form(key, get)
        return read if new is None else f"{new} (or {read})"

    def _deprecated(self, old: str, new: str) -> None:
        """Warn, where the caller of the dict method called it, that ``old`` (a use of the
        result as the dict it was) is deprecated, naming ``new``, the form to use."""
        warnings.warn(
            f"{self.view_returned}: {old} is deprecated, use {new}",
            DeprecationWarning,
            stacklevel=3,
        )

    # -- the old dict interface, deprecated ------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        self._deprecated(f"result[{key!r}]", self._read_form(key))
        return self.to_dict()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        new = self._entry_form(key) or f"result.to_dict()[{key!r}]"
        self._deprecated(f"result[{key!r}] = …", new)
        self._set_entry(key, value)

    def __contains__(self, key: object) -> bool:
        self._deprecated(f"{key!r} in result", f"{key!r} in result.to_dict()")
        return key in self.to_dict()

    def __iter__(self) -> Iterator[str]:
        self._deprecated("iterating over result", "result.to_dict()")
        return iter(self.to_dict())

    def get(self, key: str, default: Any = None) -> Any:
        """Deprecated: ``result.to_dict().get(key, default)`` (or the attribute)."""
        self._deprecated(f"result.get({key!r})", self._read_form(key, get=True))
        return self.to_dict().get(key, default)

    def keys(self) -> Any:
        """Deprecated: ``result.to_dict().keys()``."""
        self._deprecated("result.keys()", "result.to_dict().keys()")
        return self.to_dict().keys()

    def values(self) -> Any:
        """Deprecated: ``result.to_dict().values()``."""
        self._deprecated("result.values()", "result.to_dict().values()")
        return self.to_dict().values()

    def items(self) -> Any:
        """Deprecated: ``result.to_dict().items()``."""
        self._deprecated("result.items()", "result.to_dict().items()")
        return self.to_dict().items()


class FieldsAndDetails(DictView):
    """Mixin for a dataclass result whose document is its named fields (``view_fields``)
    and the entries of its ``details`` dict, in the order of its ``key_order`` tuple (then
    any entry it does not list; empty: the named fields, then the details). ``view_noun``
    names what it is in :meth:`from_dict`'s error, e.g. ``"an audit result"``."""

    view_details: ClassVar[str | None] = "details"
    view_noun: ClassVar[str] = "a result"
    details: dict[str, Any]
    key_order: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The result's document: every entry, named field or detail, in ``key_order``
        (then any entry it does not list). The values are shared, not copied."""
        entries = {**{name: getattr(self, name) for name in self.view_fields}, **self.details}
        listed = [k for k in self.key_order if k in entries]
        rest = [k for k in entries if k not in set(listed)]
        return {k: entries[k] for k in [*listed, *rest]}

    @classmethod
    def from_dict(cls: type[R], doc: dict[str, Any]) -> R:
        """The result of a document (what :meth:`to_dict` gives, or the dict its producer
        builds): its named fields taken out, the rest kept as ``details``, its order kept.
        Raises ``KeyError`` naming an entry every such result has that ``doc`` lacks."""
        fields = cls.view_fields
        missing = [name for name in fields if name not in doc]
        if missing:
            raise KeyError(f"not {cls.view_noun}: no {', '.join(map(repr, missing))}")
        return cls(
            **{name: doc[name] for name in fields},
            details={k: v for k, v in doc.items() if k not in fields},
            key_order=tuple(doc),
        )

    def _set_entry(self, key: str, value: Any) -> None:
        """``result[key] = value``: the named field, else the detail; a key the document
        does not yet have comes last in it."""
        if key in self.view_fields:
            setattr(self, key, value)
        else:
            self.details[key] = value
        if self.key_order and key not in self.key_order:
            self.key_order = (*self.key_order, key)
