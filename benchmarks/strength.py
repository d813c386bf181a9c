"""Attack strength: PSNR/SSIM of privaudit's attacks per batch size, training round and
model, beside breaching's Inverting Gradients on the same gradients.

For every dataset (``photos``; also MNIST with ``--data-root DIR``), model (``lenet``: DLG's
sigmoid LeNet, raw pixels; ``cnn``: conv–pool–conv–pool–FC, ReLU, normalised pixels) and
round (0: the freshly initialised model; 200: the same model after 200 steps of plain SGD,
batch 64, lr 0.05, on the dataset's train split — data the attacked images are not in) and
every batch size B, ``--batches`` batches of B test images are drawn. Each batch gives one
observation: the exact gradient of the batch's mean cross-entropy at the model's parameters
(no noise, scale 1). Labels are hidden by default, so each attack infers them as it would
from a real message; ``--labels known`` tells both tools the true labels instead, which
isolates the image step from label recovery. Every attack (``ig``, ``fi``, ``dlg``, ``hybrid``,
``rgap``, ``auto``) runs on that observation; reconstructions are matched to the true images
and scored with privaudit.eval.metrics (PSNR, SSIM, label accuracy), and the attack call is
timed (wall). Beside them, the row ``data-mean`` scores the train split's mean image as
every reconstruction: what an attacker gets from the data distribution alone, without the
gradient; an attack at or below it has recovered nothing. ``--dlg-iterations`` counts the
L-BFGS steps of ``dlg``, ``idlg`` and ``hybrid``.
``rgap`` and ``auto`` fall back to IG (same iterations as ``ig``) where no closed form
applies; the note column says what ran.

With ``benchmarks/.breaching-env`` (``bash benchmarks/setup_breaching.sh``) breaching 0.1.2's
``invertinggradients`` runs on the same gradients in a worker process
(``benchmarks/_breaching_worker.py``, driven as in ``benchmarks/vs_breaching.py``): privaudit
IG's hyperparameters as config overrides, the same start point (privaudit's seeded uniform
batch), labels by iDLG for B = 1 and breaching's ``bias-corrected`` rule for B > 1 (with
``--labels known``: the true labels, in the user's metadata); its
wall time covers ``attacker.reconstruct()`` only. Not on 1-channel data (MNIST): breaching
0.1.2's total-variation regulariser convolves exactly three channels.

Usage::

    python benchmarks/strength.py [--models lenet,cnn] [--attacks ig,fi,dlg,hybrid,rgap,auto]
        [--batch-sizes 1,4,8] [--rounds 0,200] [--batches 1] [--ig-iterations 300]
        [--dlg-iterations 30] [--labels hidden|known] [--data-root DIR] [--no-breaching]
        [--threads 1] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from vs_breaching import (  # noqa: E402 - a sibling script, not a package
    ENV_PYTHON,
    Breaching,
    breaching_overrides,
    privaudit_defaults,
    save_observations,
)

MODEL_SEED = 1000
TRAIN_BATCH = 64
TRAIN_LR = 0.05
MARGIN_DB = 3.0  # the margin over breaching asked of every target cell
BREACHING = "breaching-ig"  # the attack name of breaching's rows
FLOOR = "data-mean"  # the row scoring the train split's mean image (no attack)
LBFGS_ATTACKS = ("dlg", "idlg", "hybrid")  # --dlg-iterations counts their L-BFGS steps


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="lenet,cnn")
    p.add_argument(
        "--attacks", default="ig,fi,dlg,hybrid,rgap,auto", help="names, options as fi:refine=0"
    )
    p.add_argument("--batch-sizes", default="1,4,8")
    p.add_argument("--rounds", default="0,200", help="training steps before the attack")
    p.add_argument("--batches", type=int, default=1, help="batches per cell (default 1)")
    p.add_argument("--ig-iterations", type=int, default=300, help="IG (and fallbacks)")
    p.add_argument(
        "--dlg-iterations", type=int, default=30, help="L-BFGS steps of dlg, idlg, hybrid"
    )
    p.add_argument(
        "--labels",
        choices=("hidden", "known"),
        default="hidden",
        help="hidden: attacks infer labels (default); known: both tools are told them",
    )
    p.add_argument("--data-root", default=None, help="also MNIST, from this folder")
    p.add_argument("--no-breaching", action="store_true", help="skip breaching's IG")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="PATH", help="also write the rows as JSON")
    return p.parse_args(argv)


def ints(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def names(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


# --------------------------------------------------------------------------- setting


def trained(name: str, data: Any, steps: int, seed: int) -> tuple[Any, float]:
    """Model ``name`` after ``steps`` SGD steps on the train split, and its test accuracy."""
    import torch
    import torch.nn.functional as F

    from privaudit.scenario.models import build_model

    model = build_model(name, data.input_shape, data.num_classes, MODEL_SEED + seed)
    norm = normaliser(model, data)
    if steps:
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=TRAIN_LR)
        gen = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            idx = torch.randint(0, len(data.train_x), (TRAIN_BATCH,), generator=gen)
            loss = F.cross_entropy(model(norm(data.train_x[idx])), data.train_y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
    with torch.no_grad():
        hits = model(norm(data.test_x[:1000])).argmax(1) == data.test_y[:1000]
    acc = float(hits.float().mean())
    return model, acc


def normaliser(model: Any, data: Any):
    """The input map privaudit applies: identity for the LeNet, mean/std otherwise."""
    import torch

    from privaudit.scenario.models import normalizes_inputs

    if not normalizes_inputs(model):
        return lambda x: x
    mean = torch.tensor(data.mean).reshape(1, -1, 1, 1)
    std = torch.tensor(data.std).reshape(1, -1, 1, 1)
    return lambda x: (x - mean) / std


def observation(model: Any, data: Any, x: Any, y: Any, known_labels: bool = False) -> Any:
    """The exact gradient of the batch's mean cross-entropy, as an Observation (with the
    true labels told to the attack when ``known_labels``)."""
    import torch
    import torch.nn.functional as F

    from privaudit.core.observation import Observation
    from privaudit.scenario.models import normalizes_inputs

    loss = F.cross_entropy(model(normaliser(model, data)(x)), y)
    names_ = [n for n, _ in model.named_parameters()]
    grads = torch.autograd.grad(loss, list(model.parameters()))
    identity = not normalizes_inputs(model)
    c = data.input_shape[0]
    return Observation(
        model=model,
        params={n: p.detach().clone() for n, p in model.named_parameters()},
        target={n: g.detach().clone() for n, g in zip(names_, grads, strict=True)},
        batch_size=len(x),
        input_shape=tuple(data.input_shape),
        num_classes=data.num_classes,
        mean=(0.0,) * c if identity else tuple(data.mean),
        std=(1.0,) * c if identity else tuple(data.std),
        labels=y.clone() if known_labels else None,
    )


def floor_row(mean_image: Any, x: Any, y: Any) -> dict:
    """The ``data-mean`` row: ``mean_image`` (the train split's, (1, *S)) scored as every
    reconstruction."""
    from privaudit.eval.metrics import score

    s = score(x, y, mean_image.expand_as(x).clone(), None, lpips=False)
    return dict(attack=FLOOR, psnr=s["psnr"], ssim=s["ssim"], label_acc=None, wall=0.0, note="")


def batches(data: Any, b: int, count: int, seed: int) -> list[tuple[Any, Any]]:
    """``count`` batches of ``b`` distinct test images (the same for every model)."""
    import torch

    out = []
    for j in range(count):
        gen = torch.Generator().manual_seed(seed * 7919 + 104729 * b + j)
        idx = torch.randperm(len(data.test_x), generator=gen)[:b]
        out.append((data.test_x[idx].clone(), data.test_y[idx].clone()))
    return out


def note(attack: str, rec: Any) -> str:
    """What ran, in a few words."""
    attack = spec(attack)[0]
    m = rec.meta
    if attack == "auto":
        return f"→ {m['attack']}"
    if attack == "fi":
        return "features exact" if m["features"]["exact"] else "features inexact"
    if attack != "rgap":
        return ""
    why = m.get("fallback")
    if why is None:
        return "exact" if m.get("exact") else "rank deficient"
    if "one example" in why:
        return "B > 1 → ig"
    if "rank" in why:
        return "rank → ig"
    return "not a chain → ig"


# --------------------------------------------------------------------------- runs


def spec(text: str) -> tuple[str, dict[str, Any]]:
    """``"fi:refine=0:tv=0.01"`` -> ``("fi", {"refine": 0, "tv": 0.01})``: an attack and its
    options, each value read as JSON where it parses (else the string)."""
    name, *pairs = text.split(":")
    options = {}
    for pair in pairs:
        key, value = pair.split("=", 1)
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return name, options


def run_cell(attacks: list[str], obs: Any, x: Any, y: Any, args: argparse.Namespace, seed: int):
    """Every attack on one observation -> rows (attack, psnr, ssim, label_acc, wall, note)."""
    from privaudit.attacks import run_attack
    from privaudit.eval.metrics import score

    rows = []
    for attack in attacks:
        name, options = spec(attack)
        its = args.dlg_iterations if name in LBFGS_ATTACKS else args.ig_iterations
        t = time.perf_counter()
        (rec,) = run_attack(name, [obs], iterations=its, seed=seed, **options)
        wall = time.perf_counter() - t
        s = score(x, y, rec.images.detach().cpu(), rec.labels.cpu(), lpips=False)
        rows.append(
            dict(
                attack=attack,
                psnr=s["psnr"],
                ssim=s["ssim"],
                label_acc=s["label_acc"],
                wall=wall,
                note=note(attack, rec),
            )
        )
    return rows


def start_point(b: int, shape: tuple[int, ...], seed: int) -> Any:
    """privaudit IG's start for seed ``seed`` (attacks.common.init_images, one restart)."""
    import torch

    return torch.rand((1, b, *shape), generator=torch.Generator().manual_seed(seed))[0]


def breaching_rows(cells: list[dict], args: argparse.Namespace) -> dict[int, dict]:
    """breaching's IG on every cell's observation: {cell index: row}."""
    from privaudit.eval.metrics import score

    pa = privaudit_defaults()
    overrides, _ = breaching_overrides("ig", pa)
    overrides = [o for o in overrides if not o.startswith("label_strategy=")]
    first = cells[0]["data"]
    config = {
        "attacks": ["ig"],
        "count": len(cells),
        "threads": args.threads,
        "device": "cpu",
        "input_shape": list(first.input_shape),
        "num_classes": first.num_classes,
        "mean": list(first.mean),
        "std": list(first.std),
        "breaching_space": "pixel",
        "ig": {"config": "invertinggradients", "overrides": overrides},
        "per_observation": {
            str(k): {"model": c["model"], "mean": list(c["obs"].mean), "std": list(c["obs"].std)}
            for k, c in enumerate(cells)
        },
    }
    entries = []
    for c in cells:
        o = c["obs"]
        entries.append(
            dict(
                params=o.params,
                grads=o.target,
                image=c["x"],
                label=c["y"],
                x0=start_point(len(c["x"]), tuple(o.input_shape), c["seed"]),
                y0=c["y"].new_zeros(len(c["x"]), o.num_classes).float(),
            )
        )
    out: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="strength-") as tmp:
        tmp = Path(tmp)
        save_observations(tmp / "obs.safetensors", entries, config)
        worker = Breaching(tmp / "obs.safetensors", tmp / "out.safetensors", tmp / "worker.log")
        infos = {}
        for k, c in enumerate(cells):
            labels = "label_strategy=iDLG" if len(c["x"]) == 1 else "label_strategy=bias-corrected"
            infos[k] = worker.run(
                "ig",
                k,
                args.ig_iterations,
                keep=True,
                overrides=[labels],
                known_labels=args.labels == "known",
            )
            print(f"  breaching ig, cell {k + 1}/{len(cells)}", file=sys.stderr, flush=True)
        result = worker.finish()
    for k, c in enumerate(cells):
        rec = result["tensors"][f"ig.{k}.recon"]
        lab = result["tensors"][f"ig.{k}.label"]
        s = score(c["x"], c["y"], rec, lab if lab.numel() == len(c["x"]) else None, lpips=False)
        out[k] = dict(
            attack=BREACHING,
            psnr=s["psnr"],
            ssim=s["ssim"],
            label_acc=s["label_acc"],
            wall=infos[k]["wall"],
            note="",
        )
    return out


def benchmark(args: argparse.Namespace) -> dict:
    import torch

    from privaudit.scenario.data import load_dataset

    torch.set_num_threads(max(1, args.threads))
    datasets = [("photos", load_dataset("photos"))]
    if args.data_root:
        datasets.append(("mnist", load_dataset("mnist", args.data_root)))
    attacks = names(args.attacks)
    cells: list[dict] = []
    accuracy = {}
    for dname, data in datasets:
        mean_image = data.train_x.float().mean(0, keepdim=True)
        for model_name in names(args.models):
            for rnd in ints(args.rounds):
                model, acc = trained(model_name, data, rnd, args.seed)
                accuracy[(dname, model_name, rnd)] = acc
                for b in ints(args.batch_sizes):
                    for j, (x, y) in enumerate(batches(data, b, args.batches, args.seed)):
                        seed = args.seed + j
                        obs = observation(model, data, x, y, args.labels == "known")
                        print(
                            f"{dname} {model_name} round {rnd} B={b} batch {j + 1}",
                            file=sys.stderr,
                            flush=True,
                        )
                        rows = run_cell(attacks, obs, x, y, args, seed)
                        rows.append(floor_row(mean_image, x, y))
                        cells.append(
                            dict(
                                dataset=dname,
                                data=data,
                                model=model_name,
                                round=rnd,
                                b=b,
                                x=x,
                                y=y,
                                obs=obs,
                                seed=seed,
                                rows=rows,
                            )
                        )
    breaching = None
    skipped: list[str] = []  # breaching 0.1.2's TotalVariation convolves exactly 3 channels
    if not args.no_breaching and ENV_PYTHON.exists():
        by_dataset: dict[str, list[int]] = {}
        for k, c in enumerate(cells):
            by_dataset.setdefault(c["dataset"], []).append(k)
        breaching = {}
        for dname, ks in by_dataset.items():  # one worker per input shape
            if cells[ks[0]]["data"].input_shape[0] != 3:
                skipped.append(dname)
                continue
            got = breaching_rows([cells[k] for k in ks], args)
            breaching.update({ks[i]: row for i, row in got.items()})
    report = summarise(cells, accuracy, breaching, args)
    report["settings"]["breaching_skipped"] = skipped
    return report


def summarise(cells: list[dict], accuracy: dict, breaching: dict | None, args) -> dict:
    """Mean over the batches of each (dataset, model, round, B, attack)."""
    groups: dict[tuple, list[dict]] = {}
    for k, c in enumerate(cells):
        rows = list(c["rows"]) + ([breaching[k]] if breaching and k in breaching else [])
        for r in rows:
            key = (c["dataset"], c["model"], c["round"], c["b"], r["attack"])
            groups.setdefault(key, []).append(r)
    table = []
    for (dname, model, rnd, b, attack), rows in groups.items():

        def mean(key: str, rows=rows) -> float | None:
            vals = [r[key] for r in rows if r[key] is not None and math.isfinite(r[key])]
            return sum(vals) / len(vals) if vals else None

        notes = sorted({r["note"] for r in rows if r["note"]})
        table.append(
            dict(
                dataset=dname,
                model=model,
                round=rnd,
                batch_size=b,
                attack=attack,
                psnr=mean("psnr"),
                ssim=mean("ssim"),
                label_acc=mean("label_acc"),
                wall_s=mean("wall"),
                note=", ".join(notes),
            )
        )
    return {
        "rows": table,
        "margins": margins(table),
        "test_accuracy": [
            dict(dataset=d, model=m, round=r, accuracy=a) for (d, m, r), a in accuracy.items()
        ],
        "settings": dict(
            batches=args.batches,
            ig_iterations=args.ig_iterations,
            dlg_iterations=args.dlg_iterations,
            threads=args.threads,
            train=dict(batch=TRAIN_BATCH, lr=TRAIN_LR, optimizer="SGD"),
            breaching=breaching is not None,
            labels=args.labels,
        ),
    }


def margins(table: list[dict]) -> list[dict]:
    """Per (dataset, model, round, B) with a breaching row: the privaudit attack of highest
    mean PSNR among those whose mean wall time is at most breaching's, and its margin over
    breaching's PSNR; ``target`` marks the cells the margin is asked of (B ≥ 4 or a
    trained model), ``meets`` a margin of at least ``MARGIN_DB``; ``floor_db`` is the
    ``data-mean`` row's PSNR (None without one)."""
    cells: dict[tuple, list[dict]] = {}
    for r in table:
        key = (r["dataset"], r["model"], r["round"], r["batch_size"])
        cells.setdefault(key, []).append(r)
    out = []
    for (dname, model, rnd, b), rows in cells.items():
        ref = next((r for r in rows if r["attack"] == BREACHING), None)
        floor = next((r["psnr"] for r in rows if r["attack"] == FLOOR), None)
        if ref is None or ref["psnr"] is None or ref["wall_s"] is None:
            continue
        fast = [
            r
            for r in rows
            if r["attack"] not in (BREACHING, FLOOR) and r["psnr"] is not None
            and r["wall_s"] is not None and r["wall_s"] <= ref["wall_s"]
        ]  # fmt: skip
        best = max(fast, key=lambda r: r["psnr"], default=None)
        margin = None if best is None else best["psnr"] - ref["psnr"]
        out.append(
            dict(
                dataset=dname,
                model=model,
                round=rnd,
                batch_size=b,
                attack=None if best is None else best["attack"],
                margin_db=margin,
                wall_ratio=None if best is None else best["wall_s"] / ref["wall_s"],
                target=b >= 4 or rnd > 0,
                meets=margin is not None and margin >= MARGIN_DB,
                breaching_db=ref["psnr"],
                floor_db=floor,
            )
        )
    return out


def print_report(report: dict) -> None:
    s = report["settings"]
    print(
        f"attack strength — {s['batches']} batch(es) per cell, IG {s['ig_iterations']} "
        f"iterations (also rgap/auto fallbacks), DLG {s['dlg_iterations']} L-BFGS steps, "
        f"{s['threads']} thread(s); round R = after R SGD steps (batch "
        f"{s['train']['batch']}, lr {s['train']['lr']}) on the train split; labels "
        + ("told to both tools" if s["labels"] == "known" else "hidden (each attack infers them)")
        + ("" if s["breaching"] else "; breaching not run (no benchmarks/.breaching-env)")
    )
    if s.get("breaching_skipped"):
        print(
            f"breaching not run on {', '.join(s['breaching_skipped'])}: breaching 0.1.2's "
            "total-variation regulariser is written for 3-channel images"
        )
    print(
        "test accuracy: "
        + ", ".join(
            f"{a['dataset']}/{a['model']} r{a['round']} {a['accuracy']:.2f}"
            for a in report["test_accuracy"]
        )
    )
    head = (
        f"| {'data':<6} | {'model':<5} | {'round':>5} | {'B':>2} | {'attack':<12} | "
        f"{'PSNR dB':>7} | {'SSIM':>5} | {'label':>5} | {'wall s':>6} | note |"
    )
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")

    def f(v: float | None, fmt: str) -> str:
        return format(v, fmt) if v is not None else "n/a"

    for r in report["rows"]:
        print(
            f"| {r['dataset']:<6} | {r['model']:<5} | {r['round']:>5} | {r['batch_size']:>2} | "
            f"{r['attack']:<12} | {f(r['psnr'], '7.2f'):>7} | {f(r['ssim'], '5.3f'):>5} | "
            f"{f(r['label_acc'], '5.2f'):>5} | {f(r['wall_s'], '6.1f'):>6} | {r['note']} |"
        )
    if not report["margins"]:
        return
    print("\nbest privaudit attack at ≤ breaching's wall time, PSNR minus breaching's:")
    for m in report["margins"]:
        mark = ("meets" if m["meets"] else "below") if m["target"] else "(not a target cell)"
        how = (
            "none as fast"
            if m["attack"] is None
            else (f"{m['attack']} {m['margin_db']:+.1f} dB at {m['wall_ratio']:.2f}× the time")
        )
        if m["floor_db"] is not None and m["breaching_db"] <= m["floor_db"]:
            how += f" (breaching at or below the data-mean floor, {m['floor_db']:.1f} dB)"
        print(f"  {m['dataset']} {m['model']} round {m['round']} B={m['batch_size']}: {how} {mark}")
    targets = [m for m in report["margins"] if m["target"]]
    met = sum(m["meets"] for m in targets)
    print(f"{met} of {len(targets)} target cells (B ≥ 4 or trained) meet +{MARGIN_DB:g} dB")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = benchmark(args)
    print_report(report)
    if args.json:
        from privaudit.core.files import to_jsonable

        Path(args.json).write_text(json.dumps(to_jsonable(report), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
