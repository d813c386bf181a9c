"""``privaudit``: list targets, train a defense, attack a target's messages.

Every user error ends in one line ``privaudit: error: …`` naming the fix, and exit code 2.
"""

from __future__ import annotations

import argparse
import errno
import sys
import warnings

from privaudit.cli import attack, audit, claims, compare, targets, train
from privaudit.cli.options import Parser
from privaudit.core import limits
from privaudit.core.errors import PrivauditError

# the commands, in the order --help lists them; each registers itself with add_parser
COMMANDS = (targets, train, attack, audit, compare, claims)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="privaudit", description=__doc__.splitlines()[0])
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="FILE.py",
        help="load your own defense or attack from this file, before the command (repeatable; "
        "PRIVAUDIT_PLUGINS and installed packages' entry points load too; docs/extending.md)",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
    try:
        args = build_parser().parse_args(argv)
        from privaudit.plugins import load_plugins

        load_plugins(args.plugin)  # entry points, PRIVAUDIT_PLUGINS, then --plugin files
        if getattr(args, "threads", None) is not None:
            limits.check_threads("--threads", args.threads)
            import torch

            torch.set_num_threads(args.threads)
        return args.func(args)
    except PrivauditError as e:
        print(f"privaudit: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `privaudit targets | head`
        sys.stderr.close()
        return 0
    except OSError as e:  # a path that cannot be read or written
        print(f"privaudit: error: {os_error(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a round loop says itself how to resume (a PrivauditError)
        print("privaudit: error: interrupted", file=sys.stderr)
        return 2


def os_error(e: OSError) -> str:
    """One line for a failed file operation: the path, the system's reason and the fix."""
    reason = e.strerror or str(e)
    path = e.filename
    if path is None:
        return f"{reason}; check the paths given (--out, --run, --data-root)"
    if e.errno == errno.EROFS:
        return f"cannot write {path}: {reason}; choose a writable --out"
    if e.errno in (errno.EACCES, errno.EPERM):
        return (
            f"cannot access {path}: {reason}; choose a --out you can write (and a --run or "
            "--data-root you can read)"
        )
    if e.errno == errno.ENOSPC:
        return f"cannot write {path}: {reason}; free some space or choose another --out"
    if e.errno in (errno.ENOTDIR, errno.EEXIST, errno.EISDIR):
        return f"cannot use {path}: {reason}; choose another --out (a folder path)"
    return f"cannot use {path}: {reason}; check the path"


if __name__ == "__main__":
    sys.exit(main())
