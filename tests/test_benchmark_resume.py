"""A benchmark killed by a timeout loses only the piece it was in: each finished piece is
saved in its ``--out`` folder, and a rerun into the same folder reads it back instead of
computing it again and prints the same table (``benchmarks/resume.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from audit import main  # noqa: E402 - benchmarks/audit.py, the quickest that resumes

pytestmark = pytest.mark.usefixtures("one_thread")


def files(folder: Path) -> dict[Path, tuple[int, bytes]]:
    """Every file under ``folder``: when it was last written and what it holds."""
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.rglob("*") if p.is_file()}


def test_audit_benchmark_reruns_from_its_folder(tmp_path, capsys):
    out = tmp_path / "out"
    three = ["--targets", "dp-dpsgd-half-model,clipd2p-half-model,dpdl-cg"]
    argv = ["--trials", "64", "--epsilons", "4", *three, "--out", str(out)]
    main(argv)
    first, err = capsys.readouterr()
    assert "resuming" not in err
    done = sorted((out / "done").glob("*.json"))
    assert len(done) == 3  # one per kind
    before = files(out)

    main(argv)  # everything is there: nothing is computed or written again
    second, err = capsys.readouterr()
    assert f"resuming from {out}: 3 of 3 done" in err
    assert second == first
    assert files(out) == before

    done[0].unlink()  # as if killed during that piece: only it is computed again
    main(argv)
    third, err = capsys.readouterr()
    assert f"resuming from {out}: 2 of 3 done" in err
    assert all(files(out)[p] == before[p] for p in done[1:])
    assert done[0].is_file()
    # the rows read back are the lines printed the first time; the recomputed one (a seeded
    # audit) differs at most in its wall time, the last column
    changed = [
        (a, b) for a, b in zip(first.splitlines(), third.splitlines(), strict=True) if a != b
    ]
    assert len(changed) <= 1
    assert all(a.rsplit(None, 1)[0] == b.rsplit(None, 1)[0] for a, b in changed)

    # other arguments are other pieces: nothing of the first run is read for them
    main(["--trials", "96", "--epsilons", "4", *three, "--out", str(out)])
    _, err = capsys.readouterr()
    assert "resuming" not in err
    assert len(list((out / "done").glob("*.json"))) == 6
