"""What the ``privaudit`` process needs from its surroundings, set up once by
:func:`privaudit.cli.app.main` for the length of a command: output streams that cannot fail
to encode (a C locale cannot print ε), Ctrl-C and SIGTERM that end in one line and exit
code 2 however many arrive, and a matplotlib folder it can write (a read-only home).

Only the standard library is imported: this runs before the engine (torch) loads.
"""

from __future__ import annotations

import _thread
import atexit
import codecs
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

# -- streams ----------------------------------------------------------------------------------
# the ASCII spelling of each character the CLI prints that ASCII lacks
SPELLINGS = {
    "ε": "eps",
    "σ": "sigma",
    "δ": "delta",
    "λ": "lambda",
    "ϕ": "phi",
    "→": "->",
    "←": "<-",
    "↔": "<->",
    "⇒": "=>",
    "↑": "^",
    "↓": "v",
    "≤": "<=",
    "≥": ">=",
    "≠": "!=",
    "≈": "~",
    "≡": "==",
    "∂": "d",
    "⊙": "*",
    "⟨": "<",
    "⟩": ">",
    "×": "x",
    "·": "*",
    "∞": "inf",
    "−": "-",
    "–": "-",
    "—": "--",
    "…": "...",
    "±": "+/-",
    "√": "sqrt",
    "∇": "grad",
    "∈": "in",
    "‖": "||",
    "⁰": "^0",
    "¹": "^1",
    "²": "^2",
    "³": "^3",
    "ᵀ": "^T",
    "½": "1/2",
    "¼": "1/4",
    "¾": "3/4",
    "✓": "yes",
    "✗": "no",
    "§": "section ",
    "‘": "'",
    "’": "'",
    "“": '"',
    "”": '"',
    "\u00a0": " ",
}
GREEK = re.compile(r"GREEK (SMALL|CAPITAL) LETTER (\w+)")
ERRORS = "privaudit-ascii"  # the codec error handler that prints SPELLINGS
# what a stream must encode to print the CLI's text as written
PROBE = "".join(SPELLINGS)


def ascii_spelling(ch: str) -> str:
    """``ch`` in ASCII: its spelling (ε → eps, → → ->, σ → sigma, α → alpha), else its
    letters without accents (é → e, ₂ → 2), else ``?``; a lone combining mark is dropped."""
    if ch in SPELLINGS:
        return SPELLINGS[ch]
    greek = GREEK.fullmatch(unicodedata.name(ch, ""))
    if greek:
        name = greek[2].lower().replace("lamda", "lambda")
        return name if greek[1] == "SMALL" else name.capitalize()
    if unicodedata.combining(ch):
        return ""
    plain = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
    return plain or "?"


def _spell(exc: UnicodeError) -> tuple[str, int]:
    """The codec error handler: what could not be encoded, spelled in ASCII."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    return "".join(ascii_spelling(ch) for ch in exc.object[exc.start : exc.end]), exc.end


codecs.register_error(ERRORS, _spell)


def _cannot_encode(stream: Any) -> bool:
    try:
        PROBE.encode(stream.encoding)
    except (UnicodeEncodeError, LookupError, TypeError, AttributeError):
        return True
    return False


@contextmanager
def encodable_streams() -> Iterator[None]:
    """Standard output and error print what their encoding lacks in ASCII spellings
    (:func:`ascii_spelling`) instead of raising UnicodeEncodeError — which would end a
    command after its work was done, e.g. under ``LC_ALL=C``. Everything that writes to
    them goes through this: argparse's help, warnings, rich's progress bars. A stream that
    can encode everything, or cannot be reconfigured, is left as it is; the streams'
    own error handling comes back after."""
    changed: list[tuple[TextIO, str]] = []
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and _cannot_encode(stream):
            try:
                errors = stream.errors
                stream.reconfigure(errors=ERRORS)
            except (OSError, ValueError, AttributeError):
                continue
            changed.append((stream, errors))
    try:
        yield
    finally:
        for stream, errors in changed:
            try:
                stream.reconfigure(errors=errors)
            except (OSError, ValueError):  # closed, or a broken pipe
                pass


# -- signals ----------------------------------------------------------------------------------
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupts:
    """The CLI's handler of SIGINT and SIGTERM outside the round loops.

    A signal raises KeyboardInterrupt, unless one is already being handled (a second Ctrl-C
    while the first unwinds or is reported) or the command has settled (:meth:`settle`: it
    is reporting its line, or exiting): then it is ignored, so it can neither cut the
    report nor kill the process by signal. Not once only: a KeyboardInterrupt can be lost
    (raised in a weakref callback at import, or turned into an ImportError by numpy's C
    code), and the next Ctrl-C must still stop the command. Inside :meth:`held` signals
    wait for the block's end. ``received``: how many signals came."""

    AT_ONCE_AFTER = 3  # the signal, held, that raises at once (as the round loops count)

    def __init__(self) -> None:
        self.received = 0
        self.signum = signal.SIGINT
        self.held_since: int | None = None
        self.settled = False
        self.resent = False  # the next signal is a lost one sent again (:meth:`again`)
        self.hooked = False  # in the unraisable hook, where a raise would be lost again

    def __call__(self, signum: int, frame: object) -> None:
        self.received += 1
        self.signum = signum
        resent, self.resent = self.resent, False
        if self.settled:
            return
        if self.hooked or (resent and isinstance(sys.exc_info()[1], KeyboardInterrupt)):
            self.later()  # it would be lost here again: once more, a moment later
            return
        if isinstance(sys.exc_info()[1], KeyboardInterrupt):
            return
        if self.held_since is not None and self.received - self.held_since < self.AT_ONCE_AFTER:
            return
        raise KeyboardInterrupt

    @contextmanager
    def held(self) -> Iterator[None]:
        """Signals in the block raise at its end, not inside it (the third at once): for
        torch's import, whose C++ start-up aborts the process (``std::terminate``, SIGABRT)
        when a KeyboardInterrupt reaches it."""
        self.held_since = self.received
        try:
            yield
        finally:
            waiting, self.held_since = self.received > self.held_since, None
        if waiting and not self.settled:
            raise KeyboardInterrupt

    def settle(self) -> None:
        """The command is ending: ignore every signal from now on (its exit code stands)."""
        self.settled = True

    def unraisable(self, hook: Any) -> Any:
        """``sys.unraisablehook`` for the command: a KeyboardInterrupt raised where Python
        cannot pass it on (a weakref callback at import, a ``__del__``) would be printed as
        "Exception ignored" and lost; it is sent again instead, to land in the code that
        runs next. Anything else goes to ``hook``."""

        def resend(unraisable: Any) -> None:
            if isinstance(unraisable.exc_value, KeyboardInterrupt) and not self.settled:
                self.hooked = True
                try:
                    self.later()
                finally:
                    self.hooked = False
            else:
                hook(unraisable)

        return resend

    def later(self) -> None:
        """:meth:`again` from another thread, a moment later: not back into the hook (or
        the handler) that calls it."""
        timer = threading.Timer(0.001, self.again)
        timer.daemon = True
        timer.start()

    def again(self) -> None:
        """Signal the main thread again, unless the command has settled meanwhile: a real
        signal, which also wakes it from a blocking call (where there is ``pthread_kill``)."""
        if self.settled:
            return
        self.resent = True
        if hasattr(signal, "pthread_kill"):
            signal.pthread_kill(threading.main_thread().ident, self.signum)
        else:
            _thread.interrupt_main(self.signum)


@contextmanager
def interrupts_handled(program: bool) -> Iterator[Interrupts]:
    """SIGINT and SIGTERM become KeyboardInterrupt (:class:`Interrupts`) in the block — the
    default SIGTERM would kill the process before it could say a word; the round loops
    install their own handlers inside it and restore this one after
    (:mod:`privaudit.core.interrupts`). A signal ignored by whoever started the process
    (``nohup``, a shell's ``&``) stays ignored. After the block the previous handlers come
    back — unless ``program`` (the process is about to exit): then signals stay ignored, so
    a late one cannot turn the exit code into a death by signal. Off the main thread, where
    handlers cannot be set, the block runs as is."""
    interrupts = Interrupts()
    saved: dict[int, Any] = {}
    try:
        for sig in SIGNALS:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                saved[sig] = signal.signal(sig, interrupts)
    except ValueError:  # not the main thread
        pass
    hook, sys.unraisablehook = sys.unraisablehook, interrupts.unraisable(sys.unraisablehook)
    try:
        yield interrupts
    finally:
        interrupts.settle()
        sys.unraisablehook = hook
        for sig, old in saved.items():
            if program:
                signal.signal(sig, signal.SIG_IGN)
            else:
                signal.signal(sig, signal.SIG_DFL if old is None else old)
        forget_interrupts()


def forget_interrupts() -> None:
    """Clear CPython's note that a KeyboardInterrupt went unhandled. One that passes
    through code run by ``exec(str)`` (dataclasses and namedtuples build their methods so,
    at import) sets it even when the CLI handles it later, and ``python -m`` then ends by
    killing itself with SIGINT instead of returning the CLI's exit code. Every ``exec`` of
    a string clears it first."""
    exec("")


# -- matplotlib -------------------------------------------------------------------------------
def _matplotlib_dirs() -> list[Path]:
    """The config and cache folders matplotlib uses when MPLCONFIGDIR is unset (its own
    choice, ``matplotlib._get_config_or_cache_dir``); [] where it picks them otherwise."""
    if sys.platform == "win32":
        return []
    home = Path.home()
    if not sys.platform.startswith(("linux", "freebsd")):
        return [home / ".matplotlib"]
    config = os.environ.get("XDG_CONFIG_HOME") or home / ".config"
    cache = os.environ.get("XDG_CACHE_HOME") or home / ".cache"
    return [Path(config, "matplotlib"), Path(cache, "matplotlib")]


def _writable(folder: Path) -> bool:
    """Whether ``folder`` is, or could be created as, a folder this process can write;
    nothing is created to find out."""
    for path in (folder, *folder.parents):
        if path.exists():
            return path.is_dir() and os.access(path, os.W_OK)
    return False


def writable_matplotlib_dir() -> None:
    """Where matplotlib's default folders cannot be written (a read-only or missing home),
    point MPLCONFIGDIR at a private temporary folder, removed at exit, before matplotlib
    loads: matplotlib would make one too, but with two warnings on every figure command."""
    if os.environ.get("MPLCONFIGDIR") or "matplotlib" in sys.modules:
        return
    try:
        if all(_writable(folder) for folder in _matplotlib_dirs()):
            return
    except (RuntimeError, OSError):  # no home folder at all
        pass
    try:
        folder = tempfile.mkdtemp(prefix="privaudit-matplotlib-")
    except OSError:  # no writable temp folder either: matplotlib says so itself
        return
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["MPLCONFIGDIR"] = folder
