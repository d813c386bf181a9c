"""Plugins: your own defenses, attacks, threat models and accountants, registered beside the
built-ins without a fork.

Three sources, loaded in this order by :func:`load_plugins` (the CLI calls it once, before
the command runs):

1. installed packages' entry points in the groups ``privaudit.defenses``,
   ``privaudit.attacks``, ``privaudit.threats`` and ``privaudit.accountants``
   (``[project.entry-points."privaudit.defenses"]`` in the package's pyproject.toml), read
   once per process. An entry point names a module (importing it registers what it
   defines, with ``@register``, :func:`privaudit.attacks.register_attack`,
   :func:`privaudit.core.threat.register_threat` or
   :func:`privaudit.core.accountants.register_accountant`), or the class or function itself:
   a :class:`~privaudit.defenses.Defense`, :class:`~privaudit.core.threat.Threat` or
   :class:`~privaudit.core.accountants.Accountant` subclass (registered under its ``name``),
   an attack function (registered under the entry point's name);
2. the ``.py`` files named by ``PRIVAUDIT_PLUGINS`` (``os.pathsep``-separated);
3. the files of ``privaudit --plugin FILE.py`` (repeatable).

A file is imported from its path as Python source (:func:`importlib.util.spec_from_file_location`);
nothing is ever unpickled. Whatever a plugin registers is checked before any command uses
it: a Defense must override ``round`` and ``observe``, declare ``kinds`` and a ``Params``
dataclass whose defaults build, answer ``privacy()`` with :class:`Privacy` facts, and add
only new names and new targets; an attack must take the attack signature; a threat model
must say which links it sees; an accountant must answer ε. A broken plugin
is one :class:`~privaudit.core.errors.PrivauditError`, ``plugin X: what is wrong; fix: …``, and
leaves the registries exactly as they were before it, so the built-ins keep working.

Loading a file again is a no-op while what it registered is still registered. A run
records only its defense's name: a process that opens a run of a plugin's defense must load
the plugin again (:data:`privaudit.core.errors.MISSING`). The torch.distributed launcher hands
:func:`loaded_files` to every rank it starts (:mod:`privaudit.sim.distributed`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from privaudit.attacks import ATTACKS, check_attack, register_attack
from privaudit.core import extensions
from privaudit.core.accountants import ACCOUNTANTS, Accountant, register_accountant
from privaudit.core.context import params_of
from privaudit.core.errors import PLUGIN_DOCS, PLUGIN_ENV, NameTaken, PrivauditError
from privaudit.core.privacy import Privacy
from privaudit.core.threat import THREATS, Threat, register_threat
from privaudit.defenses import DEFENSES, Defense, register
from privaudit.eval.membership_attacks import MEMBERSHIP_ATTACKS, check_membership_attack
from privaudit.scenario.topology import build_topology, metropolis_hastings

GROUPS = {
    "defense": "privaudit.defenses",
    "attack": "privaudit.attacks",
    "threat": "privaudit.threats",
    "accountant": "privaudit.accountants",
}
# what an entry point may name, per group, and how it is registered
CLASSES: dict[str, tuple[type, Callable[[Any], Any]]] = {
    "defense": (Defense, register),
    "threat": (Threat, register_threat),
    "accountant": (Accountant, register_accountant),
}
# names and kinds become target names and folder names (privaudit-out/<target>-r<round>)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
SIGNATURES = {
    "round": "round(self, ctx, p, state, net, batch) -> dict[str, Tensor], the next state",
    "observe": "observe(self, view, kind, t, src, dst) -> Observation",
}


class _Broken(Exception):
    """What is wrong with a plugin, and the fix (turned into one PrivauditError)."""

    def __init__(self, what: str, fix: str):
        super().__init__(what)
        self.what = what
        self.fix = fix


@dataclass
class _Plugin:
    label: str  # how errors name it
    file: str | None  # resolved path of a file plugin (None: an entry point)
    registered: list[tuple[str, str, Any]]  # (defense | attack, name, registered object)


_loaded: dict[str, _Plugin] = {}  # resolved file path or entry point → what it registered
_entry_points_read = False


def load_plugins(files: Iterable[str | os.PathLike[str]] = (), *, environment: bool = True) -> None:
    """Load the installed entry points (the first time only), the files of
    ``PRIVAUDIT_PLUGINS`` (with ``environment``) and ``files``, in that order. The first
    broken plugin raises one PrivauditError naming it and the fix; the registries are then
    as they were before that plugin."""
    global _entry_points_read
    if not _entry_points_read:
        for what, group in GROUPS.items():
            for ep in sorted(metadata.entry_points(group=group), key=lambda e: (e.name, e.value)):
                _load_entry_point(what, ep)
        _entry_points_read = True
    if environment:
        for f in os.environ.get(PLUGIN_ENV, "").split(os.pathsep):
            if f.strip():
                _load_file(f.strip(), f"{f.strip()} (from {PLUGIN_ENV})")
    for f in files:
        _load_file(os.fspath(f), os.fspath(f))


def loaded_files() -> list[str]:
    """The resolved paths of the plugin files loaded in this process whose registrations
    still stand, in load order: what another process must load (after the entry points) to
    hold the same registries (a file whose registrations were reset since is left out)."""
    reg = _registries()
    return [
        p.file
        for key, p in _loaded.items()
        if p.file is not None
        and key == p.file
        and all(reg[what].get(name) is obj for what, name, obj in p.registered)
    ]


# -- the two ways in --------------------------------------------------------------------------
def _load_file(given: str, label: str) -> None:
    path = Path(given).expanduser()
    if path.suffix != ".py":
        raise _error(label, _Broken("not a .py file", "pass the path of a Python source file"))
    if not path.is_file():
        raise _error(label, _Broken("no such file", f"check the path (--plugin or {PLUGIN_ENV})"))
    key = str(path.resolve())
    if _still_registered(key):
        return
    stem = re.sub(r"\W", "_", path.stem)
    name = f"_privaudit_plugin_{stem}_{_digest(key)}"

    def load() -> list[str]:
        spec = importlib.util.spec_from_file_location(name, key)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and typing look classes' modules up here
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return []

    fix = "fix the file, or leave it out"
    _guarded(label, key, key, lambda: _importing(load, key, fix), require=True)


def _load_entry_point(what: str, ep: metadata.EntryPoint) -> None:
    dist = getattr(getattr(ep, "dist", None), "name", None) or "its package"
    label = f"{ep.name} (entry point {ep.value!r} of {dist}, group {ep.group})"
    key = f"{ep.group}:{ep.name}={ep.value}"
    if _still_registered(key):
        return

    def load() -> list[str]:
        obj = _importing(ep.load, None, f"repair it, or pip uninstall {dist}")
        if isinstance(obj, ModuleType):  # the same file given by path later: no second copy
            return [str(Path(obj.__file__).resolve())] if getattr(obj, "__file__", None) else []

        if what in CLASSES and isinstance(obj, type) and issubclass(obj, CLASSES[what][0]):
            held = _registries()[what].get(obj.name)
            if held is not obj and type(held) is not obj:  # else it registered on import
                CLASSES[what][1](obj)
        elif what == "attack" and callable(obj) and not isinstance(obj, type):
            if ATTACKS.get(ep.name) is not obj:
                register_attack(ep.name, obj)
        else:
            wanted = (
                f"a {CLASSES[what][0].__name__} subclass"
                if what in CLASSES
                else "an attack function"
            )
            raise _Broken(
                f"the entry point names a {type(obj).__name__}, not a module or {wanted}",
                f"point it at a module that registers, or at {wanted} ({PLUGIN_DOCS})",
            )
        return []

    # several entry points may name one module: only the first import registers
    _guarded(label, key, None, load, require=False)


def _importing(load: Callable[[], Any], path: str | None, fix: str) -> Any:
    """``load()``; an exception from the plugin's own code becomes a :class:`_Broken` naming
    it and the line (in ``path``) it came from; the registries' own refusals pass."""
    try:
        return load()
    except (PrivauditError, _Broken):
        raise
    except (Exception, SystemExit) as e:
        where = ""
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
        if isinstance(e, SyntaxError) and e.filename == path:
            lines.append(e.lineno)
        if lines and lines[-1]:
            where = f" (line {lines[-1]})"
        text = (str(e).strip().splitlines() or [""])[0][:200]
        raise _Broken(f"importing it raised {type(e).__name__}: {text}{where}", fix) from None


# -- checking what a plugin registered ----------------------------------------------------------
def _registries() -> dict[str, dict[str, Any]]:
    return {
        "defense": DEFENSES,
        "attack": ATTACKS,
        "threat": THREATS,
        "accountant": ACCOUNTANTS,
        "membership attack": MEMBERSHIP_ATTACKS,
    }


def _still_registered(key: str) -> bool:
    """Whether the plugin ``key`` was loaded and all it registered is still registered (a
    caller may have reset the registries; the plugin then loads afresh)."""
    plugin = _loaded.get(key)
    if plugin is None:
        return False
    reg = _registries()
    if all(reg[what].get(name) is obj for what, name, obj in plugin.registered):
        return True
    for what, name, obj in plugin.registered:
        if reg[what].get(name) is obj:
            reg[what].pop(name)
    for k in [k for k, p in _loaded.items() if p is plugin]:
        del _loaded[k]
    return False


def _guarded(
    label: str, key: str, file: str | None, load: Callable[[], list[str]], require: bool
) -> None:
    """Run ``load`` (which returns further keys, files, the plugin is known by), then check
    everything it added to the registries (at least one thing when ``require``); on any
    failure put the registries back as they were and raise one PrivauditError naming
    ``label``."""
    reg = _registries()
    before = {what: dict(r) for what, r in reg.items()}
    try:
        aliases = load()
        added = _check(before, require)
    except (Exception, SystemExit) as e:
        for what, r in reg.items():
            r.clear()
            r.update(before[what])
        raise _error(label, e) from None
    plugin = _Plugin(label, file, added)
    for k in [key, *aliases]:
        _loaded[k] = plugin


def _check(before: dict[str, dict[str, Any]], require: bool) -> list[tuple[str, str, Any]]:
    """What the plugin added, each checked; raises :class:`_Broken` for the first problem."""
    reg = _registries()
    for what, r in reg.items():
        for name, obj in before[what].items():
            if r.get(name) is not obj:
                raise _Broken(
                    f"it replaces or removes the {what} {name!r} ({_owner(what, name, before)})",
                    "register under a new name with the registry's decorator; never write "
                    "to a registry (DEFENSES, ATTACKS, THREATS, ACCOUNTANTS) directly",
                )
    added = [(w, n, o) for w, r in reg.items() for n, o in r.items() if n not in before[w]]
    if require and not added:
        raise _Broken(
            "it registers no defense, attack, threat model or accountant",
            "decorate your Defense subclass with @privaudit.defenses.register (or a Threat "
            "with @register_threat, an Accountant with @register_accountant), or call "
            f"privaudit.attacks.register_attack(name, fn) ({PLUGIN_DOCS})",
        )
    targets = {f"{n}-{k}": n for n, d in before["defense"].items() for k in getattr(d, "kinds", {})}
    for what, name, obj in added:
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise _Broken(
                f"its {what} name {name!r} is not a plain name",
                "use letters, digits and - _ . @ only (it becomes part of target and folder names)",
            )
        if what == "defense":
            _check_defense(name, obj, targets, before)
        elif what == "attack":
            check_attack(name, obj)
        elif what == "threat":
            _check_threat(name, obj)
        elif what == "membership attack":
            check_membership_attack(name, obj)
        else:
            _check_accountant(name, obj)
    return added


def _check_threat(name: str, cls: Any) -> None:
    """A threat model must subclass Threat and say which links it sees."""
    if not (isinstance(cls, type) and issubclass(cls, Threat)):
        raise _Broken(
            f"threat model {name!r} is not a privaudit Threat subclass",
            "subclass privaudit.core.threat.Threat and decorate it with @register_threat",
        )
    try:
        th = cls.build(link=(0, 1), attackers=[0])
        seen = th.sees(0, 1)
    except extensions.ExtensionFailed as e:  # its guarded hook (privaudit.core.threat)
        if e.__cause__ is None:  # an answer that is not a bool
            raise _Broken(
                f"threat model {name!r}'s {e.hook} {e.problem}", "return True or False"
            ) from None
        text = extensions.first_line(e.__cause__)
        raise _Broken(
            f"threat model {name!r} cannot be built for agent 0 "
            f"({type(e.__cause__).__name__}: {text})",
            "let build(link=..., attackers=[...]) return an adversary whose sees(src, dst) "
            "answers True or False",
        ) from None
    except Exception as e:
        text = (str(e).strip().splitlines() or [""])[0][:200]
        raise _Broken(
            f"threat model {name!r} cannot be built for agent 0 ({type(e).__name__}: {text})",
            "let build(link=..., attackers=[...]) return an adversary whose sees(src, dst) "
            "answers True or False",
        ) from None
    if not isinstance(seen, bool):
        raise _Broken(
            f"threat model {name!r}'s sees(src, dst) returns a {type(seen).__name__}",
            "return True or False",
        )


def _check_accountant(name: str, acc: Any) -> None:
    """An accountant must subclass Accountant and answer ε ≥ 0 at a plain point."""
    if not isinstance(acc, Accountant):
        raise _Broken(
            f"accountant {name!r} is not a privaudit Accountant",
            "subclass privaudit.core.accountants.Accountant and decorate it with "
            "@register_accountant",
        )
    try:
        eps = acc.epsilon(1.0, 1e-5, 0.01, 100)
    except Exception as e:
        text = (str(e).strip().splitlines() or [""])[0][:200]
        raise _Broken(
            f"accountant {name!r} fails at σ = 1, δ = 1e-5, q = 0.01, 100 rounds "
            f"({type(e).__name__}: {text})",
            "define epsilon(self, z, delta, sample_rate, rounds) -> float",
        ) from None
    if isinstance(eps, bool) or not isinstance(eps, float | int) or not eps >= 0:
        raise _Broken(
            f"accountant {name!r} answers ε = {eps!r} at σ = 1, δ = 1e-5, q = 0.01, 100 rounds",
            "return a float ε ≥ 0 (math.inf where there is no bound)",
        )


def _check_defense(
    name: str, d: Any, targets: dict[str, str], before: dict[str, dict[str, Any]]
) -> None:
    """The contract of docs/extending.md that can be checked without running a round."""
    cls = type(d)
    if not isinstance(d, Defense):
        raise _Broken(
            f"defense {name!r} is a {cls.__name__}, not a privaudit Defense",
            "subclass privaudit.defenses.Defense and decorate the class with @register",
        )
    for method, signature in SIGNATURES.items():
        if getattr(cls, method) is getattr(Defense, method):
            raise _Broken(
                f"defense {name!r} ({cls.__qualname__}) does not override Defense.{method}",
                f"define {signature} ({PLUGIN_DOCS})",
            )
    kinds = d.kinds if isinstance(d.kinds, dict) else {}
    if not kinds or not all(isinstance(t, str) for t in kinds.values()):
        raise _Broken(
            f"defense {name!r} declares no message kinds",
            "set kinds = {'<kind>': '<what crosses the link, one line>'} on the class",
        )
    for kind in kinds:
        if not isinstance(kind, str) or not NAME.fullmatch(kind):
            raise _Broken(
                f"defense {name!r} has a kind {kind!r} that is not a plain name",
                "use letters, digits and - _ . @ only",
            )
        target = f"{name}-{kind}"
        if target in targets:
            raise _Broken(
                f"its target {target!r} is also a target of "
                f"{_owner('defense', targets[target], before)} {targets[target]!r}",
                "rename the defense or the kind: every <defense>-<kind> must be unique",
            )
        targets[target] = name
    if not (isinstance(d.Params, type) and dataclasses.is_dataclass(d.Params)):
        raise _Broken(
            f"defense {name!r} has no Params dataclass",
            "set Params to a @dataclass of its -p parameters, each with a default",
        )
    try:
        p = params_of(d.Params, {})
        W = metropolis_hastings(build_topology(d.topology_for(None), 4)).double()
        facts = [d.privacy(p, kind, W) for kind in kinds]
    except Exception as e:
        text = (str(e).strip().splitlines() or [""])[0][:200]
        raise _Broken(
            f"defense {name!r} fails with its default parameters ({type(e).__name__}: {text})",
            "give every Params field a valid default, and let privacy(p, kind, W) answer "
            "every kind",
        ) from None
    if not all(isinstance(f, Privacy) for f in facts):
        raise _Broken(
            f"defense {name!r}'s privacy() does not return Privacy facts",
            "return privaudit.core.privacy.Privacy(...) for every kind",
        )


# -- one line per failure ---------------------------------------------------------------------
def origin(what: str, name: str) -> str:
    """Where the registered ``what`` ("defense" or "attack") ``name`` came from, in words for
    an error line: ``plugin LABEL`` (its file or entry point), ``the built-in defense`` /
    ``the built-in attack``, or ``module M`` (registered by importing M)."""
    return _owner(what, name)


extensions.set_origin(origin)  # how core names a failing extension's plugin


def _owner(what: str, name: str, registries: dict[str, dict[str, Any]] | None = None) -> str:
    """Who registered ``name``: a plugin (by label), privaudit itself, or a module. A plugin
    is named only while what it registered is what ``name`` holds (after a registry reset,
    another file may register the same name)."""
    obj = (registries or _registries())[what].get(name)
    for plugin in _loaded.values():
        if any(w == what and n == name and o is obj for w, n, o in plugin.registered):
            return f"plugin {plugin.label}"
    holder = obj if what in ("attack", "threat", "membership attack") else type(obj)
    module = getattr(holder, "__module__", "") or ""
    return f"the built-in {what}" if module.startswith("privaudit.") else f"module {module}"


def _error(label: str, e: BaseException) -> PrivauditError:
    if isinstance(e, NameTaken):
        owner = _owner(e.what, e.name)
        fix = "give yours another name"
        if owner.startswith("plugin"):
            fix += " (or load the plugin once: installed or --plugin, not both)"
        return PrivauditError(
            f"plugin {label}: {e.what} name {e.name!r} is taken by {owner}; fix: {fix}"
        )
    if isinstance(e, _Broken):
        return PrivauditError(f"plugin {label}: {e.what}; fix: {e.fix}")
    if isinstance(e, PrivauditError):
        return PrivauditError(f"plugin {label}: {e}")
    text = (str(e).strip().splitlines() or [""])[0][:200]
    return PrivauditError(
        f"plugin {label}: checking it raised {type(e).__name__}: {text}; "
        f"fix: the plugin ({PLUGIN_DOCS})"
    )


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]
