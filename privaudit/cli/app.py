"""``privaudit``: list targets, train a defense, attack a target's messages.

Every user error ends in one line ``privaudit: error: …`` naming the fix, and exit code 2;
so does an interrupt (Ctrl-C, SIGTERM). A bug ends in one ``internal error`` line and exit
code 1. ``--debug`` (or ``PRIVAUDIT_DEBUG=1``) adds the traceback after the line.

Importing this module loads no command: :func:`main` sets up the process
(:mod:`.console`: signals, streams, matplotlib) before the commands and their engine load.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import traceback
import warnings
from importlib import metadata
from types import ModuleType

from privaudit.cli import console
from privaudit.cli.vocabulary import BUILT_IN, PLUGIN_GROUPS, Vocabulary, registered
from privaudit.core.errors import MISSING, PLUGIN_ENV, PrivauditError, unknown

DEBUG_ENV = "PRIVAUDIT_DEBUG"
INTERNAL = f"rerun with --debug (or {DEBUG_ENV}=1) for the traceback and report it"
OUT_OF_MEMORY = (
    "out of memory: these settings need more than this machine (or this process's limit) "
    "gives; lower --agents or --batch-size, use a smaller --model, set --max-memory, or free "
    "memory (a run with a checkpoint resumes from it)"
)


def commands() -> tuple[ModuleType, ...]:
    """The command modules, in the order --help lists them; each registers itself with
    ``add_parser``. Imported here, not at the top: they load numpy."""
    from privaudit.cli import attack, audit, claims, compare, mia, report, reproduce, targets, train

    return (targets, train, attack, audit, mia, compare, reproduce, claims, report)


def top_level(p: argparse.ArgumentParser) -> None:
    """The flags given before the command: ``--plugin FILE.py`` (repeatable) and
    ``--debug``; the real parser and the plugin pre-scan (:func:`plugin_files`) share them."""
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="FILE.py",
        help="load your own defense, attack, threat model or accountant from this file before "
        "the command, whose --help and checks then list it like a built-in (repeatable; "
        f"{PLUGIN_ENV} and installed packages' entry points load too; docs/extending.md)",
    )
    p.add_argument(
        "--debug",
        action="store_true",
        help=f"after an error's one line, print its traceback too (or set {DEBUG_ENV}=1)",
    )


def build_parser(words: Vocabulary = BUILT_IN) -> argparse.ArgumentParser:
    """The whole command line: the top-level flags, then each command's subparser, listing
    the defenses and attacks of ``words`` (the built-ins by default, known without loading
    torch; with plugins loaded, the registries' :func:`~privaudit.cli.vocabulary.registered`)."""
    from privaudit.cli.options import Parser

    p = Parser(prog="privaudit", description=__doc__.splitlines()[0])
    top_level(p)
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in commands():
        command.add_parser(sub, words)
    return p


def plugin_files(argv: list[str]) -> list[str]:
    """The ``--plugin`` files of ``argv``, read before it is parsed as the parser reads
    them: among the top-level flags, before the command's name (abbreviated, or as
    ``--plugin=F``, too); a flag after the command is the command's. A command line this
    cannot read names none: the parser then says what is wrong with it."""
    from privaudit.cli.options import Parser

    pre = Parser(prog="privaudit", add_help=False)
    top_level(pre)
    pre.add_argument("command_line", nargs=argparse.REMAINDER)
    try:
        known, _ = pre.parse_known_args(argv)
    except PrivauditError:
        return []
    return list(known.plugin)


# the registries behind the vocabulary: once imported, reading them costs nothing more
ENGINE = frozenset({"privaudit.defenses", "privaudit.attacks", "privaudit.sim.targets"})


def any_plugins(files: list[str]) -> bool:
    """Whether this process has plugins to load: ``files`` (``--plugin``), a file in
    ``PRIVAUDIT_PLUGINS``, or an installed package's entry point in a plugin group (the
    index is read; nothing of it is imported)."""
    if files or any(f.strip() for f in os.environ.get(PLUGIN_ENV, "").split(os.pathsep)):
        return True
    installed = metadata.entry_points()
    return any(installed.select(group=group) for group in PLUGIN_GROUPS)


def main(argv: list[str] | None = None) -> int:
    """Run one ``privaudit`` command; its exit code: 0 done, 2 a user error or an interrupt,
    1 a bug. ``argv`` None is the program itself (``sys.argv``): signals stay ignored after
    it returns, while the process exits."""
    program = argv is None
    with console.interrupts_handled(program) as interrupts, console.encodable_streams():
        try:
            try:
                return run(argv, interrupts)
            finally:
                interrupts.settle()  # a signal from here on is ignored: the exit code stands
        except KeyboardInterrupt as e:  # before a round loop, which says itself how to resume
            interrupts.settle()
            return report("interrupted", e, debugging(argv), 2)


def parse(argv: list[str] | None, interrupts: console.Interrupts) -> argparse.Namespace:
    """``argv`` parsed, its plugins loaded first where there are any (entry points,
    ``PRIVAUDIT_PLUGINS``, then the ``--plugin`` files), so that --help and the parser list
    what they register; then torch, unless the command says it needs none (its
    ``loads_engine`` answers False: ``--help`` and such commands never load it)."""
    given = sys.argv[1:] if argv is None else list(argv)
    files = plugin_files(given)
    words = BUILT_IN
    if any_plugins(files):
        load_engine(interrupts)
        from privaudit.plugins import load_plugins

        load_plugins(files)
        words = registered()
    elif ENGINE.issubset(sys.modules):  # loaded already (the API, a test): what it holds now
        words = registered()
    args = build_parser(words).parse_args(given)
    target = getattr(args, "target", None)
    if isinstance(target, str) and target not in dict(words.targets):  # before torch loads
        raise PrivauditError(f"{unknown('target', target, dict(words.targets))}; {MISSING}")
    needs = getattr(args, "loads_engine", None)
    if needs is None or needs(args):
        load_engine(interrupts)
    return args


def load_engine(interrupts: console.Interrupts) -> None:
    """Import torch with signals held: a Ctrl-C must not reach its C++ start-up."""
    with interrupts.held():
        import torch  # noqa: F401


def run(argv: list[str] | None, interrupts: console.Interrupts) -> int:
    """Parse ``argv`` (:func:`parse`) and run its command; an error becomes its one line
    (and, debugging, its traceback) and the exit code. An interrupt propagates (a
    KeyboardInterrupt)."""
    warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
    console.writable_matplotlib_dir()
    debug = debugging(argv)
    try:
        args = parse(argv, interrupts)
        debug = debug or args.debug
        if getattr(args, "threads", None) is not None:
            import torch

            from privaudit.core import limits

            limits.check_threads("--threads", args.threads)
            torch.set_num_threads(args.threads)
        from privaudit.cli import rules

        rules.check(args)  # options idle in their mode, agents and rounds: before any work
        return args.func(args)
    except PrivauditError as e:
        interrupts.settle()
        return report(str(e), e, debug, 2)
    except MemoryError as e:  # the settings ask for more than the machine gives: no bug
        interrupts.settle()
        return report(OUT_OF_MEMORY, e, debug, 2)
    except BrokenPipeError:  # e.g. `privaudit targets | head`
        interrupts.settle()
        sys.stderr.close()
        return 0
    except OSError as e:  # a path that cannot be read or written
        interrupts.settle()
        return report(os_error(e), e, debug, 2)
    except Exception as e:  # a bug: one line, and the traceback on request
        interrupts.settle()
        if interrupts.received:  # the interrupt, turned into another error where it landed
            return report("interrupted", e, debug, 2)
        if type(e).__name__ == "OutOfMemoryError":  # torch's, on a GPU (torch not imported here)
            return report(OUT_OF_MEMORY, e, debug, 2)
        what = " ".join(f"{type(e).__name__}: {e}".split())
        return report(f"internal error: {what}; {INTERNAL}", e, debug, 1)


def debugging(argv: list[str] | None) -> bool:
    """Whether tracebacks were asked for: ``PRIVAUDIT_DEBUG`` set (not empty, 0, false or
    no), or ``--debug`` among the arguments (seen here too when they fail to parse)."""
    env = os.environ.get(DEBUG_ENV, "").strip().lower()
    given = sys.argv[1:] if argv is None else argv
    return env not in ("", "0", "false", "no") or "--debug" in given


def report(line: str, error: BaseException, debug: bool, code: int) -> int:
    """Print ``privaudit: error: <line>`` and, when debugging, ``error``'s traceback with
    the exceptions it was raised from; return ``code``."""
    print(f"privaudit: error: {line}", file=sys.stderr)
    if debug:
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    return code


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
