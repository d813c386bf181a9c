"""What noise stops batch disaggregation: the fraction of one message's batch the Cocktail
Party Attack recovers, against the noise multiplier σ, with the defenses' own messages at
their calibrated ε on the same axis (the curve a defense is judged by).

The curve: for each σ of ``--sigmas``, ``--batches`` batches of B train images, each observed
as DP-SGD releases it — the batch-mean cross-entropy gradient at a freshly initialised
model, per-example clipped to C = 1 and noised with N(0, (σC/B)²) per coordinate
(``benchmarks/disaggregation.py``'s observation, computed independently of the attacks'
code; σ = 0: the plain gradient). The defenses: for each ``--defended`` target at each ε,
one run of that defense with ``--model`` and B, trained as ``privaudit train`` would (σ
calibrated from ε by the defense's own accounting over the rounds T of its MNIST operating
point for that model and ε, Poisson batches of expected size B), whose round-1 message on
link 0→1 is attacked through ``privaudit.api.pipeline.reconstruct`` — exactly what
``privaudit attack --target TARGET --model M --batch-size B --epsilon E --round 1 --attack
cpa`` does. Its σ on the x axis is the run's noise multiplier, the σ of the defense's σC/B
on its batch mean.

Scored alike: reconstructions matched one-to-one to the true images (Hungarian on PSNR),
the fraction at ≥ 20 dB and ≥ 30 dB ("k of n" over every image of every batch), the mean
PSNR. Written to ``--figures DIR``: ``sigma.md`` (the table) and ``sigma.png|pdf``.

    python benchmarks/disaggregation_noise.py [--model mlp] [--batch-sizes 16,64]
        [--sigmas 0,1e-4,…,1] [--batches 2] [--defended dpdl-cg,dp-dpsgd-half-model]
        [--epsilons 1,8] [--data-root DIR] [--figures DIR] [--threads 1]

MNIST from ``--data-root`` (the folder holding ``MNIST/``) where present, else the bundled
photos; the table names which.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from disaggregation import dataset, matched_psnr, one  # noqa: E402 - a sibling script, not a package

from privaudit.api.pipeline import reconstruct
from privaudit.core.config import RunConfig
from privaudit.eval.style import num, save, series_style, style_axes
from privaudit.scenario.presets import operating_point
from privaudit.sim.run import Run
from privaudit.sim.targets import Target

SIGMAS = "0,1e-4,3e-4,1e-3,3e-3,1e-2,0.1,1"
ATTACK = "cpa"


def counts(x: torch.Tensor, images: torch.Tensor) -> dict[str, Any]:
    """Per-image PSNR of ``images`` matched to the truth ``x`` -> counts at 20 and 30 dB."""
    p = matched_psnr(x, images)[1].clamp(max=100)
    return {"n": len(p), "at20": int((p >= 20).sum()), "at30": int((p >= 30).sum()),
            "psnr_sum": float(p.sum())}  # fmt: skip


def curve_point(data, model: str, b: int, sigma: float, batches: int) -> dict[str, Any]:
    """``batches`` DP-SGD releases at ``sigma`` (:func:`disaggregation.one`), pooled."""
    args = argparse.Namespace(clip=1.0, fi_iterations=200, samples=1 << 17)
    tot = {"n": 0, "at20": 0, "at30": 0, "psnr_sum": 0.0, "wall_s": 0.0}
    for k in range(batches):
        row = one(data, model, b, ATTACK, sigma, k, args)
        if "refused" in row:
            return {"refused": row["refused"]}
        tot["n"] += b
        tot["at20"] += round(row["at20"] * b)
        tot["at30"] += round(row["at30"] * b)
        tot["psnr_sum"] += row["psnr"] * b
        tot["wall_s"] += row["wall_s"]
    return tot


def defended_point(
    data_name: str, root: str | None, model: str, b: int, target: str, eps: float
) -> dict[str, Any]:
    """``target``'s round-1 message at ``eps`` (module docstring), attacked and scored."""
    defense = Target.of(target).defense.name
    point = operating_point("utility", defense, "mnist", eps, model)
    rounds = point.rounds if point is not None else 100  # no point for this model: T = 100
    cfg = RunConfig(defense=defense, model=model, batch_size=b, epsilon=eps, rounds=rounds,
                    dataset=data_name, data_root=root)  # fmt: skip
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        run = Run.create(cfg, Path(work) / "run")
        a = reconstruct(run, target, 1, attack=ATTACK, links=[(0, 1)], lpips=False,
                        progress=False)  # fmt: skip
        (x, _), rec = a.truths[0], a.recons[0]
        said = a.result.to_dict()
        row = counts(x, rec.images.detach().cpu()) if len(x) else {"n": 0}
        row.update(sigma=said["sigma"], noise_std=said["noise_std"][0], rounds=rounds,
                   realised_b=len(x), wall_s=time.perf_counter() - t0)  # fmt: skip
    return row


def frac(r: dict[str, Any], key: str) -> str:
    return f"{r[key]} of {r['n']} ({r[key] / r['n']:.0%})" if r.get("n") else "n/a"


def table(rows: list[dict[str, Any]], data_name: str, model: str, batches: int) -> str:
    """The markdown table of every row: the curve's, then the defenses'."""
    out = [f"`{model}`, {data_name}, {ATTACK}, one message; the curve: {batches} batches per "
           "σ, DP-SGD's release (clip 1, noise σ/B per coordinate); the defenses: their "
           "round-1 message on link 0→1, σ calibrated from ε", "",
           "| B | message | σ | ≥ 20 dB | ≥ 30 dB | mean PSNR dB |",
           "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        what = r.get("label", "DP-SGD release")
        if "refused" in r:
            out.append(f"| {r['B']} | {what} | {num(r['sigma'])} | refused: {r['refused']} | | |")
            continue
        mean = num(r["psnr_sum"] / r["n"]) if r.get("n") else "n/a"
        out.append(f"| {r['B']} | {what} | {num(r['sigma'])} | {frac(r, 'at20')} | "
                   f"{frac(r, 'at30')} | {mean} |")  # fmt: skip
    return "\n".join(out) + "\n"


def figure(rows: list[dict[str, Any]], path: Path, model: str, data_name: str) -> list[Path]:
    """Fraction at ≥ 20 dB against σ (log axis; σ = 0 drawn at the left edge), one line per
    B, the defenses' messages as labelled markers."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.add_subplot(1, 1, 1)
    style_axes(ax)
    curve = [r for r in rows if "label" not in r and r.get("n")]
    positive = [r["sigma"] for r in rows if r["sigma"] > 0]
    left = min(positive) / 10 if positive else 1e-6
    keys = [("B", r["B"]) for r in curve] + [(r["label"], r["B"]) for r in rows if "label" in r]
    style = series_style(keys)
    for b in dict.fromkeys(r["B"] for r in curve):
        pts = sorted((max(r["sigma"], left), r["at20"] / r["n"]) for r in curve if r["B"] == b)
        color, marker = style[("B", b)]
        ax.plot(*zip(*pts, strict=True), "-", marker=marker, color=color, ms=4, lw=1,
                label=f"DP-SGD release, B = {b}")  # fmt: skip
    for r in (r for r in rows if "label" in r and r.get("n")):
        color, marker = style[(r["label"], r["B"])]
        ax.plot([r["sigma"]], [r["at20"] / r["n"]], marker, color=color, ms=7, mec="black",
                mew=0.5, ls="none", label=f"{r['label']}, B = {r['B']}")  # fmt: skip
    ax.set_xscale("log")
    ax.axvline(left * 3, color="grey", lw=0.5, ls=":")
    ax.text(left, 1.02, "σ = 0", fontsize=6, ha="center")
    ax.set_xlabel("noise multiplier σ (noise σC/B per coordinate, C = 1)", fontsize=8)
    ax.set_ylabel("fraction of the batch at ≥ 20 dB", fontsize=8)
    ax.set_ylim(-0.03, 1.08)
    ax.set_title(f"link threat · {ATTACK} on one message · {model}, {data_name}", fontsize=9)
    ax.legend(fontsize=6, frameon=False, loc="center right")
    fig.tight_layout()
    return save(fig, path)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--batch-sizes", default="16,64")
    ap.add_argument("--sigmas", default=SIGMAS)
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--defended", default="dpdl-cg,dp-dpsgd-half-model")
    ap.add_argument("--epsilons", default="1,8")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--figures", default=None, help="folder for sigma.md and sigma.png|pdf")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    data = dataset(a.data_root)
    root = a.data_root if data.name == "mnist" else None
    rows: list[dict[str, Any]] = []
    for b in (int(v) for v in a.batch_sizes.split(",")):
        for sigma in (float(v) for v in a.sigmas.split(",")):
            r = {"B": b, "sigma": sigma, **curve_point(data, a.model, b, sigma, a.batches)}
            rows.append(r)
            print(table([r], data.name, a.model, a.batches).splitlines()[-1], flush=True)
        for target in filter(None, a.defended.split(",")):
            for eps in (float(v) for v in a.epsilons.split(",")):
                r = defended_point(data.name, root, a.model, b, target, eps)
                r.update(B=b, label=f"{target} ε = {eps:g}, T = {r['rounds']}")
                rows.append(r)
                print(table([r], data.name, a.model, a.batches).splitlines()[-1], flush=True)
    text = table(rows, data.name, a.model, a.batches)
    print(text)
    if a.figures:
        folder = Path(a.figures)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "sigma.md").write_text(text)
        for p in figure(rows, folder / "sigma.png", a.model, data.name):
            print(f"wrote {p}")
    return rows


if __name__ == "__main__":
    main()
