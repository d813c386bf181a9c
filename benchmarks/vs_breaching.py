"""privaudit's IG and DLG against breaching's on the same observations.

For each of ``--images`` real 32×32 photos
(``privaudit.scenario.data.load_dataset("photos")``), this builds one observation: the DLG
LeNet (``build_model("lenet", (3, 32, 32), 10, seed)``: sigmoid, uniform(−0.5, 0.5) init), one
image and its label (B = 1), the dataset's normalisation, and the
true gradient of the mean cross-entropy at the model's parameters. privaudit's attack runs on it
in this process; breaching's (``invertinggradients`` / ``deepleakage`` configs of the
``breaching`` package, 0.1.2) runs on exactly the same tensors in a second process,
``benchmarks/_breaching_worker.py``, under ``benchmarks/.breaching-env`` (made by
``benchmarks/setup_breaching.sh``; breaching is no privaudit dependency). Both get the same
iteration count, the same starting point (privaudit's seeded uniform image, and for DLG its
label logits), the same torch thread count.

Reported per attack: PSNR of each reconstruction against the true image, time per iteration,
``time_per_iter(privaudit) / time_per_iter(breaching)`` and ``psnr(privaudit) − psnr(breaching)``
(means over the images). Time per iteration is ``(T_N − T_0) / steps``: the wall time of the
attack call with N iterations minus that of the same call with 0 iterations (after one short
warm-up call per side), over the optimizer steps actually taken; imports, setup and final scoring
cancel out and everything inside the optimisation loop is counted. The worker stays alive and
takes one run per request, so the two sides' runs are interleaved (order alternating) and, with
``--repeats``, each time is the min over rounds: load from other processes hits both alike.
Threads default to 1 in both processes (``--threads``). For DLG an iteration is one L-BFGS
step of up to ``max_iter`` closure evaluations; the time per evaluation (forward pass +
second-order backward, counted by a forward hook) is reported too.

Labels: the observations do not reveal them; both sides infer them the same way for IG (iDLG:
argmin of the last layer's weight-gradient row sums — privaudit ``label_source="weight"``,
breaching ``label_strategy=iDLG``); DLG optimises soft labels on both sides.

Matched hyperparameters are read from privaudit's own defaults (``inspect.signature`` of
``ig`` / ``dlg``) and passed to breaching as config overrides; the remaining differences are
printed with the table. Usage::

    bash benchmarks/setup_breaching.sh          # once
    python benchmarks/vs_breaching.py [--images 4] [--iterations N] [--attacks ig,dlg]
                                      [--device cpu] [--threads 1] [--repeats R]
                                      [--breaching-space pixel|normalized] [--json [PATH]]
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV_PYTHON = HERE / ".breaching-env" / "bin" / "python"
WORKER = HERE / "_breaching_worker.py"
DEFAULT_ITERATIONS = {"ig": 1000, "dlg": 300}
BREACHING_CONFIG = {"ig": "invertinggradients", "dlg": "deepleakage"}
MODEL_SEED_OFFSET = 1000  # model seeds differ from the attack seeds (both use torch's MT stream)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--attacks", default="ig,dlg", help="comma-separated subset of ig,dlg")
    p.add_argument("--images", type=int, default=4, help="number of images (default 4)")
    p.add_argument(
        "--indices",
        default=None,
        help="comma-separated train indices (default: spread over the train set)",
    )
    p.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="iterations for every attack (default: IG 1000, DLG 300)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads in both processes (default 1: a B=1 LeNet step is "
        "too small to parallelise, and with more threads than free cores OpenMP "
        "barriers make both sides' timings erratic)",
    )
    p.add_argument("--seed", type=int, default=0, help="attack seed of image i is seed + i")
    p.add_argument(
        "--breaching-space",
        choices=("pixel", "normalized"),
        default="pixel",
        help="pixel (default): fold the normalisation into breaching's model so it "
        "optimises [0, 1] pixels like privaudit, making lr and TV weight mean the "
        "same; normalized: breaching's own normalised input space",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="interleaved timing rounds; each time is the min over rounds "
        "(default 1; use 3+ on a busy machine)",
    )
    p.add_argument("--quiet", action="store_true", help="no per-run progress on stderr")
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="also write the results as JSON to PATH (or stdout if no PATH)",
    )
    return p.parse_args(argv)


# --------------------------------------------------------------------------- observations


def build_observations(indices: list[int], seed: int):
    """One (model, image, label, gradient, init) per index."""
    import torch
    import torch.nn.functional as F

    from privaudit.scenario.data import load_dataset
    from privaudit.scenario.models import build_model

    data = load_dataset("photos")
    mean = torch.tensor(data.mean, dtype=torch.float32).reshape(1, -1, 1, 1)
    std = torch.tensor(data.std, dtype=torch.float32).reshape(1, -1, 1, 1)
    out = []
    for i, idx in enumerate(indices):
        model = build_model("lenet", data.input_shape, data.num_classes, MODEL_SEED_OFFSET + i)
        x = data.train_x[idx : idx + 1].clone()
        y = data.train_y[idx : idx + 1].clone()
        loss = F.cross_entropy(model((x - mean) / std), y)
        names = [n for n, _ in model.named_parameters()]
        grads = torch.autograd.grad(loss, list(model.parameters()))
        # privaudit's starting point for seed s (attacks.common.init_images / dlg): one CPU
        # generator seeded s; the (R=1, B=1) uniform image, then (DLG) the label logits.
        g = torch.Generator().manual_seed(seed + i)
        x0 = torch.rand((1, 1, *data.input_shape), generator=g)[0]
        y0 = torch.randn((1, 1, data.num_classes), generator=g)[0]
        out.append(
            dict(
                index=idx,
                model=model,
                image=x,
                label=y,
                seed=seed + i,
                params={n: p.detach().clone() for n, p in model.named_parameters()},
                grads=dict(zip(names, (t.detach().clone() for t in grads), strict=True)),
                x0=x0,
                y0=y0,
            )
        )
    return data, out


def observation_of(o: dict, data):
    """The privaudit Observation of one entry of :func:`build_observations` (labels hidden)."""
    from privaudit.core.observation import Observation

    return Observation(
        model=o["model"],
        params=o["params"],
        target=o["grads"],
        batch_size=1,
        input_shape=tuple(data.input_shape),
        num_classes=data.num_classes,
        labels=None,
        mean=tuple(data.mean),
        std=tuple(data.std),
    )


def save_observations(path: Path, obs: list[dict], config: dict) -> None:
    from safetensors.torch import save_file

    tensors = {}
    for k, o in enumerate(obs):
        for n, t in o["params"].items():
            tensors[f"{k}.param.{n}"] = t.contiguous()
        for n, t in o["grads"].items():
            tensors[f"{k}.grad.{n}"] = t.contiguous()
        tensors[f"{k}.image"] = o["image"].contiguous()
        tensors[f"{k}.label"] = o["label"].contiguous()
        tensors[f"{k}.x0"] = o["x0"].contiguous()
        tensors[f"{k}.y0"] = o["y0"].contiguous()
    save_file(tensors, str(path), metadata={"config": json.dumps(config)})


# --------------------------------------------------------------------------- privaudit side


def privaudit_defaults() -> dict[str, dict]:
    from privaudit.attacks import dlg, ig

    def defaults(fn):
        return {
            p.name: p.default
            for p in inspect.signature(fn).parameters.values()
            if p.kind is p.KEYWORD_ONLY and p.default is not inspect.Parameter.empty
        }

    return {"ig": defaults(ig), "dlg": defaults(dlg)}


class Privaudit:
    """privaudit's attacks, one Observation per call, timed like the worker times breaching."""

    def __init__(self, obs: list[dict], data, device: str):
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        from privaudit.attacks import dlg, ig

        self.torch, self.obs, self.data, self.device = torch, obs, data, device
        self.fns = {"ig": ig, "dlg": dlg}
        self.counts = {"steps": 0}
        register_optimizer_step_post_hook(lambda *_: self._bump("steps"))

    def _bump(self, what: str) -> None:
        self.counts[what] += 1

    def observation(self, o: dict):
        return observation_of(o, self.data)

    def run(self, attack: str, k: int, iterations: int):
        torch, o = self.torch, self.obs[k]
        ob = self.observation(o)
        self.counts.update(steps=0)
        self._sync()
        c, t = time.process_time(), time.perf_counter()
        (rec,) = self.fns[attack](
            ob, iterations=iterations, restarts=1, seed=o["seed"], device=self.device
        )
        self._sync()
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        # evaluations of the objective: IG one per step; L-BFGS counts its closure calls
        # (the attacks replay a traced graph, so a forward hook no longer sees them)
        evals = rec.meta.get("evaluations", self.counts["steps"])
        info = dict(wall=wall, cpu=cpu, evals=evals, steps=self.counts["steps"], objective=rec.loss)
        if iterations == 0:  # the start point privaudit used, to compare with breaching's
            info["same_init"] = bool(torch.allclose(rec.images.cpu(), o["x0"], atol=1e-6))
        return info, rec

    def run_batched(self, attack: str, iterations: int):
        """All observations as one batched optimisation (observation i from seed + i)."""
        obs = [self.observation(o) for o in self.obs]
        self._sync()
        t = time.perf_counter()
        recs = self.fns[attack](
            obs, iterations=iterations, restarts=1, seed=self.obs[0]["seed"], device=self.device
        )
        self._sync()
        return time.perf_counter() - t, recs

    def _sync(self) -> None:
        if self.torch.device(self.device).type == "cuda":
            self.torch.cuda.synchronize(self.device)


# --------------------------------------------------------------------------- breaching side


def breaching_overrides(attack: str, pa: dict) -> tuple[list[str], list[str]]:
    """Config overrides that match privaudit's defaults, and the differences left."""
    if attack == "ig":
        d = pa["ig"]
        over = [
            f"optim.step_size={d['lr']}",
            f"regularization.total_variation.scale={d['tv']}",
            f"optim.signed={'hard' if d['signed'] else 'null'}",
            f"optim.boxed={bool(d['boxed'])}",
            f"optim.step_size_decay={'step-lr' if d['lr_decay'] else 'null'}",
            "label_strategy=iDLG",
            "restarts.num_trials=1",
        ]
        diffs = [
            "LR milestones: breaching N//2.667, N//1.6, N//1.142 vs privaudit round(3N/8, 5N/8, "
            "7N/8) (see table)",
            "TV: breaching's conv form pads with zeros (adds |x| terms at the last row/column) "
            "and adds eps=1e-8 inside |.|; privaudit averages interior differences only",
            "returned iterate: breaching the lowest-objective iterate (objective taken before a "
            "step, image stored after it); privaudit the final iterate",
        ]
        if d.get("label_source", "weight") != "weight":
            diffs.append(f"labels: privaudit label_source={d['label_source']!r}, breaching iDLG")
        return over, diffs
    d = pa["dlg"]
    over = [
        f"optim.step_size={d['lr']}",
        # breaching's Euclidean objective is 0.5·Σ(g−t)², privaudit's Σ(g−t)²: scale 2 makes
        # them identical (L-BFGS tolerances are absolute, so the scale matters).
        "objective.scale=2.0",
        "restarts.num_trials=1",
    ]
    diffs = [
        "returned iterate: breaching the best outer L-BFGS step (objective at the step's start, "
        "image after it); privaudit the best of every closure evaluation",
        "labels: breaching 0.1.2 returns its label template's argmax, not the optimised labels "
        "(label accuracy not compared)",
    ]
    torch_lbfgs = {"max_iter": 20, "history_size": 100, "line_search_fn": None}
    for key, val in torch_lbfgs.items():  # breaching uses torch's LBFGS defaults
        if d.get(key) != val:
            diffs.append(f"L-BFGS {key}: privaudit {d.get(key)!r}, breaching {val!r}")
    return over, diffs


class Breaching:
    """The worker process under benchmarks/.breaching-env, driven one run at a time."""

    def __init__(self, obs_path: Path, out_path: Path, log_path: Path):
        self.out_path, self.log_path = out_path, log_path
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in finish()
        self.proc = subprocess.Popen(
            [str(ENV_PYTHON), str(WORKER), str(obs_path), str(out_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            cwd=str(HERE.parent),
        )

    def _ask(self, cmd: dict) -> dict:
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            self.proc.wait()
            self.log.flush()
            tail = self.log_path.read_text()[-6000:]
            sys.stderr.write(tail)
            raise SystemExit(
                f"breaching worker failed (exit {self.proc.returncode}); its output is above"
            )
        return json.loads(line)

    def run(
        self,
        attack: str,
        k: int,
        iterations: int,
        keep: bool = False,
        overrides: tuple = (),
        known_labels: bool = False,
    ) -> dict:
        cmd = {"attack": attack, "k": k, "iterations": iterations, "keep": keep}
        return self._ask({**cmd, "overrides": list(overrides), "known_labels": known_labels})

    def finish(self) -> dict:
        from safetensors.torch import load_file, safe_open

        self._ask({"finish": True})
        self.proc.wait()
        self.log.close()
        with safe_open(str(self.out_path), "pt") as f:
            results = json.loads(f.metadata()["results"])
        return {"results": results, "tensors": load_file(str(self.out_path))}


# --------------------------------------------------------------------------- schedule


def measure(attacks, iters, obs, ours: Privaudit, theirs: Breaching, repeats: int, log) -> dict:
    """Interleaved runs: per image, each side's 0-iteration and N-iteration call, the order of
    the two sides alternating; ``repeats`` rounds; min over rounds of each wall time."""
    out = {}
    for a in attacks:
        n = iters[a]
        ours.run(a, 0, min(n, 3))  # warm-up: lazy init, kernels, TorchScript profiling
        theirs.run(a, 0, min(n, 3))
        rows = [{"ours": [], "theirs": []} for _ in obs]
        recs = {}
        for rep in range(repeats):
            for k in range(len(obs)):
                sides = ["ours", "theirs"] if (rep + k) % 2 == 0 else ["theirs", "ours"]
                for iterations in (0, n):
                    for side in sides:
                        if side == "ours":
                            info, rec = ours.run(a, k, iterations)
                            if rep == 0 and iterations == n:
                                recs[k] = rec
                        else:
                            info = theirs.run(a, k, iterations, keep=rep == 0 and iterations == n)
                        info["iterations"] = iterations
                        rows[k][side].append(info)
                        if iterations:
                            log(
                                f"{a} image {obs[k]['index']} round {rep + 1}: "
                                f"{'privaudit' if side == 'ours' else 'breaching'} "
                                f"{info['steps']} steps {info['wall']:.1f} s"
                            )
        out[a] = {"rows": rows, "recs": recs}
        if a == "ig" and len(obs) > 1:  # privaudit's batched mode, for the labelled extra row
            walls = {0: [], n: []}
            for _ in range(repeats):
                for iterations in (0, n):
                    wall, batched = ours.run_batched(a, iterations)
                    walls[iterations].append(wall)
                    if iterations:
                        out[a]["batched_recs"] = batched
            out[a]["batched"] = {"wall_0": min(walls[0]), "wall_n": min(walls[n])}
            log(f"{a} batched ×{len(obs)}: {min(walls[n]):.1f} s")
    return out


def timing(runs: list[dict]) -> dict:
    """Per-iteration and per-evaluation wall / CPU time from the min over rounds."""
    zero = [r for r in runs if r["iterations"] == 0]
    full = [r for r in runs if r["iterations"] > 0]
    w0, wn = min(r["wall"] for r in zero), min(r["wall"] for r in full)
    c0, cn = min(r["cpu"] for r in zero), min(r["cpu"] for r in full)
    steps = full[0]["steps"] - zero[0]["steps"]
    evals = full[0]["evals"] - zero[0]["evals"]
    return dict(
        s_per_iter=(wn - w0) / steps if steps else math.nan,
        cpu_s_per_iter=(cn - c0) / steps if steps else math.nan,
        s_per_eval=(wn - w0) / evals if evals else math.nan,
        steps=steps,
        evals=evals,
        wall_n=[r["wall"] for r in full],
        wall_0=[r["wall"] for r in zero],
        same_init=zero[0].get("same_init", True),
    )


# --------------------------------------------------------------------------- report


def mean(xs: list[float]) -> float:
    xs = [x for x in xs if math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan


class Unavailable(Exception):
    """The comparison cannot run here (no breaching env, bad arguments)."""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = benchmark(args)
    except Unavailable as e:
        print(e, file=sys.stderr)
        return 2
    print_report(report)
    if args.json:
        from privaudit.core.files import to_jsonable

        text = json.dumps(to_jsonable(report), indent=2, allow_nan=False)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0


def benchmark(args: argparse.Namespace) -> dict:
    """Run the comparison; the report as a dict (``print_report`` prints it)."""
    if not ENV_PYTHON.exists():
        raise Unavailable(
            f"breaching env missing ({ENV_PYTHON}): run benchmarks/setup_breaching.sh first"
        )
    attacks = [a.strip() for a in args.attacks.split(",") if a.strip()]
    bad = [a for a in attacks if a not in DEFAULT_ITERATIONS]
    if bad or not attacks:
        raise Unavailable(f"unknown attack(s) {bad}; choose from ig, dlg")
    load_before = os.getloadavg()[0]

    import torch

    from privaudit.eval.metrics import psnr

    threads = max(1, args.threads)
    torch.set_num_threads(threads)
    if args.indices:
        indices = [int(s) for s in args.indices.split(",")]
    else:
        from privaudit.scenario.data import load_dataset

        n_train = len(load_dataset("photos").train_x)
        indices = [int((i + 0.5) * n_train / args.images) for i in range(args.images)]
    data, obs = build_observations(indices, args.seed)
    pa = privaudit_defaults()
    iters = {a: args.iterations or DEFAULT_ITERATIONS[a] for a in attacks}

    config = {
        "attacks": attacks,
        "count": len(obs),
        "threads": threads,
        "device": args.device,
        "input_shape": list(data.input_shape),
        "num_classes": data.num_classes,
        "mean": list(data.mean),
        "std": list(data.std),
        "breaching_space": args.breaching_space,
    }
    diffs = {}
    for a in attacks:
        over, diffs[a] = breaching_overrides(a, pa)
        config[a] = {"config": BREACHING_CONFIG[a], "overrides": over}
    if args.breaching_space == "normalized":
        for a in attacks:
            diffs[a].append(
                "breaching optimises normalised inputs: its Adam step / L-BFGS "
                "metric and TV act in (x − mean)/std units, privaudit's in pixels"
            )
    if "ig" in attacks:
        n = iters["ig"]
        ours_ms = ig_milestones(n)
        theirs_ms = [int(n // f) for f in (2.667, 1.6, 1.142)]
        diffs["ig"][0] = (
            f"LR milestones: identical ({ours_ms})"
            if ours_ms == theirs_ms
            else f"LR milestones: privaudit {ours_ms}, breaching {theirs_ms}"
        )

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="vs_breaching-") as tmp:
        tmp = Path(tmp)
        save_observations(tmp / "observations.safetensors", obs, config)
        theirs = Breaching(
            tmp / "observations.safetensors", tmp / "out.safetensors", tmp / "worker.log"
        )
        ours = Privaudit(obs, data, args.device)
        measured = measure(attacks, iters, obs, ours, theirs, args.repeats, log)
        worker = theirs.finish()
    load_after = os.getloadavg()[0]

    report: dict = {
        "threads": threads,
        "device": args.device,
        "indices": indices,
        "repeats": args.repeats,
        "breaching_space": args.breaching_space,
        "torch": torch.__version__,
        "load_average_1min": {"before": load_before, "after": load_after},
        "cpus": os.cpu_count(),
        "attacks": {},
    }
    for a in attacks:
        per_image = []
        for k, o in enumerate(obs):
            t_ours = timing(measured[a]["rows"][k]["ours"])
            t_theirs = timing(measured[a]["rows"][k]["theirs"])
            rec = measured[a]["recs"][k]
            rec_b = worker["tensors"][f"{a}.{k}.recon"]
            row = dict(
                index=o["index"],
                label=int(o["label"]),
                psnr_privaudit=psnr(o["image"], rec.images.cpu()),
                psnr_breaching=psnr(o["image"], rec_b),
            )
            row.update({f"{key}_privaudit": v for key, v in t_ours.items()})
            row.update({f"{key}_breaching": v for key, v in t_theirs.items()})
            if a == "ig":
                row["label_privaudit"] = int(rec.labels.reshape(-1)[0])
                row["label_breaching"] = int(worker["tensors"][f"{a}.{k}.label"][0])
            per_image.append(row)

        def avg(key: str, rows=per_image) -> float:
            return mean([r[key] for r in rows])

        summary = {"iterations": iters[a]}
        for key in ("psnr", "s_per_iter", "cpu_s_per_iter", "s_per_eval"):
            for side in ("privaudit", "breaching"):
                summary[f"{key}_{side}"] = avg(f"{key}_{side}")
        summary["psnr_diff"] = mean([r["psnr_privaudit"] - r["psnr_breaching"] for r in per_image])
        summary["time_ratio"] = summary["s_per_iter_privaudit"] / summary["s_per_iter_breaching"]
        summary["cpu_time_ratio"] = (
            summary["cpu_s_per_iter_privaudit"] / summary["cpu_s_per_iter_breaching"]
        )
        summary["eval_time_ratio"] = (
            summary["s_per_eval_privaudit"] / summary["s_per_eval_breaching"]
        )
        if "batched" in measured[a]:
            b, k = measured[a]["batched"], len(obs)
            summary["batched_count"] = k
            summary["s_per_obs_iter_batched"] = (b["wall_n"] - b["wall_0"]) / (iters[a] * k)
            summary["batched_time_ratio"] = (
                summary["s_per_obs_iter_batched"] / summary["s_per_iter_breaching"]
            )
            summary["psnr_batched"] = mean(
                [
                    psnr(o["image"], r.images.cpu())
                    for o, r in zip(obs, measured[a]["batched_recs"], strict=True)
                ]
            )
        report["attacks"][a] = {
            "summary": summary,
            "images": per_image,
            "privaudit_options": {
                k: v for k, v in pa[a].items() if k not in ("device", "progress", "seed")
            },
            "breaching_config": worker["results"]["configs"].get(a),
            "breaching_overrides": config[a]["overrides"],
            "differences": diffs[a],
        }

    return report


def print_report(report: dict) -> None:
    la = report["load_average_1min"]
    print(
        f"privaudit vs breaching 0.1.2 — device {report['device']}, {report['threads']} torch "
        f"threads in both processes, breaching in {report['breaching_space']} space, "
        f"images {report['indices']}, min of {report['repeats']} interleaved round(s)"
    )
    if la["before"] > 0.5 * (report["cpus"] or 1):
        print(
            f"note: load average was {la['before']:.2f} before the run on "
            f"{report['cpus']} CPUs: other processes share the machine, timings are noisy"
        )
    for a, r in report["attacks"].items():
        s = r["summary"]
        print(
            f"\n{a.upper()} ({s['iterations']} iterations, restarts 1, "
            f"{'labels inferred (iDLG) on both sides' if a == 'ig' else 'soft labels optimised'}"
            f", same start point)"
        )
        head = (
            f"{'image':>6} {'label':>5} {'PSNR pa':>8} {'PSNR br':>8} {'ms/it pa':>9} "
            f"{'ms/it br':>9} {'ms/ev pa':>9} {'ms/ev br':>9} {'it pa':>6} {'it br':>6} "
            f"{'ev pa':>6} {'ev br':>6}"
        )
        if a == "ig":
            head += f" {'lab pa':>6} {'lab br':>6}"
        print(head)
        for x in r["images"]:
            line = (
                f"{x['index']:>6} {x['label']:>5} {x['psnr_privaudit']:8.2f} "
                f"{x['psnr_breaching']:8.2f} {1e3 * x['s_per_iter_privaudit']:9.2f} "
                f"{1e3 * x['s_per_iter_breaching']:9.2f} "
                f"{1e3 * x['s_per_eval_privaudit']:9.2f} "
                f"{1e3 * x['s_per_eval_breaching']:9.2f} "
                f"{x['steps_privaudit']:>6} {x['steps_breaching']:>6} "
                f"{x['evals_privaudit']:>6} {x['evals_breaching']:>6}"
            )
            if a == "ig":
                line += f" {x['label_privaudit']:>6} {x['label_breaching']:>6}"
            if not x["same_init_privaudit"]:
                line += "  (privaudit's start point differs from the one given to breaching)"
            print(line)
        print(
            f"{'mean':>6} {'':>5} {s['psnr_privaudit']:8.2f} {s['psnr_breaching']:8.2f} "
            f"{1e3 * s['s_per_iter_privaudit']:9.2f} {1e3 * s['s_per_iter_breaching']:9.2f} "
            f"{1e3 * s['s_per_eval_privaudit']:9.2f} {1e3 * s['s_per_eval_breaching']:9.2f}"
        )
        print(
            f"time_per_iter(privaudit)/time_per_iter(breaching) = {s['time_ratio']:.3f}  "
            f"(CPU time: {s['cpu_time_ratio']:.3f}; per evaluation: "
            f"{s['eval_time_ratio']:.3f})"
        )
        print(f"psnr(privaudit) - psnr(breaching) = {s['psnr_diff']:+.2f} dB")
        if "batched_time_ratio" in s:
            print(
                f"batched: privaudit {s['batched_count']} observations in one optimisation, "
                f"{1e3 * s['s_per_obs_iter_batched']:.2f} ms per observation-iteration "
                f"(PSNR {s['psnr_batched']:.2f}) vs breaching once per observation "
                f"{1e3 * s['s_per_iter_breaching']:.2f} ms: ratio "
                f"{s['batched_time_ratio']:.3f}"
            )
        print("breaching overrides: " + " ".join(r["breaching_overrides"]))
        print("differences left:")
        for d in r["differences"]:
            print(f"  - {d}")
    print(
        "\nit = optimizer steps actually taken (an attack stops early on a non-finite loss), "
        "ev = forward passes (L-BFGS: up to max_iter per step); ms/it and ms/ev are "
        "(T_N − T_0) / (it or ev), from wall times."
    )


def ig_milestones(n: int) -> list[int]:
    try:
        from privaudit.attacks.ig import milestones
    except ImportError:  # the helper may move while ig.py is tuned
        return [max(1, round(n * f)) for f in (3 / 8, 5 / 8, 7 / 8)]
    return list(milestones(n))


if __name__ == "__main__":
    sys.exit(main())
