"""Progress where stderr is not a terminal: lines a log can show, no blank lines on stdout.

The issue: progress bars left blank lines on stdout when it was not a terminal (2 for attack,
8 for mia, 28 for compare), and a long job in a log said nothing for minutes."""

from __future__ import annotations

import io
import subprocess
import sys

from privaudit.core import text


def test_a_log_gets_a_line_every_period_and_a_last_one(monkeypatch):
    clock = iter(range(0, 10_000, 20))  # each call: 20 s later
    monkeypatch.setattr(text.time, "monotonic", lambda: float(next(clock)))
    stream = io.StringIO()
    bar = text.LogLines(10, "claims", 0, stream)
    with bar:
        for _ in range(10):
            bar.advance(0)
    lines = stream.getvalue().splitlines()
    # advances at 20, 40, … s: a line once 30 s have passed since the last, then the last one
    assert lines[0].startswith("claims: 2/10 done, 40 s elapsed, about 2.7 min left")
    assert lines[-1].startswith("claims: 10/10 done") and "left" not in lines[-1]
    assert 5 <= len(lines) <= 7 and all(ln.strip() for ln in lines)


def test_a_short_job_in_a_log_prints_nothing():
    stream = io.StringIO()
    with text.LogLines(3, "rounds", 0, stream) as bar:
        for _ in range(3):
            bar.advance(0)
    assert stream.getvalue() == ""


def test_train_piped_leaves_no_blank_line_on_stdout(tmp_path):
    cmd = [sys.executable, "-m", "privaudit.cli", "train", "--defense", "nd", "--rounds", "2"]
    cmd += ["--agents", "3", "--out", str(tmp_path / "run")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "" not in p.stdout.splitlines() and "test accuracy" in p.stdout
