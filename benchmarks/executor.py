"""An 8-cell ``privaudit compare`` on the local executor and on a local Ray cluster of two
one-CPU workers, on an idle machine and under load: the wall-clock ratios (the goal: at most
0.65× idle) and that every run wrote the same numbers.

The study: targets nd-cg and dpdl-cg × attacked rounds 1–4 (2 runs of 4 rounds on 4 agents,
8 cells of 2 victims, ``--iterations`` Inverting-Gradients steps each), with one torch thread
everywhere (the CLI's default). The cluster is started as the CLI starts one
(:func:`privaudit.api.cluster.start_options`: its workers at the CLI's niceness, the same as
this process's), once, and its two workers import the engine before any timing (a cluster
in use). Then the study runs four times, each into its own folder under ``--out`` (nothing
is cached between them):

- **idle**: ``local`` (:func:`privaudit.api.sweeps.execute` in this process, one cell after
  the other), then ``ray`` (the same study on :class:`privaudit.api.executor.RayExecutor`);
  the ratio ray / local, and ``ratio_cold``: ray plus the cluster's start and the workers'
  first imports (torch), what a one-off ``privaudit compare --executor ray`` pays;
- **loaded**: the same two while ``--hogs`` processes (default 1) spin on the CPU at
  niceness 0, as another user's job would: the ratio ray / local under that load.

Both ratios compare runs of the same invocation, so the machine is the same for both sides.
The CPU seconds of the local process and of each Ray worker (from /proc) during the idle runs
are reported too: the busiest worker's over the local process's estimates the idle wall ratio
on a machine whose cores nothing else uses.

    python benchmarks/executor.py                   # 300 iterations per cell
    python benchmarks/executor.py --iterations 100 --json executor.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL = 0.65


def study(iterations: int):
    from privaudit.api.sweeps import Sweep
    from privaudit.core.config import RunConfig

    return Sweep(
        ["nd-cg", "dpdl-cg"],
        [1, 2, 3, 4],
        [1.0],
        [0],
        RunConfig(agents=4, batch_size=2),
        victims=2,
        iterations=iterations,
    )


def _warm() -> int:
    """A worker's first task: import the engine (and torch) as a cell would."""
    import os

    import privaudit.api.sweeps  # noqa: F401

    return os.getpid()


def _cpu(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used, from /proc (None elsewhere)."""
    import os

    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pair(sweep, root: Path, pids: set[int]) -> dict:
    """The study locally, then on Ray, into ``root/local`` and ``root/ray``: wall and CPU
    seconds, and each side's rows."""
    from privaudit.api.executor import RayExecutor
    from privaudit.api.sweeps import execute

    t0, c0 = time.perf_counter(), time.process_time()
    local_rows = execute(sweep, root / "local", progress=False)
    local, local_cpu = time.perf_counter() - t0, time.process_time() - c0
    before = {pid: _cpu(pid) for pid in pids}
    t0 = time.perf_counter()
    ray_rows = execute(sweep, root / "ray", progress=False, executor=RayExecutor(threads=1))
    remote = time.perf_counter() - t0
    after = {pid: _cpu(pid) for pid in pids}
    # CPU workers are reused (max_calls unlimited): the two warmed ones ran every task
    spent = [after[p] - before[p] for p in pids if before[p] is not None and after[p] is not None]
    return {
        "local_s": round(local, 1),
        "ray_s": round(remote, 1),
        "ratio": round(remote / local, 3),
        "local_cpu_s": round(local_cpu, 1),
        "ray_worker_cpu_s": [round(x, 1) for x in spent],
        "rows": [[(r["metrics"], r["per_image"]) for r in rows] for rows in (local_rows, ray_rows)],
    }


def _loaded(sweep, root: Path, pids: set[int], hogs: int) -> dict:
    """:func:`_pair` while ``hogs`` processes spin on the CPU (niceness 0, as this
    process and the Ray workers)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
    try:
        return _pair(sweep, root, pids)
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=300, help="IG steps per cell (300)")
    p.add_argument("--out", default=None, help="folder for the studies (default: a temporary)")
    p.add_argument("--json", default=None, help="also write the numbers to this file")
    p.add_argument(
        "--hogs", type=int, default=1, help="busy processes for the loaded runs (1; 0: skip)"
    )
    a = p.parse_args(argv)

    import ray
    import torch

    from privaudit.api import cluster

    torch.set_num_threads(1)
    root = Path(a.out or tempfile.mkdtemp(prefix="privaudit-executor-")).absolute()
    sweep = study(a.iterations)

    t0 = time.perf_counter()
    ray.init(
        num_cpus=2, include_dashboard=False, logging_level="warning", **cluster.start_options()
    )
    warm = ray.remote(num_cpus=1)(_warm)
    pids = set(ray.get([warm.remote() for _ in range(2)]))
    start = time.perf_counter() - t0
    try:
        idle = _pair(sweep, root / "idle", pids)
        loaded = _loaded(sweep, root / "loaded", pids, a.hogs) if a.hogs > 0 else None
    finally:
        ray.shutdown()
    rows = [*idle.pop("rows"), *(loaded.pop("rows") if loaded else [])]
    same = all(r == rows[0] for r in rows)
    spent = idle["ray_worker_cpu_s"]
    doc = {
        "cells": len(rows[0]),
        "iterations": a.iterations,
        "workers": 2,
        "worker_niceness": cluster.WORKER_NICENESS,
        "warm_workers": len(pids),
        "ray_start_s": round(start, 1),
        "idle": idle,
        "ratio_cold": round((idle["ray_s"] + start) / idle["local_s"], 3),
        "ratio_cpu_estimate": round(max(spent) / idle["local_cpu_s"], 3) if spent else None,
        "hogs": a.hogs,
        "loaded": loaded,
        "goal": GOAL,
        "same_numbers": same,
        "out": str(root),
    }
    print(
        f"{doc['cells']} cells, {a.iterations} IG iterations each, Ray: 2 one-CPU workers at "
        f"nice {cluster.WORKER_NICENESS}\nidle: local {idle['local_s']} s, Ray {idle['ray_s']} "
        f"s ({idle['ratio']:.2f}×, goal ≤ {GOAL}×); with the cluster's start "
        f"{doc['ratio_cold']:.2f}×; CPU seconds local {idle['local_cpu_s']}, Ray workers "
        f"{', '.join(map(str, spent))} (busiest / local: {doc['ratio_cpu_estimate']}×)"
    )
    if loaded:
        print(
            f"loaded ({a.hogs} busy process{'es' * (a.hogs != 1)}): local {loaded['local_s']} "
            f"s, Ray {loaded['ray_s']} s ({loaded['ratio']:.2f}×)"
        )
    print(f"same numbers: {same}")
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=2) + "\n")
    return doc


if __name__ == "__main__":
    sys.exit(0 if main()["same_numbers"] else 1)
