"""Every speed ratio of issue #7 in one command, each with its target and PASS/FAIL.

    python benchmarks/run.py [--device cpu|cuda] [--json [PATH]] [--quick] [--threads T]
                             [--only simulation,throughput,breaching,end_to_end,memory,scale]
                             [--out DIR]

Each section's rows are saved in ``--out`` (default ``privaudit-out/benchmarks/run``) as it
finishes; a rerun into the same folder prints the sections already there and measures the
rest, each on a fresh working folder (``benchmarks/resume.py``).

All ratios are measured in this run against a baseline measured in the same run, the two
sides interleaved where it matters (the machines are shared and noisy; absolute times do not
transfer). Torch threads are ``--threads`` (default: torch's default, one per core — as a
user runs both engines) for both sides of every comparison, except that each baseline (the
naive loop, the one-at-a-time attacks) alternates between that and one thread and keeps its
faster time, so a baseline that threads only slow down is not held against it. The breaching
comparison runs one thread in both processes unless ``--threads`` is given (see
``vs_breaching.py``); the end-to-end command runs as a user would run it.

- simulation: rounds/s of the vectorized simulator (``Run.train``, DPDL, LeNet, photos, noise
  on: σ from ε = 1) vs ``benchmarks/naive_dpdl.py``, the same equations as a per-agent,
  per-neighbour, per-example Python loop, at 10 and 32 agents (ring). Before timing, the two
  engines are fed the same batches (the simulator's recorded secrets) with clipping on and
  σ = 0 and every message of every link and round is compared; with noise on, the residual of
  each cross-gradient against the naive clean value must have std σC/B.
- throughput: 16 observations (16 photos, LeNet, B = 1, true gradients) reconstructed by IG
  as one batched optimisation vs one call per observation; equal iterations, wall time
  including each call's set-up (min over two interleaved rounds), PSNR of both.
- breaching: ``benchmarks/vs_breaching.py`` (IG and DLG vs breaching 0.1.2 on the same model,
  image, gradient and start point; one observation per run, 1 thread each); the DLG ratio is
  per evaluation of the gradient-matching objective (one forward + second-order backward),
  because the two L-BFGS configurations take different numbers of evaluations per step.
  Needs ``bash benchmarks/setup_breaching.sh`` once; skipped (FAIL) without it.
- end_to_end: the README's main command, ``privaudit attack --target dpdl-cg --round 200``,
  in a fresh directory: wall time and peak RSS.
- memory: peak RSS of a DPDL run capturing every round on one link, at 50 and 200 rounds
  (separate processes): growth must not exceed the size of the extra captured messages.
- scale: one round of ResNet-18 (GroupNorm) DPDL on 3×32×32 photos, ring, B = 32, at 4 and 16
  agents (quick: B = 8, 4 and 8 agents) with ``--max-memory 512M``, each in a fresh process
  (``benchmarks/scale.py``, which has more options): peak RSS (16 agents ≤ 4 GB), the peak
  less the round's state of 2 rows per agent (flat within 10 % from the smallest to the
  largest), seconds per round (16 agents ≤ 60 s), and with ``--device cuda`` peak CUDA memory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from resume import Pieces, add_out  # noqa: E402 - a sibling script, not a package

from privaudit.core.files import dumps_strict  # noqa: E402

SECTIONS = ("simulation", "throughput", "breaching", "end_to_end", "memory", "scale")
SCALE_BUDGET = "512M"  # --max-memory of the scale section
SCALE_PEAK_GB, SCALE_ROUND_S = 4.0, 60.0  # issue 34's targets at 16 agents
E2E_TARGET_S = 90.0  # "about a minute" on a shared 2-core CPU, with 50 % slack for load
E2E_TIMEOUT_S = 300.0  # the end-to-end command is killed (and fails) after this

# Runs a command (killed after argv[2] seconds), then writes its wall time, whether it timed
# out, and the peak RSS of its process tree as JSON to argv[1].
_RSS_WRAPPER = (
    "import json, resource, subprocess, sys, time\n"
    "t, rc = time.perf_counter(), None\n"
    "try:\n"
    "    rc = subprocess.run(sys.argv[3:], timeout=float(sys.argv[2]),\n"
    "                        stdout=subprocess.DEVNULL).returncode\n"
    "except subprocess.TimeoutExpired:\n"
    "    pass\n"
    "kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "json.dump({'rc': rc, 'wall': time.perf_counter() - t, 'maxrss_kb': kb},"
    " open(sys.argv[1], 'w'))"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="also write all results as JSON to PATH (stdout if no PATH)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke mode: few rounds/iterations, minutes not tens of minutes; the "
        "ratios are noisier and some targets are not judged",
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's, one per core)"
    )
    p.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}"
    )
    add_out(p, "run")
    return p.parse_args(argv)


# --------------------------------------------------------------------------- helpers


class Results:
    """Rows of (section, metric, value, target, verdict) and their details."""

    def __init__(self):
        self.rows: list[dict] = []

    def add(
        self,
        section: str,
        metric: str,
        value: float,
        target: str | None = None,
        ok: bool | None = None,
        unit: str = "",
        **detail,
    ) -> None:
        verdict = "info" if ok is None else ("PASS" if ok else "FAIL")
        row = dict(section=section, metric=metric, value=value, unit=unit, target=target,
                   verdict=verdict, detail=detail)  # fmt: skip
        self.replay([row])

    def replay(self, rows: list[dict]) -> None:
        """Take ``rows`` (measured now, or a section's saved rows read back) and print each."""
        for r in rows:
            self.rows.append(r)
            value, unit = r["value"], r["unit"]
            shown = f"{value:.4g}{unit}" if isinstance(value, float) else f"{value}{unit}"
            print(f"  {r['metric']:<58} {shown:>12}  {r['target'] or '':<12} {r['verdict']}",
                  flush=True)  # fmt: skip


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str) -> float:
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def baseline_threads(args: argparse.Namespace, rep: int) -> int:
    """Torch threads for a baseline's ``rep``-th timing: ``--threads`` first, then one."""
    return args.threads if rep % 2 == 0 else 1


def peak_rss(cmd: list[str], cwd: str | Path, timeout: float = 1e9) -> dict:
    """Run ``cmd`` in its own process tree; its wall time, peak RSS (MB), and whether it was
    killed at ``timeout`` seconds."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    try:
        wrap = [sys.executable, "-c", _RSS_WRAPPER, out, str(timeout)]
        subprocess.run([*wrap, *cmd], cwd=cwd, check=True)
        r = json.loads(Path(out).read_text())
    finally:
        Path(out).unlink(missing_ok=True)
    if r["rc"] not in (0, None):
        raise RuntimeError(f"{' '.join(cmd)} exited {r['rc']}")
    return {"wall_s": r["wall"], "peak_rss_mb": r["maxrss_kb"] / 1024, "timed_out": r["rc"] is None}


def machine(args: argparse.Namespace) -> dict:
    import torch

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = dict(
        cpu=cpu,
        cores=os.cpu_count(),
        torch=torch.__version__,
        python=platform.python_version(),
        threads=args.threads,
        device=args.device,
        load_average_1min=os.getloadavg()[0],
    )
    if args.device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


# --------------------------------------------------------------------------- simulation


def simulation(res: Results, args: argparse.Namespace, tmp: Path) -> None:
    from naive_dpdl import compare_clean, noise_residual

    dev = args.device
    agree_rounds = 2 if args.quick else 3
    for n in (10, 32):
        c = compare_clean(tmp / f"agree{n}", n, agree_rounds, dev)
        res.add(
            "simulation",
            f"{n} agents: messages agree, σ=0 (max rel. err, {c['messages']} msgs)",
            c["max_rel_err"],
            "<= 1e-4",
            c["max_rel_err"] <= 1e-4,
        )
    z = noise_residual(tmp / "noise", 10, agree_rounds, dev)
    res.add(
        "simulation",
        f"10 agents: cg noise std / (σC/B), σ={z['sigma']:.3g}, {z['values']} values",
        z["std_ratio"],
        "in [0.98, 1.02]",
        abs(z["std_ratio"] - 1) <= 0.02,
        mean=z["mean"],
    )

    targets = {10: 5.0, 32: 10.0}
    for n, target in targets.items():
        sim_s, naive_s, sigma = time_engines(n, args, tmp)
        res.add(
            "simulation",
            f"{n} agents: rounds/s simulator / naive loop "
            f"({1 / sim_s:.2f} vs {1 / naive_s:.2f} rounds/s)",
            naive_s / sim_s,
            f">= {target:g}",
            naive_s / sim_s >= target,
            unit="x",
            sim_s_per_round=sim_s,
            naive_s_per_round=naive_s,
            sigma=sigma,
        )


def time_engines(n: int, args: argparse.Namespace, tmp: Path) -> tuple[float, float, float]:
    """Seconds per round of the simulator (fresh runs of ``Run.train``) and of the naive loop
    (its own seeded batches and noise), noise on, alternating; min over 5 repeats (the naive
    loop's alternating between ``--threads`` and one thread)."""
    import torch
    from naive_dpdl import naive_for

    from privaudit.core import sampling
    from privaudit.core.config import RunConfig
    from privaudit.sim.run import Run

    dev = args.device
    sim_rounds, naive_rounds = (5, 1) if args.quick else (20, 3)
    warm = Run.create(RunConfig(defense="dpdl", agents=n, rounds=2, device=dev), tmp / f"w{n}")
    warm.train(progress=False)  # first-call costs (vmap, kernels) out of the timing
    gen = torch.Generator().manual_seed(0)
    ctx, b = warm.ctx, warm.cfg.batch_size
    naive = naive_for(warm, noise=lambda j, i, d: torch.randn(d, generator=gen).to(ctx.device))

    def sample() -> list:  # the simulator's Poisson batches, from the naive loop's generator
        out = []
        for part in ctx.parts:
            pick = sampling.poisson(part, sampling.rate(b, len(part)), gen)
            out.append((ctx.train_x[pick], ctx.train_y[pick]))
        return out

    naive.round(sample())
    sims, naives = [], []
    for rep in range(1 if args.quick else 5):
        cfg = RunConfig(
            defense="dpdl", agents=n, rounds=sim_rounds, device=dev, checkpoint_every=sim_rounds
        )
        run = Run.create(cfg, tmp / f"sim{n}-{rep}")
        sims.append(timed(lambda run=run: run.train(progress=False), dev) / sim_rounds)
        batches = [sample() for _ in range(naive_rounds)]
        torch.set_num_threads(baseline_threads(args, rep))
        naives.append(timed(lambda bs=batches: [naive.round(x) for x in bs], dev) / naive_rounds)
        torch.set_num_threads(args.threads)
    return min(sims), min(naives), warm.params.sigma


# --------------------------------------------------------------------------- throughput


def throughput(res: Results, args: argparse.Namespace) -> None:
    import torch
    from vs_breaching import build_observations, observation_of

    from privaudit.attacks import ig
    from privaudit.eval.metrics import psnr
    from privaudit.scenario.data import load_dataset

    k, iters = 16, (50 if args.quick else 300)
    n_train = len(load_dataset("photos").train_x)
    data, raw = build_observations([int((i + 0.5) * n_train / k) for i in range(k)], 0)
    obs = [observation_of(o, data) for o in raw]
    dev = args.device
    ig(obs[:1], iterations=2, device=dev)  # warm-up
    out: dict = {}

    def batched():
        out["batched"] = ig(obs, iterations=iters, seed=0, device=dev)

    def separate():
        out["separate"] = [
            ig([o], iterations=iters, seed=i, device=dev)[0] for i, o in enumerate(obs)
        ]

    # interleaved, min over rounds: load from other processes hits both sides alike
    seps, bats = [], []
    for rep in range(1 if args.quick else 2):
        torch.set_num_threads(baseline_threads(args, rep))
        seps.append(timed(separate, dev))
        torch.set_num_threads(args.threads)
        bats.append(timed(batched, dev))
    t_sep, t_bat = min(seps), min(bats)
    p_sep = (
        sum(psnr(o["image"], r.images.cpu()) for o, r in zip(raw, out["separate"], strict=True)) / k
    )
    p_bat = (
        sum(psnr(o["image"], r.images.cpu()) for o, r in zip(raw, out["batched"], strict=True)) / k
    )
    res.add(
        "throughput",
        f"IG {k} obs × {iters} it: batched / one at a time ({t_bat:.1f} s vs {t_sep:.1f} s)",
        t_sep / t_bat,
        ">= 4",
        t_sep / t_bat >= 4,
        unit="x",
        wall_batched_s=t_bat,
        wall_separate_s=t_sep,
    )
    res.add(
        "throughput",
        f"  PSNR batched {p_bat:.2f} dB vs one at a time {p_sep:.2f} dB (diff)",
        p_bat - p_sep,
        ">= -0.1",
        p_bat - p_sep >= -0.1,
        unit=" dB",
        psnr_batched=p_bat,
        psnr_separate=p_sep,
    )


# --------------------------------------------------------------------------- breaching


def breaching(res: Results, args: argparse.Namespace) -> None:
    import vs_breaching as vb

    images = 1 if args.quick else 3
    plan = {"ig": 100 if args.quick else 500, "dlg": 20 if args.quick else 100}
    for attack, iters in plan.items():
        argv = [
            "--attacks",
            attack,
            "--images",
            str(images),
            "--iterations",
            str(iters),
            "--device",
            args.device,
            "--threads",
            str(args.breaching_threads),
            "--repeats",
            "1" if args.quick else "3",  # min over interleaved rounds: tracing time varies
            "--quiet",
        ]
        try:
            rep = vb.benchmark(vb.parse_args(argv))
        except vb.Unavailable as e:
            res.add(
                "breaching",
                f"{attack.upper()} vs breaching: unavailable ({e})",
                float("nan"),
                "",
                False,
            )
            continue
        s = rep["attacks"][attack]["summary"]
        a = attack.upper()
        if attack == "ig":
            res.add(
                "breaching",
                f"IG time/iteration privaudit / breaching ({iters} it, {images} img, B=1)",
                s["time_ratio"],
                "<= 0.5",
                s["time_ratio"] <= 0.5,
                ms_per_iter_privaudit=1e3 * s["s_per_iter_privaudit"],
                ms_per_iter_breaching=1e3 * s["s_per_iter_breaching"],
                cpu_time_ratio=s["cpu_time_ratio"],
            )
        else:
            res.add(
                "breaching",
                f"DLG time/evaluation privaudit / breaching ({iters} L-BFGS steps, {images} img)",
                s["eval_time_ratio"],
                "<= 0.5",
                s["eval_time_ratio"] <= 0.5,
                ms_per_eval_privaudit=1e3 * s["s_per_eval_privaudit"],
                ms_per_eval_breaching=1e3 * s["s_per_eval_breaching"],
            )
            res.add(
                "breaching",
                "  DLG time per L-BFGS step (different evaluations/step)",
                s["time_ratio"],
                None,
                None,
            )
        res.add(
            "breaching",
            f"{a} PSNR privaudit − breaching ({s['psnr_privaudit']:.2f} vs "
            f"{s['psnr_breaching']:.2f} dB)",
            s["psnr_diff"],
            ">= -0.5",
            s["psnr_diff"] >= -0.5,
            unit=" dB",
        )
        if "batched_time_ratio" in s:
            res.add(
                "breaching",
                f"  IG batched ({s['batched_count']} obs in one run) per "
                "obs-iteration / breaching once per obs",
                s["batched_time_ratio"],
                None,
                None,
                psnr_batched=s["psnr_batched"],
            )


# --------------------------------------------------------------------------- end to end


def end_to_end(res: Results, args: argparse.Namespace, tmp: Path) -> None:
    rounds = 20 if args.quick else 200
    cmd = [
        sys.executable,
        "-m",
        "privaudit.cli",
        "attack",
        "--target",
        "dpdl-cg",
        "--round",
        str(rounds),
    ]
    if args.quick:
        cmd += ["--iterations", "100"]
    if args.device != "cpu":
        cmd += ["--device", args.device]
    (tmp / "e2e").mkdir()
    r = peak_rss(cmd, cwd=tmp / "e2e", timeout=E2E_TIMEOUT_S)
    what = "README main command" if not args.quick else "quick: not the README's settings"
    judged = not args.quick or r["timed_out"]
    res.add(
        "end_to_end",
        f"privaudit attack --target dpdl-cg --round {rounds} ({what}) wall"
        + (f", killed at {E2E_TIMEOUT_S:g} s" if r["timed_out"] else ""),
        r["wall_s"],
        f"<= {E2E_TARGET_S:g} s" if judged else None,
        r["wall_s"] <= E2E_TARGET_S if judged else None,
        unit=" s",
    )
    res.add("end_to_end", "  peak RSS", r["peak_rss_mb"], None, None, unit=" MB")


# --------------------------------------------------------------------------- memory

_MEMORY_SCRIPT = """
import sys
from privaudit.core.config import RunConfig
from privaudit.core.messages import CaptureSpec
from privaudit.sim.run import Run
import torch
root, rounds, device = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(int(sys.argv[4]))
run = Run.create(RunConfig(defense="dpdl", rounds=rounds, device=device), root)
src, dst = run.edges()[0]
run.train(capture=CaptureSpec.of(rounds=range(1, rounds + 1), links={(src, dst), (dst, src)}),
          progress=False)
"""


def memory(res: Results, args: argparse.Namespace, tmp: Path) -> None:
    short, long = (10, 40) if args.quick else (50, 200)
    out = {}
    for rounds in (short, long):
        root = tmp / f"mem{rounds}"
        r = peak_rss(
            [
                sys.executable,
                "-c",
                _MEMORY_SCRIPT,
                str(root),
                str(rounds),
                args.device,
                str(args.threads),
            ],
            cwd=tmp,
        )
        captured = sum(f.stat().st_size for f in (root / "messages").glob("*")) / 2**20
        out[rounds] = (r["peak_rss_mb"], captured)
    (rss_s, cap_s), (rss_l, cap_l) = out[short], out[long]
    growth, allowed = rss_l - rss_s, max(cap_l - cap_s, 0.0)
    res.add(
        "memory",
        f"peak RSS {long} − {short} rounds, capture all rounds on one link "
        f"({rss_l:.0f} − {rss_s:.0f} MB)",
        growth,
        f"<= {allowed:.0f} MB",
        growth <= allowed,
        unit=" MB",
        captured_mb={short: cap_s, long: cap_l},
        peak_rss_mb={short: rss_s, long: rss_l},
    )


# --------------------------------------------------------------------------- scale


def scale(res: Results, args: argparse.Namespace, tmp: Path) -> None:
    import scale as bench

    agents, batch = ((4, 8), 8) if args.quick else ((4, 16), 32)
    env = {**os.environ, "PRIVAUDIT_GRADS": "auto", "PRIVAUDIT_MAX_MEMORY": SCALE_BUDGET}
    added = {}
    for n in agents:
        cmd = bench.train_args(n, batch, 1, args.threads, args.device, str(tmp / f"scale{n}"))
        result, peak, _, _, status = bench.run_child(
            bench.CHILD_TRAIN, cmd, env, 3 * SCALE_PEAK_GB * bench.GB, 1800.0
        )
        name = f"ResNet-18 DPDL, {n} agents, B = {batch}, --max-memory {SCALE_BUDGET}"
        last = n == agents[-1] and not args.quick
        if result is None:
            res.add("scale", f"{name}: {status}", float("nan"), None, False if last else None)
            continue
        added[n] = (peak - bench.state_bytes(n)) / bench.GB
        per_round = sum(result["rounds"]) / len(result["rounds"])
        target = f"<= {SCALE_PEAK_GB:g} GB" if last else None
        ok = peak / bench.GB <= SCALE_PEAK_GB if last else None
        res.add("scale", f"{name}: peak RSS", peak / bench.GB, target, ok, unit=" GB")
        res.add("scale", "  peak less the state (2 rows per agent)", added[n], unit=" GB")
        target = f"<= {SCALE_ROUND_S:g} s" if last else None
        ok = per_round <= SCALE_ROUND_S if last else None
        res.add("scale", "  s/round", per_round, target, ok, unit=" s")
        if result["cuda_peak"]:
            res.add("scale", "  peak CUDA memory", result["cuda_peak"] / bench.GB, unit=" GB")
    if len(added) == 2:
        small, large = (added[n] for n in agents)
        res.add(
            "scale",
            f"peak less the state, {agents[-1]} / {agents[0]} agents",
            large / small,
            "<= 1.1",
            large / small <= 1.1,
            unit="×",
        )


# --------------------------------------------------------------------------- main


def measured(section: str, args: argparse.Namespace, work: Path) -> list[dict]:
    """Run ``section`` (its working files in ``work``); its rows, printed as they come."""
    sub = Results()
    fn = globals()[section]
    if section in ("simulation", "end_to_end", "memory", "scale"):
        fn(sub, args, work)
    else:
        fn(sub, args)
    return sub.rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in only if s not in SECTIONS]
    if bad:
        print(f"unknown section(s) {bad}; choose from {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("--device cuda was asked for but CUDA is not available", file=sys.stderr)
        return 2
    args.breaching_threads = args.threads or 1
    args.threads = max(1, args.threads or torch.get_num_threads())
    torch.set_num_threads(args.threads)
    info = machine(args)
    print(
        f"privaudit speed benchmarks — {info['cpu']}, {info['cores']} cores, torch "
        f"{info['torch']}, device {args.device}, {args.threads} torch thread(s), load "
        f"{info['load_average_1min']:.2f}{' (quick)' if args.quick else ''}"
    )
    res = Results()
    start = time.perf_counter()

    def identity(section: str) -> dict:
        return dict(bench="run", section=section, device=args.device, quick=args.quick,
                    threads=args.threads, breaching_threads=args.breaching_threads)  # fmt: skip

    sources = [__file__, *(HERE / f for f in ("naive_dpdl.py", "vs_breaching.py", "scale.py"))]
    pieces = Pieces(args.out, [identity(s) for s in only], sources)
    for section in only:
        print(f"\n{section}", flush=True)
        saved, rows = pieces.get(identity(section))
        if saved:  # measured by an earlier run into --out: its lines again
            res.replay(rows)
        else:  # measured now, on a fresh working folder (its lines printed as it goes)
            res.rows += pieces.run(identity(section), lambda w, s=section: measured(s, args, w))
    info["load_average_1min_after"] = os.getloadavg()[0]
    info["total_s"] = time.perf_counter() - start
    judged = [r for r in res.rows if r["verdict"] != "info"]
    passed = sum(r["verdict"] == "PASS" for r in judged)
    print(
        f"\n{passed}/{len(judged)} targets met in {info['total_s']:.0f} s "
        f"(load average {info['load_average_1min']:.2f} → "
        f"{info['load_average_1min_after']:.2f} on {info['cores']} cores)"
    )
    if args.json:
        text = dumps_strict({"machine": info, "results": res.rows}, sort_keys=False)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
