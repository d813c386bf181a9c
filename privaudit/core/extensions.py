"""Calls into what the registries hold — defenses, attacks, threat models, accountants —
whose code may be a plugin's (:mod:`privaudit.plugins`).

A plugin is checked once, when it is loaded, at one probe point; its code runs later at many
more (another σ, another link, another round), where it may raise or answer nonsense. That
is not a privaudit bug: it is one :class:`ExtensionFailed` line naming the extension, where
it came from (the plugin's file or entry point), the hook (``epsilon()``, ``sees()``, the
attack function, …) and the exception or the bad answer, and the fix — exit code 2, like
every error the user can fix. The same failure in one of privaudit's own built-ins passes
unchanged (a bug: the CLI's ``internal error`` line, exit code 1), and running out of memory
is never blamed on the extension.

Where an extension came from is known to :mod:`privaudit.plugins`, a layer above this one;
it installs its :func:`~privaudit.plugins.origin` here when it is imported
(:func:`set_origin`). Before that no plugin can have been loaded, and an extension is named
by its module.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from privaudit.core.errors import PLUGIN_DOCS, PrivauditError

Origin = Callable[[str, str], str]  # (what, name) → "plugin F" | "the built-in …" | "module M"
_origins: list[Origin] = []  # the one installed (privaudit.plugins.origin), if any

BUILT_IN = "the built-in"  # how an origin of privaudit's own code starts
DEBUG_HINT = "PRIVAUDIT_DEBUG=1 prints the traceback"


def set_origin(describe: Origin) -> None:
    """Install how an error line names where the registered ``what`` ``name`` came from
    (:mod:`privaudit.plugins` installs its ``origin`` when imported)."""
    _origins[:] = [describe]


def origin(what: str, name: str, obj: Any) -> str:
    """Where the ``what`` ("defense", "attack", "threat", "accountant") ``name`` came from,
    in words for an error line: ``plugin LABEL``, ``the built-in <what>`` or ``module M``.
    ``obj`` (the registered function, class or instance) names its module where no plugin
    loader is installed."""
    if _origins:
        return _origins[0](what, name)
    holder = obj if isinstance(obj, type | types.FunctionType) else type(obj)
    module = getattr(holder, "__module__", "") or ""
    return f"{BUILT_IN} {what}" if module.startswith("privaudit.") else f"module {module}"


def is_built_in(what: str, name: str, obj: Any) -> bool:
    """Whether the ``what`` ``name`` is privaudit's own (its failure is a privaudit bug)."""
    return origin(what, name, obj).startswith(BUILT_IN)


class ExtensionFailed(PrivauditError):
    """A plugin's code failed at one of its hooks: it raised, or answered what the contract
    (docs/extending.md) rules out. ``what``/``name``: the extension; ``hook``: the call."""

    def __init__(self, what: str, name: str, where: str, hook: str, problem: str, fix: str):
        super().__init__(f"{what} {name!r} ({where}): its {hook} {problem}; fix: {fix}")
        self.what = what
        self.name = name
        self.hook = hook
        self.problem = problem


def first_line(e: BaseException) -> str:
    """An exception's message, its first line, at most 200 characters."""
    return (str(e).strip().splitlines() or [""])[0][:200]


def out_of_memory(e: BaseException) -> bool:
    """An allocation failure (Python's ``MemoryError``, torch's ``OutOfMemoryError``, the
    CPU allocator's "can't allocate memory"): the machine's limit, not the extension's bug."""
    text = str(e)
    return (
        isinstance(e, MemoryError)
        or type(e).__name__ == "OutOfMemoryError"
        or (isinstance(e, RuntimeError) and ("out of memory" in text or "allocate memory" in text))
    )


def failure(what: str, name: str, obj: Any, hook: str, problem: str, fix: str) -> Exception:
    """The error for an extension's answer that breaks its contract (``problem``: what it
    did, e.g. "answered ε = -3.0 at …"): :class:`ExtensionFailed` naming the plugin and
    ``fix`` — or, for one of privaudit's own built-ins, a ``RuntimeError`` (a privaudit bug:
    the CLI's internal-error line)."""
    where = origin(what, name, obj)
    if where.startswith(BUILT_IN):
        return RuntimeError(f"{what} {name!r} ({where}): its {hook} {problem}")
    return ExtensionFailed(what, name, where, hook, problem, fix)


@contextmanager
def calling(
    what: str,
    name: str,
    obj: Any,
    hook: str,
    passes: tuple[type[BaseException], ...] = (),
    fix: str | None = None,
) -> Iterator[None]:
    """Run a call into the ``what`` ``name`` (registered as ``obj``)'s ``hook`` (e.g.
    ``"sees()"``): an exception a plugin's code raises becomes one :class:`ExtensionFailed`
    line naming the plugin, the hook and the exception (chained ``from`` it, so a debug run
    prints its traceback). Passed unchanged: a :class:`PrivauditError` (a clear line
    already), the exceptions ``passes`` names (those the caller handles: an accountant's
    "cannot answer here"), running out of memory, anything not an ``Exception`` (an
    interrupt), and every exception of privaudit's own built-ins (a bug)."""
    try:
        yield
    except PrivauditError:
        raise
    except Exception as e:
        if isinstance(e, passes):
            raise
        blamed = blame(what, name, obj, hook, e, fix)
        if blamed is e:
            raise
        raise blamed from e


def blame(
    what: str, name: str, obj: Any, hook: str, e: BaseException, fix: str | None = None
) -> BaseException:
    """What to raise for the exception ``e`` out of the ``what`` ``name``'s ``hook``: one
    :class:`ExtensionFailed` line for a plugin's code (raise it ``from e``), else ``e``
    itself — a :class:`PrivauditError`, an interrupt, running out of memory, or a built-in's
    exception (a privaudit bug)."""
    if isinstance(e, PrivauditError) or not isinstance(e, Exception) or out_of_memory(e):
        return e
    where = origin(what, name, obj)
    if where.startswith(BUILT_IN):
        return e
    problem = f"raised {type(e).__name__}: {first_line(e)}"
    remedy = fix or f"correct the plugin's {hook} ({PLUGIN_DOCS}; {DEBUG_HINT})"
    return ExtensionFailed(what, name, where, hook, problem, remedy)
