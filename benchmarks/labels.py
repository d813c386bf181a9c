"""Label counts at B = 64: how many of a batch's per-class counts each label method gets
exactly right from one gradient message, on MNIST.

For every model (``tanh-cnn``, ``lenet``, ``cnn``), training stage (``--steps``: 0 is the
freshly initialised model; 300 the same model after 300 steps of plain SGD, batch 64,
lr 0.05, on the train split — data the attacked batches are not in) and clip setting
(``--clips``: ``none``, or per-example clipping to norm C with no noise), ``--batches``
batches of B distinct test images are drawn (the same batches for every cell). Each batch
gives the message of the Observation contract: the batch mean of the (clipped) per-example
gradients, exact, labels hidden. Every method of :func:`privaudit.attacks.labels.infer_labels`
(``--methods``) infers the labels and is scored with :mod:`privaudit.eval.labelcounts`:

- ``exact %``: the fraction of (batch, class) pairs whose count is exactly right (the
  goal of issue 33 is ≥ 95 % here);
- ``TV``: the mean total-variation distance between the inferred and true label
  histograms (the fraction of the batch's labels that are misplaced);
- ``all %``: the fraction of batches with every count right;
- ``ms``: wall time per inference.

Beside the methods, the row ``class-oracle`` (unclipped only) is not an attack: it is told
each class's true mean feature (the classifier's input, averaged over the class's
examples) and true count, and counts with ``n_c = B (p̄_c − ∂b_c)`` where
``p̄ = Σ_c n_c softmax(W m_c + b) / B`` — the best any estimator built from class-level
quantities (iLRG, "counts") can do. Where it is below 95 %, posteriors vary too much within
a class (Jensen's gap) for any of them.

MNIST is read from ``--data-root`` (the folder containing ``MNIST/``; by default the
``shared/data`` folder beside the repository); with only the ``t10k`` files it is split
8,000 train / 2,000 test (:func:`privaudit.scenario.data.load_dataset`).

Usage::

    python benchmarks/labels.py [--data-root DIR] [--models tanh-cnn,lenet,cnn]
        [--steps 0,300] [--clips none,1] [--methods counts,ilrg,llg] [--batches 20]
        [--batch-size 64] [--threads 1] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call, grad, vmap

from privaudit.attacks.labels import infer_labels, last_linear, round_counts
from privaudit.core.observation import Observation
from privaudit.eval.labelcounts import count_accuracy, count_tv
from privaudit.scenario.data import ImageData, load_dataset
from privaudit.scenario.models import build_model, normalizes_inputs

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data"
MODEL_SEED = 1000
TRAIN_BATCH = 64
TRAIN_LR = 0.05
ORACLE = "class-oracle"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-root", default=str(DEFAULT_DATA))
    p.add_argument("--models", default="tanh-cnn,lenet,cnn")
    p.add_argument("--steps", default="0,300", help="SGD steps before the attack, per stage")
    p.add_argument("--clips", default="none,1", help="'none' or a per-example clip norm C")
    p.add_argument("--methods", default="counts,ilrg,llg")
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="also write the table here")
    return p.parse_args(argv)


def names(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def clips(text: str) -> list[float | None]:
    return [None if s.lower() == "none" else float(s) for s in names(text)]


# --------------------------------------------------------------------------- setting


def normaliser(model: torch.nn.Module, data: ImageData) -> tuple[tuple, tuple]:
    """The (mean, std) privaudit feeds the model with: identity for the LeNet."""
    c = data.input_shape[0]
    if not normalizes_inputs(model):
        return (0.0,) * c, (1.0,) * c
    return tuple(data.mean), tuple(data.std)


def trained(name: str, data: ImageData, steps: int, seed: int) -> tuple[torch.nn.Module, float]:
    """Model ``name`` after ``steps`` plain-SGD steps on the train split; its test accuracy
    (on the first 1,000 test images)."""
    model = build_model(name, data.input_shape, data.num_classes, MODEL_SEED + seed)
    mean, std = (torch.tensor(v).reshape(1, -1, 1, 1) for v in normaliser(model, data))
    if steps:
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=TRAIN_LR)
        gen = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            idx = torch.randint(0, len(data.train_x), (TRAIN_BATCH,), generator=gen)
            loss = F.cross_entropy(model((data.train_x[idx] - mean) / std), data.train_y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
    with torch.no_grad():
        hits = model((data.test_x[:1000] - mean) / std).argmax(1) == data.test_y[:1000]
    return model, float(hits.float().mean())


def batches(data: ImageData, b: int, count: int, seed: int) -> list[tuple[Tensor, Tensor]]:
    """``count`` batches of ``b`` distinct test images (the same for every cell)."""
    out = []
    for j in range(count):
        gen = torch.Generator().manual_seed(seed * 7919 + 104729 * b + j)
        idx = torch.randperm(len(data.test_x), generator=gen)[:b]
        out.append((data.test_x[idx].clone(), data.test_y[idx].clone()))
    return out


def observation(
    model: torch.nn.Module, data: ImageData, x: Tensor, y: Tensor, clip: float | None
) -> Observation:
    """The batch mean of the per-example gradients (each clipped to ``clip`` when given),
    exact, scale 1, labels hidden."""
    mean, std = normaliser(model, data)
    m = torch.tensor(mean).reshape(-1, 1, 1)
    s = torch.tensor(std).reshape(-1, 1, 1)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p: dict, xb: Tensor, yb: Tensor) -> Tensor:
        return F.cross_entropy(functional_call(model, p, ((xb - m) / s,)), yb)

    if clip is None:
        g = grad(loss)(params, x, y)
    else:
        one = grad(lambda p, xi, yi: loss(p, xi[None], yi[None]))
        per = vmap(one, in_dims=(None, 0, 0))(params, x, y)
        norm = sum(v.flatten(1).square().sum(1) for v in per.values()).sqrt()
        f = (clip / norm).clamp(max=1.0)
        g = {k: (v * f.reshape(-1, *[1] * (v.dim() - 1))).mean(0) for k, v in per.items()}
    return Observation(
        model=model,
        params=params,
        target={k: v.detach() for k, v in g.items()},
        batch_size=len(y),
        input_shape=tuple(data.input_shape),
        num_classes=data.num_classes,
        clip=clip,
        mean=mean,
        std=std,
    )


def class_oracle(obs: Observation, x: Tensor, y: Tensor) -> Tensor:
    """Labels counted from the true class-mean features and counts (module docstring)."""
    w_name, b_name = last_linear(obs)
    assert b_name is not None
    module = w_name.rsplit(".", 1)[0] if "." in w_name else ""
    seen: list[Tensor] = []
    hook = obs.model.get_submodule(module).register_forward_pre_hook(
        lambda _m, a: seen.append(a[0].detach())
    )
    m = torch.tensor(obs.mean).reshape(-1, 1, 1)
    s = torch.tensor(obs.std).reshape(-1, 1, 1)
    try:
        with torch.no_grad():
            obs.model((x - m) / s)
    finally:
        hook.remove()
    h = seen[-1].flatten(1).double()
    weight, bias = obs.params[w_name].double(), obs.params[b_name].double()
    n = torch.bincount(y, minlength=obs.num_classes).double()
    present = n > 0
    means = torch.zeros(obs.num_classes, h.shape[1], dtype=torch.float64)
    means.index_add_(0, y, h)
    means[present] /= n[present, None]
    q = torch.softmax(means @ weight.T + bias, dim=-1)
    p_bar = (n[:, None] * q).sum(0) / len(y)
    est = len(y) * (p_bar - obs.target[b_name].double())
    r = round_counts(est, len(y))
    return torch.repeat_interleave(torch.arange(len(r)), r)


# --------------------------------------------------------------------------- benchmark


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the t10k-only split is announced below instead
        data = load_dataset("mnist", args.data_root)
    test = batches(data, args.batch_size, args.batches, args.seed)
    rows = []
    for name in names(args.models):
        for steps in [int(s) for s in names(args.steps)]:
            model, acc = trained(name, data, steps, args.seed)
            for clip in clips(args.clips):
                methods = names(args.methods) + ([ORACLE] if clip is None else [])
                cells: dict[str, dict[str, list[float]]] = {
                    k: {"exact": [], "tv": [], "all": [], "wall": []} for k in methods
                }
                for x, y in test:
                    obs = observation(model, data, x, y, clip)
                    for method in methods:
                        t0 = time.perf_counter()
                        if method == ORACLE:
                            pred = class_oracle(obs, x, y)
                        else:
                            pred = infer_labels(obs, method)
                        wall = time.perf_counter() - t0
                        acc_c = count_accuracy(pred, y, data.num_classes)
                        cell = cells[method]
                        cell["exact"].append(acc_c)
                        cell["tv"].append(count_tv(pred, y, data.num_classes))
                        cell["all"].append(float(acc_c == 1.0))
                        cell["wall"].append(wall)
                for method, cell in cells.items():
                    mean = {k: sum(v) / len(v) for k, v in cell.items()}
                    rows.append(
                        dict(
                            model=name,
                            steps=steps,
                            test_acc=acc,
                            clip=clip,
                            method=method,
                            exact=mean["exact"],
                            tv=mean["tv"],
                            all=mean["all"],
                            ms=1000 * mean["wall"],
                        )
                    )
                print_rows(rows[-len(cells) :], header=len(rows) == len(cells))
    setting = dict(
        dataset=f"mnist ({len(data.train_x)} train / {len(data.test_x)} test)",
        batch_size=args.batch_size,
        batches=args.batches,
        train=f"plain SGD, batch {TRAIN_BATCH}, lr {TRAIN_LR}",
        threads=torch.get_num_threads(),
    )
    return dict(setting=setting, rows=rows)


def print_rows(rows: list[dict], header: bool) -> None:
    if header:
        print(
            f"{'model':9} {'steps':>5} {'test acc':>8} {'clip':>5} {'method':13} "
            f"{'exact %':>7} {'TV':>6} {'all %':>6} {'ms':>6}"
        )
    for r in rows:
        clip = "none" if r["clip"] is None else f"{r['clip']:g}"
        print(
            f"{r['model']:9} {r['steps']:5d} {r['test_acc']:8.3f} {clip:>5} {r['method']:13} "
            f"{100 * r['exact']:7.1f} {r['tv']:6.3f} {100 * r['all']:6.1f} {r['ms']:6.0f}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    report = benchmark(args)
    s = report["setting"]
    print(
        f"# {s['dataset']}, B = {s['batch_size']}, {s['batches']} batches per cell, "
        f"training: {s['train']}, {s['threads']} thread(s), "
        f"{time.perf_counter() - t0:.0f} s"
    )
    if args.json:
        from privaudit.core.files import to_jsonable

        Path(args.json).write_text(json.dumps(to_jsonable(report), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
