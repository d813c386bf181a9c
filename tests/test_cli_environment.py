"""The CLI where its surroundings are hostile (issue 30): a terminal that cannot print ε,
Ctrl-C and SIGTERM during start-up, a read-only home; and the ``--debug`` switch.

Where the environment or signals matter the CLI runs as a real process
(``python -m privaudit.cli``); the rest runs in process."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import weakref

import pytest

from privaudit.cli import console, main

CLI = [sys.executable, "-m", "privaudit.cli"]
# a C locale, and an ASCII stream whatever the locale says
ASCII = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": "ascii"}
INTERNAL = "rerun with --debug (or PRIVAUDIT_DEBUG=1) for the traceback and report it"


def environment(**changes: str | None) -> dict[str, str]:
    """This process's environment with ``changes`` (None: removed) and no debug switch."""
    env = {k: v for k, v in os.environ.items() if k != "PRIVAUDIT_DEBUG"}
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def default_signals() -> None:
    """In the child: SIGINT and SIGTERM handled by default, whatever this runner ignores."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def cli(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*CLI, *argv], capture_output=True, env=env, timeout=300)


def ascii_text(data: bytes) -> str:
    """``data`` as text, failing the test unless every byte is ASCII."""
    return data.decode("ascii")


# -- 1. a terminal that cannot encode the CLI's text -------------------------------------------
@pytest.mark.parametrize(
    "text, spelled",
    [
        ("ε = ∞ at σ = 1, δ = 1e-05", "eps = inf at sigma = 1, delta = 1e-05"),
        ("link 0↔1 → 2; σ² ≤ ½ × η", "link 0<->1 -> 2; sigma^2 <= 1/2 x eta"),
        ("α β γ λ Σ Δ ≥ − — …", "alpha beta gamma lambda Sigma Delta >= - -- ..."),
        ("café x̃ 漢", "cafe x ?"),
    ],
)
def test_unencodable_characters_get_ascii_spellings(text, spelled):
    assert text.encode("ascii", console.ERRORS).decode("ascii") == spelled


def test_an_ascii_stream_in_process_is_spelled_and_restored(monkeypatch, capsys):
    """``targets`` (σ, ½, ≡ in its text) on an ASCII standard output: spelled, and the
    stream's own error handling is back after the command."""
    stream = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")
    monkeypatch.setattr(sys, "stdout", stream)
    assert main(["targets"]) == 0
    assert stream.errors == "strict"
    stream.flush()
    out = ascii_text(stream.buffer.getvalue())
    assert "sigma^2" in out and "dpdl-cg" in out


def test_a_c_locale_prints_ascii_spellings(tmp_path):
    """``targets``, ``train --help``, ``train`` (its ε and σ lines, its --json and its
    progress bar, which rich draws as on a terminal) under a C locale: ASCII output with
    the spellings, exit 0, no traceback — the run is saved and then said to be."""
    env = environment(**ASCII)
    run = str(tmp_path / "run")
    train = ["train", "--defense", "dpdl", "--rounds", "2", "--agents", "3", "--sigma", "1"]

    listed = cli("targets", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "sigma^2" in ascii_text(listed.stdout)

    helped = cli("train", "--help", env=env)
    assert helped.returncode == 0, helped.stderr
    assert "eps per agent" in ascii_text(helped.stdout)

    trained = cli(*train, "--no-progress", "--out", run, env=env)
    out, err = ascii_text(trained.stdout), ascii_text(trained.stderr)
    assert trained.returncode == 0 and "Traceback" not in err, err
    assert "sigma = 1" in out and "eps = " in out, out

    as_json = cli(*train, "--no-progress", "--out", run, "--json", env=env)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(ascii_text(as_json.stdout))["sigma"] == 1.0

    bars = cli(*train, "--out", str(tmp_path / "bars"), env={**env, "TTY_COMPATIBLE": "1"})
    err = ascii_text(bars.stderr) + ascii_text(bars.stdout)
    assert bars.returncode == 0 and "Traceback" not in err, err
    assert "dpdl rounds" in err  # the bar was drawn


# -- 2. --debug and internal errors ------------------------------------------------------------
@pytest.mark.parametrize("mode", ["plain", "--debug", "PRIVAUDIT_DEBUG=1"])
def test_debug_adds_the_traceback_and_its_cause(mode, tmp_path, monkeypatch, capsys):
    """A user error is one line; with --debug or PRIVAUDIT_DEBUG=1 the traceback follows,
    the exception it was raised from (torchvision's) included."""
    monkeypatch.delenv("PRIVAUDIT_DEBUG", raising=False)
    if mode.startswith("PRIVAUDIT_DEBUG"):
        monkeypatch.setenv("PRIVAUDIT_DEBUG", "1")
    (tmp_path / "empty").mkdir()
    argv = ["train", "--defense", "nd", "--dataset", "mnist", "--data-root"]
    argv += [str(tmp_path / "empty"), "--out", str(tmp_path / "x"), "--no-progress"]
    code = main(["--debug", *argv] if mode == "--debug" else argv)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 2 and lines[0].startswith("privaudit: error: mnist is missing"), err
    if mode == "plain":
        assert len(lines) == 1 and "Traceback" not in err, err
    else:
        assert lines[1] == "Traceback (most recent call last):", err
        assert "RuntimeError: Dataset not found" in err  # the cause
        assert "direct cause of the following exception" in err
        assert lines[-1].startswith("privaudit.core.errors.PrivauditError: mnist is missing")


@pytest.mark.parametrize("debug", [False, True])
def test_a_bug_is_one_internal_error_line_and_exit_1(debug, monkeypatch, capsys):
    """An unexpected exception is a bug: one line naming it and how to report it, exit code
    1; --debug adds its traceback."""
    from privaudit.cli import targets

    def broken(a):
        raise ZeroDivisionError("boom\n  on two lines")

    monkeypatch.delenv("PRIVAUDIT_DEBUG", raising=False)
    monkeypatch.setattr(targets, "cmd_targets", broken)
    code = main(["--debug", "targets"] if debug else ["targets"])
    err = capsys.readouterr().err
    first = f"privaudit: error: internal error: ZeroDivisionError: boom on two lines; {INTERNAL}"
    assert code == 1 and err.splitlines()[0] == first, err
    if debug:
        assert "Traceback (most recent call last)" in err and "in broken" in err
    else:
        assert len(err.splitlines()) == 1


# -- 3. signals during start-up ----------------------------------------------------------------
def handles_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a SIGTERM handler (``SigCgt`` in its /proc status; True
    where there is no /proc): main() sets one first thing. Before, the interpreter itself
    is starting, and a signal ends it as Python's defaults do — no code of ours has run."""
    try:
        with open(f"/proc/{pid}/status") as status:
            caught = next(line for line in status if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return True
    return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_two_signals_during_start_up_exit_2_with_one_line(sig, tmp_path):
    """Two quick Ctrl-Cs (or SIGTERMs) while torch and the engine load (0.3 s after the
    start, once main() runs): one ``privaudit: error:`` line and exit code 2 — not a
    traceback, nor a death by signal."""
    argv = ["train", "--defense", "nd", "--rounds", "50", "--agents", "3"]
    argv += ["--out", str(tmp_path / "run"), "--no-progress"]
    proc = subprocess.Popen(
        [*CLI, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(),
        preexec_fn=default_signals,
    )
    try:
        started = time.monotonic()
        while not handles_sigterm(proc.pid) and time.monotonic() < started + 60:
            time.sleep(0.01)
        time.sleep(max(0.0, started + 0.3 - time.monotonic()))
        proc.send_signal(sig)
        time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 2, err
    assert len(lines) == 1 and lines[0].startswith("privaudit: error: interrupted"), err


def test_signals_held_over_an_import_raise_after_it_and_lost_ones_come_back():
    """In process, with real signals: two held ones raise at the block's end (the third at
    once); one raised where Python drops exceptions (a weakref callback) comes back in the
    code after it; handlers and unraisablehook are restored."""
    hook = sys.unraisablehook
    # pytest started as a background job of a non-interactive shell inherits SIGINT ignored,
    # which the CLI keeps ignored by design: this test is about the handler, so it starts
    # from Python's default one, as a terminal would give it
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _signals_held(hook)
    finally:
        signal.signal(signal.SIGINT, inherited)


def _signals_held(hook: object) -> None:
    def send(interrupts: console.Interrupts, signum: int) -> None:
        """Send ``signum`` and wait until its handler ran: two signals pending at once would
        be delivered as one, on a busy machine as on any other."""
        before, deadline = interrupts.received, time.monotonic() + 10
        os.kill(os.getpid(), signum)
        while interrupts.received == before and time.monotonic() < deadline:
            time.sleep(0.001)
        assert interrupts.received == before + 1, "the signal never reached its handler"

    with console.interrupts_handled(program=False) as interrupts:
        with pytest.raises(KeyboardInterrupt), interrupts.held():
            send(interrupts, signal.SIGINT)
            send(interrupts, signal.SIGTERM)  # both arrived, neither raised
            held_through = True
        assert held_through
        with pytest.raises(KeyboardInterrupt), interrupts.held():
            for _ in range(3):
                send(interrupts, signal.SIGINT)
            pytest.fail("the third held signal did not raise at once")

        class Module:
            pass

        victim = Module()
        ref = weakref.ref(victim, lambda _: os.kill(os.getpid(), signal.SIGINT))
        with pytest.raises(KeyboardInterrupt):
            del victim  # the callback's KeyboardInterrupt is dropped there ...
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # ... and raised here (short sleeps: the
                time.sleep(0.01)  # main thread checks for handlers between them)
        assert ref() is None
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert sys.unraisablehook is hook


# -- 4. a home matplotlib cannot write ---------------------------------------------------------
def test_a_read_only_home_draws_figures_without_warnings(tmp_path):
    """HOME below a regular file (it cannot be created, even by root): the attack still
    draws its grid, with no matplotlib warning about its config or cache folder."""
    (tmp_path / "file").write_text("")
    env = environment(
        HOME=str(tmp_path / "file" / "home"),
        XDG_CONFIG_HOME=None,
        XDG_CACHE_HOME=None,
        MPLCONFIGDIR=None,
    )
    out = tmp_path / "out"
    argv = ["attack", "--target", "nd-cg", "--round", "1", "--rounds", "1", "--agents", "3"]
    done = cli(
        *argv, "--iterations", "2", "--no-lpips", "--no-progress", "--out", str(out), env=env
    )
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "matplotlib" not in err.lower(), err
    assert (out / "grid.png").read_bytes()[:4] == b"\x89PNG"


def test_matplotlib_dir_is_set_only_where_the_default_cannot_be_written(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "matplotlib", raising=False)  # as before it loads
    for name in ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(name, "")  # recorded, so whatever the test sets is undone after
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))  # writable: left to matplotlib, nothing made
    console.writable_matplotlib_dir()
    assert "MPLCONFIGDIR" not in os.environ and not list(tmp_path.iterdir())
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("HOME", str(tmp_path / "file" / "home"))
    console.writable_matplotlib_dir()
    assert os.path.isdir(os.environ["MPLCONFIGDIR"])
