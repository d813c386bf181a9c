"""Peak memory and seconds per round of DPDL training as the number of agents grows.

Each configuration runs ``privaudit train --defense dpdl --model resnet18 --dataset photos
--topology ring --batch-size 32 --rounds 1`` (flags below) in a fresh process and reports:

- the peak resident memory of that process, and ("added") that peak less the round's state, x
  and v (2 rows of D floats per agent; x̃, ṽ and the next x, v are written into them): what
  must stay flat in the number of agents at a fixed ``--max-memory``; the peak is from
  ``os.wait4``'s ``ru_maxrss`` (this parent imports no torch, so the forked child starts
  small; a watchdog polls the child's RSS and ends it above ``--max-rss``, reported as
  "killed"), and with ``--device cuda`` the peak CUDA memory PyTorch allocated;
- the seconds of each round (``RoundLoop.step`` timed inside the child), of its gradient calls
  (``PairGrads.clipped_mean``/``mean``) and of the whole process (imports, data, model,
  checkpoint included), and the process's CPU seconds (user + system, ``os.wait4``: on a shared
  machine a steadier measure than the wall clock).

``--paths`` picks the per-example gradient engine (:mod:`privaudit.grads.pairs`): ``auto`` (ghost
clipping for ResNet-18, :mod:`privaudit.grads.ghost`) and ``old``, the materialising path this
replaced (``PRIVAUDIT_GRADS=pairnet`` — ``vmap`` for ResNet-18 — with no memory budget: every
pair's per-example gradients at once). ``old`` needs about 3 × pairs × B × D × 4 bytes (69 GB per
48 pairs at B = 32), so it is run only up to ``--old-max-agents`` agents and when that estimate
is under ``--max-rss``; otherwise the table says why it was skipped.

``--engine`` measures the gradient engine alone instead of a training run: one call of
``PairGrads.clipped_mean`` on the 3N pairs of an N-agent ring (random batches of B), reporting
the peak, the memory before the call and what the call added beyond its (P, D) output — the part
that must not grow with N (on CUDA: of the CUDA memory).

    python benchmarks/scale.py                       # agents 4 16, auto and old where it fits
    python benchmarks/scale.py --agents 4 16 64 --device cuda --max-rss 100
    python benchmarks/scale.py --engine --agents 4 16

Each configuration's measurement is saved in ``--out`` (default
``privaudit-out/benchmarks/scale``, its run folder beside it) as it finishes; a rerun into the
same folder prints those and measures the rest (``benchmarks/resume.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from resume import Pieces, add_out  # noqa: E402 - a sibling script, not a package

from privaudit.core.files import dumps_strict  # noqa: E402 - loads neither torch nor numpy

GB = 2.0**30
RESNET18_PARAMS = 11_173_962  # CIFAR ResNet-18, 10 classes

CHILD_TRAIN = """
import json, sys, time, torch
from privaudit.cli import main
from privaudit.grads import PairGrads
from privaudit.sim import loop

rounds = []
step = loop.RoundLoop.step


def timed(self, *args, **kwargs):
    start = time.perf_counter()
    try:
        return step(self, *args, **kwargs)
    finally:
        rounds.append(time.perf_counter() - start)


loop.RoundLoop.step = timed
spent = [0.0]


def timing(fn):
    def wrapped(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    return wrapped


PairGrads.clipped_mean = timing(PairGrads.clipped_mean)
PairGrads.mean = timing(PairGrads.mean)
code = main(sys.argv[2:])
cuda = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
with open(sys.argv[1], "w") as f:
    json.dump({"code": code, "rounds": rounds, "grads": spent[0], "cuda_peak": cuda}, f)
"""

CHILD_ENGINE = """
import json, sys, time, torch
from privaudit.core.params import ParamSpec, flat_params
from privaudit.grads import PairGrads
from privaudit.scenario.models import build_model

out_file, agents, batch, threads, device = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
torch.set_num_threads(threads)
torch.manual_seed(0)


def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))


model = build_model("resnet18", (3, 32, 32), 10).to(device)
spec = ParamSpec.of(model)
pairs = 3 * agents  # a ring: a self pair and two out-edge pairs per agent
owner = torch.cat([torch.arange(agents), torch.arange(agents).repeat_interleave(2)]).to(device)
flat = flat_params(model).expand(pairs, -1)  # one model for all pairs: no P x D input
x = torch.randn(agents, batch, 3, 32, 32, device=device)
y = torch.randint(0, 10, (agents, batch), device=device)
grads = PairGrads(model, spec, batch_size=batch)
grads.clipped_mean(flat[:1], x[:1, :2], y[:1, :2], 1.0)  # imports, probes, first-call setup
before = rss()
if device == "cuda":
    torch.cuda.reset_peak_memory_stats()
before_cuda = torch.cuda.memory_allocated() if device == "cuda" else 0
start = time.perf_counter()
g = grads.clipped_mean(flat, x, y, 1.0, owner)
seconds = time.perf_counter() - start
cuda = torch.cuda.max_memory_allocated() if device == "cuda" else 0
with open(out_file, "w") as f:
    json.dump({"code": 0, "rounds": [seconds], "before": before, "output": g.numel() * 4,
               "cuda_peak": cuda, "before_cuda": before_cuda, "device": device,
               "path": "ghost" if grads.uses_ghost(x) else "other"}, f)
"""


def train_args(agents: int, batch: int, rounds: int, threads: int, device: str, out: str) -> list:
    """The ``privaudit train`` arguments of one configuration (ResNet-18 DPDL, photos, ring)."""
    return [
        *("train", "--defense", "dpdl", "--model", "resnet18", "--dataset", "photos"),
        *("--topology", "ring", "--batch-size", str(batch), "--rounds", str(rounds)),
        *("--agents", str(agents), "--threads", str(threads), "--device", device),
        *("--no-progress", "--out", out),
    ]


def state_bytes(agents: int) -> int:
    """A DPDL round's state: x and v, 2 ResNet-18 rows of float32 per agent (the simulator
    writes x̃ and ṽ, and then the next x and v, into them)."""
    return 2 * agents * RESNET18_PARAMS * 4


def watch(pid: int, limit: float, killed: list[bool], done: threading.Event) -> None:
    """Poll the child's VmRSS every 0.2 s; SIGKILL it above ``limit`` bytes."""
    while not done.wait(0.2):
        try:
            with open(f"/proc/{pid}/status") as f:
                rss = next((int(x.split()[1]) * 1024 for x in f if x.startswith("VmRSS:")), 0)
        except OSError:
            return
        if rss > limit:
            killed.append(True)
            os.kill(pid, 9)
            return


def last_line(text: str) -> str:
    return (text.strip().splitlines() or ["?"])[-1][:160]


def run_child(code: str, args: list[str], env: dict[str, str], limit: float, timeout: float):
    """Run ``python -c code out_file *args``; returns (result dict or None, peak RSS bytes,
    wall seconds, CPU seconds (user + system), status text)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(out), *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        killed: list[bool] = []
        done = threading.Event()
        guard = threading.Thread(target=watch, args=(proc.pid, limit, killed, done), daemon=True)
        guard.start()
        timer = threading.Timer(timeout, lambda: proc.kill())
        timer.start()
        stderr = proc.stderr.read() if proc.stderr else ""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        timer.cancel()
        wall = time.perf_counter() - start
        peak = usage.ru_maxrss * 1024  # kilobytes on Linux
        cpu = usage.ru_utime + usage.ru_stime
        if killed:
            return None, peak, wall, cpu, f"killed > {limit / GB:.3g} GB"
        if proc.returncode != 0 or not out.exists():
            last = last_line(stderr)
            if wall >= timeout:
                last = f"timed out after {timeout:.0f} s"
            return None, peak, wall, cpu, f"failed: {last}"
        result = json.loads(out.read_text())
        if result["code"] != 0:  # the CLI refused: its one-line error is the last of stderr
            return None, peak, wall, cpu, f"exit {result['code']}: {last_line(stderr)}"
        return result, peak, wall, cpu, "ok"


def measure(n: int, path: str, a: argparse.Namespace, work: Path) -> dict:
    """One configuration in a fresh child process (its run folder in ``work``): the child's
    result (None when it failed), peak RSS, wall and CPU seconds, status."""
    env = {**os.environ, "PRIVAUDIT_GRADS": "auto"}
    if a.max_memory:
        env["PRIVAUDIT_MAX_MEMORY"] = a.max_memory
    if path == "old":
        env.update(PRIVAUDIT_GRADS="pairnet", PRIVAUDIT_MAX_MEMORY="1T")
    if a.engine:
        code = CHILD_ENGINE
        args = [str(n), str(a.batch_size), str(a.threads), a.device]
    else:
        code = CHILD_TRAIN
        args = train_args(n, a.batch_size, a.rounds, a.threads, a.device, str(work / "run"))
        if a.dirichlet_alpha:
            args += ["--dirichlet-alpha", a.dirichlet_alpha]
    result, peak, wall, cpu, status = run_child(code, args, env, a.max_rss * GB, a.timeout)
    return {"result": result, "peak": peak, "wall": wall, "cpu": cpu, "status": status}


def skipped(n: int, path: str, a: argparse.Namespace) -> str | None:
    """Why the configuration is not run (None: it is): the old path beyond its agents or
    beyond --max-rss."""
    if path != "old":
        return None
    need = 3 * 3 * n * a.batch_size * RESNET18_PARAMS * 4
    if n > a.old_max_agents or (a.device == "cpu" and need > a.max_rss * GB):
        return f"skipped: needs ≈ {need / GB:.0f} GB" if need > a.max_rss * GB else "skipped"
    return None


def show(n: int, path: str, m: dict) -> dict:
    """Print the table line of a measured configuration ``m`` (:func:`measure`); its row."""
    result, peak, wall, cpu = m["result"], m["peak"], m["wall"], m["cpu"]
    pairs = 3 * n
    row = {"agents": n, "pairs": pairs, "path": path, "peak_rss": peak, "wall": wall}
    row["cpu"] = cpu
    row["status"] = m["status"]
    added = cuda = per_round = grad_s = ""
    if result is not None:
        row.update(result)
        per_round = f"{sum(result['rounds']) / max(len(result['rounds']), 1):8.1f}"
        grad_s = f"{result.get('grads', sum(result['rounds'])):7.1f}"
        if "before" not in result:  # train: beyond x and v (2 rows per agent)
            extra = peak - state_bytes(n)
        elif result["device"] == "cuda":  # engine: what the call added beyond its output
            extra = result["cuda_peak"] - result["before_cuda"] - result["output"]
        else:
            extra = peak - result["before"] - result["output"]
        row["added"] = extra
        added = f"{extra / GB:8.2f}"
        if result["cuda_peak"]:
            cuda = f"{result['cuda_peak'] / GB:7.2f}"
    print(
        f"{n:>6} {pairs:>5} {path:>5} {peak / GB:>11.2f} {added:>8} {cuda:>7} "
        f"{per_round:>8} {grad_s:>7} {wall:>7.1f} {cpu:>7.1f}  {m['status']}",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--paths", nargs="+", default=["auto", "old"], choices=["auto", "old"])
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--max-memory", default=None, help="PRIVAUDIT_MAX_MEMORY for the children")
    ap.add_argument(
        "--dirichlet-alpha",
        default=None,
        help="label skew of the split (many agents on photos need a large one, e.g. 1000)",
    )
    ap.add_argument("--max-rss", type=float, default=6.0, help="GB; a child above is killed")
    ap.add_argument("--old-max-agents", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per configuration")
    ap.add_argument("--engine", action="store_true", help="the gradient engine alone")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    add_out(ap, "scale")
    a = ap.parse_args(argv)
    todo = [(n, path) for n in a.agents for path in a.paths]

    def identity(n: int, path: str) -> dict:
        keys = ("batch_size", "rounds", "threads", "device", "max_memory", "dirichlet_alpha")
        keys += ("max_rss", "timeout", "engine")
        return dict(bench="scale", agents=n, path=path, **{k: getattr(a, k) for k in keys})

    measured = [t for t in todo if skipped(*t, a) is None]
    pieces = Pieces(a.out, [identity(*t) for t in measured], [__file__])
    rows = []
    print(
        f"{'agents':>6} {'pairs':>5} {'path':>5} {'peak RSS GB':>11} {'added GB':>8} "
        f"{'CUDA GB':>7} {'s/round':>8} {'grads s':>7} {'wall s':>7} {'CPU s':>7}  status",
        flush=True,
    )
    for n, path in todo:
        why = skipped(n, path, a)
        if why is not None:
            print(f"{n:>6} {3 * n:>5} {path:>5} {'':>11} {'':>8} {'':>7} {'':>8} "
                  f"{'':>7} {'':>7} {'':>7}  {why}", flush=True)  # fmt: skip
            rows.append({"agents": n, "path": path, "status": why})
            continue
        # each configuration in a fresh process on a fresh run folder (a killed one's removed)
        m = pieces.run(identity(n, path), lambda work, n=n, p=path: measure(n, p, a, work))
        rows.append(show(n, path, m))
    if a.json:
        a.json.write_text(dumps_strict(rows, indent=1, sort_keys=False))


if __name__ == "__main__":
    main()
