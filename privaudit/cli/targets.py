"""``privaudit targets``: what can be named — the attack targets (``<defense>-<message>``),
and with ``--list`` the attacks, threat models or accountants — one line each, plugins'
included."""

from __future__ import annotations

import argparse
from typing import Any

from privaudit.cli.vocabulary import Vocabulary
from privaudit.core.files import dumps_strict

LISTS = ("targets", "attacks", "threats", "accountants")  # what --list shows


def add_parser(sub: Any, words: Vocabulary) -> None:
    """Register ``targets`` on the CLI's subparsers; what it lists of the torch-backed
    registries (targets, attacks) is ``words``' (the built-ins' copy, or the registries
    themselves once plugins are loaded), so it never loads the engine."""
    t = sub.add_parser(
        "targets", help="list attack targets (<defense>-<message>), or --list what else"
    )
    t.add_argument(
        "--list",
        default="targets",
        choices=LISTS,
        help="what to list: targets (default), attacks, threats or accountants",
    )
    t.add_argument(
        "--json",
        action="store_true",
        help='print a JSON list instead of lines: {"target", "message"} per target, '
        '{"name", "summary"} per attack, threat model or accountant',
    )
    t.set_defaults(func=cmd_targets, loads_engine=lambda a: False, words=words)


def rows(what: str, words: Vocabulary) -> list[tuple[str, str]]:
    """(name, one line) for everything registered of ``what``, in registry order."""
    if what == "targets":
        return list(words.targets)
    if what == "attacks":
        return list(words.attack_lines)
    if what == "threats":
        from privaudit.core.threat import THREATS, threat_names

        return [(n, THREATS[n].summary) for n in threat_names()]
    from privaudit.core.accountants import ACCOUNTANTS

    return [(n, a.summary) for n, a in ACCOUNTANTS.items()]


def cmd_targets(a: argparse.Namespace) -> int:
    found = rows(a.list, a.words)
    if a.json:
        key = {"targets": ("target", "message")}.get(a.list, ("name", "summary"))
        print(dumps_strict([{key[0]: n, key[1]: t} for n, t in found], sort_keys=False))
    else:
        width = max(len(n) for n, _ in found)
        for n, t in found:
            print(f"{n:<{width}}  {t}")
    return 0
