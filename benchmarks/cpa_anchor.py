"""The Cocktail Party Attack beside its authors' code: privaudit's ``cpa`` and the official
implementation (github.com/facebookresearch/cocktail_party_attack; Kariyappa et al., ICML
2023) on the identical gradient.

One gradient per batch size B: the batch-mean cross-entropy gradient of privaudit's ``mlp``
(McMahan et al.'s 2NN, 200-200 ReLU — the paper's MLP setting of a fully connected first
layer on the flattened image) at a fresh initialisation, on B of the bundled ``photos``
(3×32×32), without clipping or noise — built by ``benchmarks/disaggregation.py``'s
``observe``. Both attacks separate the first layer's weight gradient (200 × 3072):

- ``privaudit``: ``run_attack("cpa", …)`` with its defaults (whitening, symmetric FastICA,
  sign and scale from the bias, labels; :mod:`attacks.cpa`);
- ``official``: its ``gradient_inversion.CocktailPartyAttack`` unchanged — its whitening, its
  Adam steps on the unmixing matrix (its loss as released: decorrelation and TV; the
  negentropy term is computed and then set to 0 in ``step``), its ``get_rec`` (min–max
  scaling of each source) — at the README's fc2 hyperparameters (``--decor 1.47 --T 12.4
  --tv 3.1 --lr 0.001``, 25,000 steps), in a subprocess with its own ``sys.path``. Only the
  glue is ours: the gradient handed over as its ``grads`` list, a stand-in model carrying
  the two attributes it reads (``attack_index``, ``model_type``), its ``args`` namespace, a
  fresh working folder for the whitening cache it writes, and the step loop of its
  ``attack.py``. Its eval resolves CPA's sign ambiguity with the truth (``fix_sign="best"``:
  x̂ or 1 − x̂, whichever is closer); its images are scored the same way here. privaudit's
  sign comes from the gradient, with no oracle.

Scored alike: the PSNR (data range 1) of every reconstruction against every true image, a
one-to-one assignment maximising the total PSNR (Hungarian, ``scipy``), then per B the
images at ≥ ``--good`` dB, the mean PSNR (capped at 100) and the wall time of the attack
(whitening and separation; privaudit's also its labels).

The official ``src/datasets.py`` imports ``torchtext`` for its text datasets; torchtext
0.18 (its last release) does not load with torch ≥ 2.4, so where it does not import the
worker stands in empty modules for the three names imported (never called by the image
attack). ``--cpa-deps DIR``: a folder of its other requirements where the environment lacks
them (``pip install --no-deps --target DIR …``; docs/attacks.md).

    python benchmarks/cpa_anchor.py --cpa PATH [--cpa-deps DIR] [--batch-sizes 8,64]
        [--steps 25000] [--seed 0] [--threads 1] [--json FILE]
    python benchmarks/cpa_anchor.py [--batch-sizes 8,64]     # privaudit's side only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn

from privaudit.attacks import run_attack
from privaudit.attacks.disaggregation import pick_layer
from privaudit.core.observation import Observation
from privaudit.scenario.data import photos
from privaudit.scenario.models import build_model

sys.path.insert(0, str(Path(__file__).resolve().parent))

from disaggregation import observe  # noqa: E402 - a sibling script, not a package

README = {"decor": 1.47, "T": 12.4, "tv": 3.1, "lr": 1e-3}  # the README's fc2 command
STEPS = 25_000  # its attack.py's default --n_iter
DS = {(3, 32, 32): "cifar10", (3, 64, 64): "tiny_imagenet"}  # its shapes, by dataset key


def gradient(b: int, seed: int) -> tuple[Observation, Tensor]:
    """The non-private gradient of ``mlp`` on B photos (module docstring) and the images."""
    data = photos()
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(data.train_x), generator=gen)[:b]
    x, y = data.train_x[idx], data.train_y[idx]
    model = build_model("mlp", data.input_shape, data.num_classes, seed)
    return observe(model, x, y, data, 0.0, 1.0), x


def psnr_matrix(truth: Tensor, rec: Tensor) -> Tensor:
    """PSNR (dB, data range 1, capped at 100) of every reconstruction against every image."""
    mse = torch.cdist(truth.flatten(1).double(), rec.flatten(1).double()).pow(2)
    mse = mse / truth[0].numel()
    return (-10 * torch.log10(mse.clamp_min(1e-10))).clamp(max=100)


def assigned(truth: Tensor, rec: Tensor, sign_by_truth: bool = False) -> Tensor:
    """Each true image's PSNR after the assignment maximising the total (Hungarian); with
    ``sign_by_truth`` each pair also takes x̂ or 1 − x̂, the closer (the official eval)."""
    p = psnr_matrix(truth, rec)
    if sign_by_truth:
        p = torch.maximum(p, psnr_matrix(truth, 1 - rec))
    rows, cols = linear_sum_assignment(-p.numpy())
    return p[torch.as_tensor(rows), torch.as_tensor(cols)]


def summary(p: Tensor, seconds: float, good: float) -> dict[str, Any]:
    """Images at ≥ ``good`` dB, mean PSNR and the time, as printed."""
    return {
        "recovered": int((p >= good).sum()),
        "psnr": float(p.mean()),
        "seconds": round(seconds, 2),
        "per_image": [round(float(v), 2) for v in p],
    }


def ours(obs: Observation, x: Tensor, seed: int, good: float) -> dict[str, Any]:
    """privaudit's ``cpa`` at its defaults on the observation, scored (module docstring)."""
    t0 = time.perf_counter()
    (rec,) = run_attack("cpa", [obs], seed=seed)
    seconds = time.perf_counter() - t0
    return summary(assigned(x, rec.images.detach().cpu().float()), seconds, good)


# -- the official code, beside ours -----------------------------------------------------------
class _Model(nn.Module):
    """What ``CocktailPartyAttack`` reads of its model: the index of the attacked gradient in
    its list and the model type ("fc": the layer's inputs are the images)."""

    attack_index = 0
    model_type = "fc"


def _stand_in_torchtext() -> None:
    """Empty ``torchtext`` modules for the names its ``datasets.py`` imports for text data,
    where the real one does not load (module docstring)."""
    try:
        import torchtext.data.functional  # noqa: F401
        import torchtext.data.utils  # noqa: F401
        import torchtext.vocab  # noqa: F401

        return
    except (ImportError, OSError):
        for name in [m for m in sys.modules if m == "torchtext" or m.startswith("torchtext.")]:
            del sys.modules[name]

    def unused(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("torchtext is a stand-in here: text datasets are not available")

    names = {
        "torchtext": {},
        "torchtext.data": {},
        "torchtext.data.utils": {"get_tokenizer": unused},
        "torchtext.data.functional": {"to_map_style_dataset": unused},
        "torchtext.vocab": {"GloVe": unused},
    }
    for name, attrs in names.items():
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod


def _worker(path: str, deps: str | None, inp: str, out: str) -> None:
    """In a subprocess: the official ``CocktailPartyAttack`` on the gradient of ``inp``, its
    algorithm unchanged (module docstring), in a fresh working folder (its whitening cache
    goes to ./exp)."""
    for extra in (deps, str(Path(path) / "src")):
        if extra:
            sys.path.insert(0, extra)
    _stand_in_torchtext()
    z = np.load(inp)
    os.chdir(str(z["workdir"]))
    from gradient_inversion import CocktailPartyAttack  # the official modules
    from utils import get_attack_exp_path, get_device

    torch.set_num_threads(int(z["threads"]))
    args = argparse.Namespace(
        use_labels=False, n_iter=int(z["steps"]), batch_size=int(z["b"]), sigma=0.0, C=1.0,
        ds=str(z["ds"]), tv=float(z["tv"]), l1=0.0, nv=0.0, ne=1.0, T=float(z["T"]),
        decor=float(z["decor"]), opt="adam", lr=float(z["lr"]), sch="none", exp_name=None,
        defense="nodef", attack="cp", fi_method="gm", fl_alg="fedsgd", model="fc2",
    )  # fmt: skip
    os.makedirs(get_attack_exp_path(args), exist_ok=True)
    device = get_device()
    grads = [torch.from_numpy(z["weight"]).to(device), torch.from_numpy(z["bias"]).to(device)]
    t0 = time.perf_counter()
    gi = CocktailPartyAttack(_Model(), grads, None, args, 0)
    for _ in range(args.n_iter):  # its attack.py's loop, without the logging
        gi.step()
    rec = gi.get_rec()
    np.savez(out, rec=rec.cpu().numpy(), seconds=time.perf_counter() - t0)


def run_official(
    path: str, deps: str | None, obs: Observation, steps: int, threads: int
) -> tuple[Tensor, float]:
    """The official code on the observation's first-layer gradient, in a subprocess
    (:func:`_worker`) -> (its images (B, 3, H, W) in [0, 1], its seconds)."""
    layer = pick_layer(obs)  # the first linear layer, as privaudit's cpa
    shape = tuple(obs.input_shape)
    if shape not in DS:
        raise SystemExit(f"the official code knows images of {sorted(DS)}, not {shape}")
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.npz")
        np.savez(
            inp, weight=obs.target[layer.weight].detach().float().numpy(),
            bias=obs.target[layer.bias].detach().float().numpy(), b=int(obs.batch_size),
            ds=DS[shape], steps=steps, threads=threads, workdir=tmp, **README,
        )  # fmt: skip
        cmd = [sys.executable, __file__, "--worker", inp, out, "--cpa", path]
        cmd += ["--cpa-deps", deps] if deps else []
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"the official code failed:\n{done.stderr[-3000:]}")
        z = np.load(out)
        return torch.from_numpy(z["rec"]).float(), float(z["seconds"])


def table(rows: list[dict[str, Any]], good: float) -> str:
    """The measured rows as a Markdown table."""
    sides = [s for s in ("official", "privaudit") if s in rows[0]]
    head = ["B"] + [f"{s}: ≥ {good:g} dB | {s}: mean PSNR | {s}: s" for s in sides]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * (1 + 3 * len(sides))]
    for r in rows:
        cells = [str(r["B"])]
        for s in sides:
            v = r[s]
            cells += [f"{v['recovered']} / {r['B']}", f"{v['psnr']:.1f}", f"{v['seconds']:.1f}"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpa", default=None, metavar="PATH", help="a cocktail_party_attack checkout")
    p.add_argument("--cpa-deps", default=None, metavar="DIR", help="its extra packages")
    p.add_argument("--batch-sizes", default="8,64")
    p.add_argument("--steps", type=int, default=STEPS, help="the official code's Adam steps")
    p.add_argument("--good", type=float, default=20.0, help="PSNR (dB) counted as recovered")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (each side)")
    p.add_argument("--json", default=None, help="write the rows to this file")
    p.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker(args.cpa, args.cpa_deps, *args.worker)
        return []
    torch.set_num_threads(args.threads)
    rows = []
    for b in (int(v) for v in args.batch_sizes.split(",")):
        obs, x = gradient(b, args.seed)
        row: dict[str, Any] = {"B": b, "privaudit": ours(obs, x, args.seed, args.good)}
        if args.cpa:
            rec, secs = run_official(args.cpa, args.cpa_deps, obs, args.steps, args.threads)
            row["official"] = summary(assigned(x, rec, sign_by_truth=True), secs, args.good)
        rows.append(row)
        print(f"B = {b}: " + "; ".join(
            f"{s} {v['recovered']}/{b} at ≥ {args.good:g} dB, {v['psnr']:.1f} dB, "
            f"{v['seconds']:.1f} s" for s, v in row.items() if s != "B"
        ), flush=True)  # fmt: skip
    print(
        f"\nmlp on photos, non-private, seed {args.seed}, {args.threads} thread(s)"
        + (f", official: {args.steps} steps at {README}" if args.cpa else "")
    )
    print(table(rows, args.good))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
