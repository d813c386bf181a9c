"""An 8-cell ``privaudit compare`` on the local executor and on a local Ray cluster of two
one-CPU workers: the wall-clock ratio (the goal: at most 0.65×) and that both wrote the same
numbers.

The study: targets nd-cg and dpdl-cg × attacked rounds 1–4 (2 runs of 4 rounds on 4 agents,
8 cells of 2 victims, ``--iterations`` Inverting-Gradients steps each), with one torch thread
everywhere (the CLI's default). Three times are reported:

- ``local``: :func:`privaudit.api.sweeps.execute` in this process, one cell after the other;
- ``ray``: the same study on :class:`privaudit.api.executor.RayExecutor`, on a cluster that is
  already up and whose two workers have imported the engine (a cluster in use);
- ``ray_cold``: ``ray`` plus the cluster's start and the workers' first imports (torch), what a
  one-off ``privaudit compare --executor ray`` on a fresh machine pays.

Ray starts its workers at nice 15; here they run at ``--niceness`` (default 0, as the local
executor's process), so that on a machine whose cores other jobs share both compete alike.
Where other jobs share the cores, the wall times say more about them than about the
executors: the CPU seconds of the local process and of each Ray worker (from /proc) are
reported too, and the busiest worker's over the local process's estimates the wall ratio on
an idle machine.

Each executor writes into its own folder under ``--out`` (a fresh temporary folder by
default), so nothing is cached between them. On a machine whose cores other jobs share the
ratio is noisy: run it on an idle one.

    python benchmarks/executor.py                   # 300 iterations per cell
    python benchmarks/executor.py --iterations 100 --json executor.json
"""

from __future__ import annotations

import argparse
import json
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


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=300, help="IG steps per cell (300)")
    p.add_argument("--out", default=None, help="folder for both studies (default: a temporary)")
    p.add_argument("--json", default=None, help="also write the numbers to this file")
    p.add_argument(
        "--niceness",
        type=int,
        default=0,
        help="of the Ray workers (0, as this process; Ray's own default is 15)",
    )
    a = p.parse_args(argv)

    import ray
    import torch

    from privaudit.api.executor import RayExecutor
    from privaudit.api.sweeps import execute

    torch.set_num_threads(1)
    root = Path(a.out or tempfile.mkdtemp(prefix="privaudit-executor-"))
    sweep = study(a.iterations)

    t0, c0 = time.perf_counter(), time.process_time()
    local_rows = execute(sweep, root / "local", progress=False)
    local, local_cpu = time.perf_counter() - t0, time.process_time() - c0

    t0 = time.perf_counter()
    # Ray runs its workers at nice 15: on a machine whose cores other jobs share they would
    # get less CPU than the local executor's process (nice 0) and the ratio would measure that
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level="warning",
        _system_config={"worker_niceness": a.niceness},
    )
    warm = ray.remote(num_cpus=1)(_warm)
    pids = set(ray.get([warm.remote() for _ in range(2)]))
    start = time.perf_counter() - t0
    before = {pid: _cpu(pid) for pid in pids}
    t0 = time.perf_counter()
    ray_rows = execute(sweep, root / "ray", progress=False, executor=RayExecutor(threads=1))
    remote = time.perf_counter() - t0
    after = {pid: _cpu(pid) for pid in pids}
    ray.shutdown()
    # CPU workers are reused (max_calls unlimited): the two warmed ones ran every task
    spent = [after[p] - before[p] for p in pids if before[p] is not None and after[p] is not None]

    same = [(r["metrics"], r["per_image"]) for r in local_rows] == [
        (r["metrics"], r["per_image"]) for r in ray_rows
    ]
    doc = {
        "cells": len(local_rows),
        "iterations": a.iterations,
        "workers": 2,
        "worker_niceness": a.niceness,
        "warm_workers": len(pids),
        "local_s": round(local, 1),
        "ray_s": round(remote, 1),
        "ray_start_s": round(start, 1),
        "ray_cold_s": round(remote + start, 1),
        "ratio": round(remote / local, 3),
        "ratio_cold": round((remote + start) / local, 3),
        # CPU seconds: the local process's, and each Ray worker's during the study; on an
        # idle machine (a core per worker) the wall times approach these, so the last ratio
        # estimates what the wall ratio is there, whatever else shares the cores here
        "local_cpu_s": round(local_cpu, 1),
        "ray_worker_cpu_s": [round(x, 1) for x in spent],
        "ratio_cpu_estimate": round(max(spent) / local_cpu, 3) if spent else None,
        "goal": GOAL,
        "same_numbers": same,
        "out": str(root),
    }
    print(
        f"{doc['cells']} cells, {a.iterations} IG iterations each: local {local:.1f} s; "
        f"Ray, 2 one-CPU workers {remote:.1f} s ({doc['ratio']:.2f}×, goal ≤ {GOAL}×); "
        f"with the cluster's start {remote + start:.1f} s ({doc['ratio_cold']:.2f}×); "
        f"same numbers: {same}\nCPU seconds: local {local_cpu:.1f}, Ray workers "
        f"{', '.join(f'{x:.1f}' for x in spent)} (the busiest / local: "
        f"{doc['ratio_cpu_estimate']}×, the wall ratio on an idle machine)"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=2) + "\n")
    return doc


if __name__ == "__main__":
    sys.exit(0 if main()["same_numbers"] else 1)
