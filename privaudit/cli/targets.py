"""``privaudit targets``: what can be named — the attack targets (``<defense>-<message>``),
and with ``--list`` the attacks, threat models or accountants — one line each, plugins'
included."""

from __future__ import annotations

import argparse
from typing import Any

from privaudit.cli.vocabulary import Vocabulary
from privaudit.core.files import dumps_strict

# what --list shows, and whether reading it loads the engine: the targets (the defenses'
# message kinds) and the attacks are registered by torch modules; the threat models and
# accountants are not, so listing them answers at once
LISTS = {"targets": True, "attacks": True, "threats": False, "accountants": False}


def add_parser(sub: Any, words: Vocabulary) -> None:
    """Register ``targets`` on the CLI's subparsers."""
    t = sub.add_parser(
        "targets", help="list attack targets (<defense>-<message>), or --list what else"
    )
    t.add_argument(
        "--list",
        default="targets",
        choices=tuple(LISTS),
        help="what to list: targets (default), attacks, threats or accountants",
    )
    t.add_argument(
        "--json",
        action="store_true",
        help='print a JSON list instead of lines: {"target", "message"} per target, '
        '{"name", "summary"} per attack, threat model or accountant',
    )
    t.set_defaults(func=cmd_targets, loads_engine=loads_engine)


def loads_engine(a: argparse.Namespace) -> bool:
    """Whether listing ``--list`` needs torch and the engine (:data:`LISTS`)."""
    return LISTS[a.list]


def rows(what: str) -> list[tuple[str, str]]:
    """(name, one line) for everything registered of ``what``, in registry order."""
    if what == "attacks":
        from privaudit.attacks.registry import SUMMARIES

        return list(SUMMARIES.items())
    if what == "threats":
        from privaudit.core.threat import THREATS, threat_names

        return [(n, THREATS[n].summary) for n in threat_names()]
    if what == "accountants":
        from privaudit.core.accountants import ACCOUNTANTS

        return [(n, a.summary) for n, a in ACCOUNTANTS.items()]
    from privaudit.sim.targets import all_targets

    return [(name, text) for name, (_, _, text) in all_targets().items()]


def cmd_targets(a: argparse.Namespace) -> int:
    found = rows(a.list)
    if a.json:
        key = {"targets": ("target", "message")}.get(a.list, ("name", "summary"))
        print(dumps_strict([{key[0]: n, key[1]: t} for n, t in found], sort_keys=False))
    else:
        width = max(len(n) for n, _ in found)
        for n, t in found:
            print(f"{n:<{width}}  {t}")
    return 0
