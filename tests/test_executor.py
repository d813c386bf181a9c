"""Executors (:mod:`privaudit.api.executor`): the cache under concurrent and killed writers,
``--executor ray`` refused in one line without Ray, and a small ``privaudit compare`` on a
real local Ray cluster (two one-CPU workers) whose results equal the local executor's bit
for bit, although one worker is killed halfway through writing a cell."""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from privaudit.api.executor import RAY_MISSING, LocalExecutor, Task, commit_folder
from privaudit.cli import main

ARGS = ["compare", "--targets", "nd-cg,dpdl-cg", "--rounds", "1,2", "--epsilons", "1"]
ARGS += ["--agents", "3", "--victims", "2", "--batch-size", "2", "--iterations", "2"]
ARGS += ["--no-progress"]


# -- the cache ------------------------------------------------------------------------------
def _racer(final: str, barrier, results) -> None:
    """Write an entry of ``final`` that names this process, meeting the other writer
    before the rename: both finish writing first, then race to commit."""

    def write(tmp: Path) -> None:
        (tmp / "data.bin").write_bytes(os.urandom(1 << 16))
        (tmp / "result.json").write_text(json.dumps({"pid": os.getpid()}))
        barrier.wait(timeout=30)

    results.put(commit_folder(Path(final), write, "result.json"))


def _killed(final: str) -> None:
    """A writer killed halfway through its entry (one file written, not the marker)."""

    def write(tmp: Path) -> None:
        (tmp / "data.bin").write_bytes(b"half")
        os.kill(os.getpid(), signal.SIGKILL)

    commit_folder(Path(final), write, "result.json")


def test_racing_writers_leave_one_complete_entry_and_a_killed_one_none(tmp_path):
    ctx = multiprocessing.get_context("fork")
    final = tmp_path / "results" / "cell"
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(str(final), barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert sorted(results.get(timeout=5) for _ in procs) == [False, True]  # one committed
    assert sorted(p.name for p in final.iterdir()) == ["data.bin", "result.json"]
    assert os.listdir(final.parent) == ["cell"]  # no temporary folder left

    # a writer killed mid-entry: no entry, only its hidden folder, which the next writer
    # of that entry removes before it commits its own
    again = tmp_path / "results" / "other"
    p = ctx.Process(target=_killed, args=(str(again),))
    p.start()
    p.join(30)
    assert p.exitcode == -signal.SIGKILL and not again.exists()
    left = [n for n in os.listdir(again.parent) if n.startswith(".other.")]
    assert len(left) == 1 and left[0].endswith(".tmp")
    assert commit_folder(again, lambda tmp: (tmp / "result.json").write_text("{}"), "result.json")
    assert sorted(os.listdir(again.parent)) == ["cell", "other"]


def test_local_executor_runs_in_order_and_passes_results_on():
    seen: list[str] = []
    tasks = [
        Task("run", lambda: 10, cell=False),
        Task("a", lambda x, r: x + r, (1,), depends=("run",)),
        Task("b", lambda x, r: x * r, (2,), depends=("run",)),
    ]
    got = list(LocalExecutor().run(tasks, on_start=lambda t: seen.append(t.key)))
    assert [(t.key, r) for t, r in got] == [("run", 10), ("a", 11), ("b", 20)]
    assert seen == ["run", "a", "b"]
    with pytest.raises(ValueError, match="do not come before it"):
        list(LocalExecutor().run(tasks[1:]))


# -- the command line -------------------------------------------------------------------------
def test_executor_ray_without_ray_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    assert main([*ARGS, "--out", str(tmp_path / "o"), "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert err == f"privaudit: error: {RAY_MISSING}\n"
    assert not (tmp_path / "o").exists()
    assert main([*ARGS, "--out", str(tmp_path / "o"), "--ray-address", "auto"]) == 2
    assert "--ray-address does nothing with --executor local" in capsys.readouterr().err


# -- a real Ray cluster -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local Ray cluster of two one-CPU workers. Each worker's process, as it starts,
    wraps the cache's tensor writer so that the first cell written anywhere kills its own
    worker (SIGKILL) right after its tensors and before its result: a worker lost halfway
    through an entry. The marker file says it happened. The hook imports the engine, so the
    workers load torch while the local run of the test goes on."""
    import ray

    marker = str(tmp_path_factory.mktemp("kill") / "killed")

    def kill_once() -> None:
        import os
        import signal

        import privaudit.api.sweeps as sweeps

        real = sweeps.save_file

        def save_then_die(tensors, path):
            real(tensors, path)
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)

        sweeps.save_file = save_then_die

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=80 * 1024**2,
        runtime_env={"worker_process_setup_hook": kill_once},
        logging_level="warning",
    )
    yield Path(marker)
    ray.shutdown()


def _entries(out: Path) -> dict[str, dict[str, bytes]]:
    """Every cache entry's files, by ``target/name``, with the output folder's own path
    (which ``result.json`` records) taken out, and its manifest (``entry.json``, which
    records the SHA-256 of that ``result.json``) checked present and left out."""
    got = {}
    for d in sorted((out / "results").glob("*/*")):
        files = {p.name: p.read_bytes() for p in d.iterdir()}
        assert json.loads(files.pop("entry.json"))["files"].keys() == files.keys()
        files["result.json"] = files["result.json"].replace(str(out).encode(), b"OUT")
        got[f"{d.parent.name}/{d.name}"] = files
    return got


def _table(out: Path, name: str) -> list[dict[str, str]]:
    return [
        {k: v.replace(str(out), "OUT") for k, v in row.items()}
        for row in csv.DictReader((out / name).open())
    ]


def test_compare_on_ray_equals_local_although_a_worker_is_killed(cluster, tmp_path, capsys):
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert main([*ARGS, "--out", str(local)]) == 0
    local_stdout = capsys.readouterr().out
    t0 = time.perf_counter()
    assert main([*ARGS, "--out", str(remote), "--executor", "ray"]) == 0
    wall = time.perf_counter() - t0
    ray_stdout = capsys.readouterr().out
    assert cluster.exists(), "no worker was killed: the retry went untested"

    # the command completed, every cell once, bit for bit what the local executor wrote
    entries = _entries(remote)
    assert len(entries) == 4 and entries == _entries(local)
    assert all(sorted(f) == ["recon.safetensors", "result.json"] for f in entries.values())
    for name in ("cells.csv", "summary.csv", "images.csv"):
        assert _table(remote, name) == _table(local, name), name
    # the printed tables too (Ray's own "(raylet)" notes of the killed worker aside); the last
    # line names the folder and the time
    shown = [ln for ln in ray_stdout.splitlines()[:-1] if "(raylet)" not in ln]
    assert shown == local_stdout.splitlines()[:-1]
    leftovers = [p for p in remote.rglob("*") if p.name.endswith(".tmp") or ".tmp" in p.name]
    assert leftovers == []  # the killed worker's half entry is gone
    assert len([p for p in (remote / "runs").iterdir() if p.is_dir()]) == 2  # trained once each

    # cached cells are never run again: the same command reads them, writes nothing new
    before = {p: p.stat().st_mtime_ns for p in (remote / "results").rglob("*")}
    assert main([*ARGS, "--out", str(remote), "--executor", "ray"]) == 0
    assert {p: p.stat().st_mtime_ns for p in (remote / "results").rglob("*")} == before
    capsys.readouterr()
    print(f"ray compare: {wall:.1f} s")


def test_ray_reports_a_failed_task_and_its_dependents_while_the_others_finish(cluster):
    from privaudit.api.executor import RayExecutor, TaskFailed
    from privaudit.core.errors import PrivauditError

    def broken() -> None:
        raise PrivauditError("no such thing; fix it like this")

    tasks = [
        Task("bad run", broken, cell=False, label="run A"),
        Task("a1", lambda r: r, depends=("bad run",), label="cell a1"),
        Task("good run", lambda: 3, cell=False, label="run B"),
        Task("b1", lambda x, r: x + r, (1,), depends=("good run",), label="cell b1"),
    ]
    got = {t.key: r for t, r in RayExecutor(threads=1).run(tasks, progress=False)}
    assert got["good run"] == 3 and got["b1"] == 4
    assert isinstance(got["bad run"], TaskFailed) and isinstance(got["a1"], TaskFailed)
    assert got["bad run"].line() == "failed: run A: no such thing; fix it like this"
    assert got["a1"].line() == "failed: cell a1: not run: run A: no such thing; fix it like this"


def test_claims_on_ray_equals_local(cluster, tmp_path, capsys):
    """``privaudit claims --executor ray``: each row not cached is a task; the ledger is the
    local one byte for byte (its trials are fixed, never timed), and a rerun reads every row
    from OUT/rows."""
    args = ["claims", "--target", "dp-dpsgd-half-model,dpdl-cg", "--agents", "3", "--sigma", "1"]
    args += ["--trials", "200", "--no-progress", "--json"]

    def ledger(out: Path, *extra: str) -> tuple[str, str]:
        assert main([*args, "--out", str(out), *extra]) == 0
        std = capsys.readouterr()
        return std.out, std.err  # the ledger; the summary (rows read back) on stderr

    local, _ = ledger(tmp_path / "local")
    remote, _ = ledger(tmp_path / "ray", "--executor", "ray")
    assert remote == local and len(json.loads(remote)["rows"]) == 2
    files = [(tmp_path / d / "ledger.json").read_bytes() for d in ("local", "ray")]
    assert files[0] == files[1]
    again, err = ledger(tmp_path / "ray", "--executor", "ray")
    assert again == local and f"(2 from {tmp_path / 'ray'}/rows)" in err
