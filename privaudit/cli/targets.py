"""``privaudit targets``: what can be named — the attack targets (``<defense>-<message>``),
and with ``--list`` the attacks, threat models or accountants — one line each, plugins'
included."""

from __future__ import annotations

import argparse
import json
from typing import Any

LISTS = ("targets", "attacks", "threats", "accountants")


def add_parser(sub: Any) -> None:
    """Register ``targets`` on the CLI's subparsers."""
    t = sub.add_parser(
        "targets", help="list attack targets (<defense>-<message>), or --list what else"
    )
    t.add_argument(
        "--list",
        default="targets",
        choices=LISTS,
        help="what to list: targets (default), attacks, threats or accountants",
    )
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_targets)


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
        print(json.dumps([{key[0]: n, key[1]: t} for n, t in found], indent=2))
    else:
        width = max(len(n) for n, _ in found)
        for n, t in found:
            print(f"{n:<{width}}  {t}")
    return 0
