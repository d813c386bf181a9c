"""``privaudit targets``: the attack targets, ``<defense>-<message>``, one line each."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(sub: Any) -> None:
    """Register ``targets`` on the CLI's subparsers."""
    t = sub.add_parser("targets", help="list attack targets (<defense>-<message>)")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_targets)


def cmd_targets(a: argparse.Namespace) -> int:
    from privaudit.sim.targets import all_targets

    rows = [(name, text) for name, (_, _, text) in all_targets().items()]
    if a.json:
        print(json.dumps([{"target": n, "message": t} for n, t in rows], indent=2))
    else:
        width = max(len(n) for n, _ in rows)
        for n, t in rows:
            print(f"{n:<{width}}  {t}")
    return 0
