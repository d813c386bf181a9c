"""Privacy–utility frontiers: accuracy at the operating points against ε and against the attack.

A comparison sweep at the ``utility`` preset (:mod:`privaudit.scenario.presets`) trains every
defense at its operating point for each ε and attacks the message of its last round. This
module adds the two references every frontier is read against, and draws and tabulates the
frontier:

- **centralised DP-SGD** (opacus, :func:`privaudit.experiments.centralised.reference_for`) on the
  pooled training data at the same ε, δ and accountant — the best a decentralised algorithm
  at that ε could hope for — and the same run without clip and noise (centralised SGD);
- **non-private D-PSGD** (``dsgd``) at its own operating point: the decentralised ceiling.

Both centralised references train at :data:`REFERENCE_DEFENSE`'s operating point for that ε
(its model, expected batch size, steps, lr and clip). Results are cached under
``OUT/references/`` like the sweep's runs, so a resumed or widened sweep reuses them (checked
as the sweep's cache: :mod:`privaudit.api.cache`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from privaudit.api import cache
from privaudit.api.sweeps import (
    Sweep,
    adopt_run,
    configure,
    plan,
    read_accuracy,
    run_dir,
    write_accuracy,
)
from privaudit.core.config import RunConfig
from privaudit.core.files import atomic_write, digest
from privaudit.eval.report import (
    RECOVERED_DB,
    eps_text,
    save_png_pdf,
    style_axes,
    summarize,
    target_style,
)
from privaudit.experiments.centralised import reference_for
from privaudit.sim.run import Run
from privaudit.sim.targets import Target

__all__ = [
    "REFERENCE_DEFENSE",
    "Reference",
    "frontier_figure",
    "frontier_markdown",
    "accuracy_markdown",
    "references",
    "setting_text",
    "write_frontier",
]

REFERENCE_DEFENSE = "dp-dpsgd"  # whose operating point the centralised references train at
CEILING_DEFENSE = "dsgd"  # the non-private decentralised reference


@dataclasses.dataclass(frozen=True)
class Reference:
    """One reference point: ``name``, the ε it was asked for (∞: non-private), the ε it
    spent, its test accuracy and the settings it trained at."""

    name: str
    epsilon_requested: float
    epsilon: float
    accuracy: float
    setting: str


def setting_text(cfg: RunConfig) -> str:
    """A run's operating point in words: model, B, T and its numeric defense parameters."""
    params = "".join(f", {k} {v:g}" for k, v in cfg.params.items() if isinstance(v, float | int))
    return f"{cfg.model}, B = {cfg.batch_size}, T = {cfg.rounds}{params}"


def references(sweep: Sweep, out: str | Path, progress: bool = True) -> list[Reference]:
    """The references of a utility-preset ``sweep`` at each of its ε (∞ allowed), for its
    first seed: centralised DP-SGD / SGD at :data:`REFERENCE_DEFENSE`'s operating point
    (cached under ``OUT/references``), and the non-private D-PSGD run, trained (or reused)
    under ``OUT/runs`` like the sweep's own runs."""
    out = Path(out)
    seed = sweep.seeds[0]
    refs: list[Reference] = []
    for eps in sorted(set(sweep.epsilons)):
        private = math.isfinite(eps)
        cfg = configure(sweep, REFERENCE_DEFENSE, eps, seed)
        name = "centralised DP-SGD (opacus)" if private else "centralised SGD, non-private"
        tag = f"{'dpsgd' if private else 'sgd'}-eps{eps:g}-{digest(cfg.identity())}"
        path = out / "references" / f"{tag}.json"
        key = {"reference": cfg.identity(), "epsilon": eps}
        res = cache.read_value(path, key)
        if res is None:
            if progress:
                print(f"reference: {name} at ε = {eps:g} ({setting_text(cfg)})", flush=True)
            res = dataclasses.asdict(reference_for(cfg, eps if private else None))
            cache.write_value(path, key, res)
        refs.append(Reference(name, eps, res["epsilon"], res["accuracy"], setting_text(cfg)))
    ceiling = configure(sweep, CEILING_DEFENSE, None, seed)
    rdir = run_dir(out, ceiling)
    acc = read_accuracy(rdir, ceiling)
    if acc is None:
        adopt_run(ceiling, rdir)
        run = Run.create(ceiling, rdir)
        acc = run.test_accuracy(run.train(progress=progress))
        write_accuracy(rdir, ceiling, acc)
    refs.append(Reference("D-PSGD, non-private", math.inf, math.inf, acc, setting_text(ceiling)))
    return refs


def write_frontier(
    sweep: Sweep, rows: Sequence[dict[str, Any]], out: str | Path, progress: bool = True
) -> tuple[str, list[Path]]:
    """The references, then ``frontier.md`` and ``frontier.png``/``.pdf`` in ``out``, for
    the ``rows`` :func:`privaudit.api.sweeps.execute` returned for ``sweep``. Returns the
    table and the files."""
    out = Path(out)
    refs = references(sweep, out, progress)
    summary = summarize(rows)
    runs, _ = plan(sweep)
    configs = {(d, eps): cfg for (d, eps, seed), cfg in runs.items() if seed == sweep.seeds[0]}
    table = frontier_markdown(summary, refs, configs)
    pivot = accuracy_markdown(summary, refs)
    atomic_write(out / "frontier.md", lambda tmp: Path(tmp).write_text(table))
    atomic_write(out / "accuracy.md", lambda tmp: Path(tmp).write_text(pivot))
    figure = frontier_figure(summary, refs, out / "frontier")
    return table, [out / "frontier.md", out / "accuracy.md", *figure]


def _value(s: dict[str, Any], key: str) -> float | None:
    """A summary row's number for a panel: ``recovered_fraction`` is recovered / images."""
    if key == "recovered_fraction":
        return s["recovered"] / s["images"] if s["images"] else None
    return s.get(key)


def accuracy_markdown(summary: Sequence[dict[str, Any]], refs: Sequence[Reference]) -> str:
    """Test accuracy of the average model, one row per target and reference, one column
    per requested ε — the frontier at a glance. "(ε ∞)" marks a run calibrated to that ε
    by its paper's accounting whose accounted ε is ∞ (its guarantee's premise is assumed,
    not enforced)."""
    asked = sorted(
        {math.inf if s["epsilon_requested"] is None else s["epsilon_requested"] for s in summary}
        | {r.epsilon_requested for r in refs}
    )
    head = ["target", *(f"ε = {eps_text(e)}" for e in asked)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(name: str, points: dict[float, str]) -> str:
        return "| " + " | ".join([name, *(points.get(e, "") for e in asked)]) + " |"

    for t in dict.fromkeys(s["target"] for s in summary):
        points = {}
        for s in summary:
            if s["target"] != t or s["test_acc"] is None:
                continue
            e = math.inf if s["epsilon_requested"] is None else s["epsilon_requested"]
            unbounded = math.isfinite(e) and s["epsilon"] is None
            points[e] = f"{s['test_acc']:.3f}" + (" (ε ∞)" if unbounded else "")
        lines.append(row(f"`{t}`", points))
    for r in refs:
        lines.append(row(r.name, {r.epsilon_requested: f"{r.accuracy:.3f}"}))
    return "\n".join(lines) + "\n"


MEMBERSHIP = ("mia_tpr", "label_counts_exact")  # the frontier's membership columns


def _pct(v: float | None) -> str:
    """A rate in per cent; "—" where there is none (a TPR at 1 % FPR from fewer than 100
    non-members is not measured)."""
    return "—" if v is None else f"{100 * v:.1f} %"


def _x(eps: float | None, top: float) -> float:
    """Where ε sits on a log axis whose last tick, ``top``, stands for ∞."""
    return top if eps is None or math.isinf(eps) else eps


def frontier_figure(
    summary: Sequence[dict[str, Any]], refs: Sequence[Reference], path: Path
) -> list[Path]:
    """Three panels — four when the sweep ran membership inference — one colour per target,
    test accuracy on the y axis against (a) the accounted ε of the attacked message (∞ at the
    right edge: no formal guarantee), (b) the white-box audit's ε lower bound for one
    release, (c) the attack's PSNR on the same run's message, (d) the message-level
    membership inference's TPR at 1 % FPR on the same run's messages. The references are
    drawn in every panel where they have an x: centralised DP-SGD as a dashed line over ε,
    the non-private ceilings as horizontal lines."""
    from matplotlib.figure import Figure

    targets = list(dict.fromkeys(s["target"] for s in summary))
    style = target_style(targets)
    finite = [s["epsilon"] for s in summary if s["epsilon"] is not None]
    finite += [r.epsilon for r in refs]
    finite = [e for e in finite if math.isfinite(e)]
    top = 4 * max(finite) if finite else 10.0
    panels = [
        ("epsilon", "accounted ε of the message (worst agent, whole run)"),
        ("audit_epsilon_lo", "audited ε lower bound, one release"),
        ("psnr", "reconstruction PSNR (dB), last round"),
        ("recovered_fraction", f"fraction of the batch recovered at ≥ {RECOVERED_DB:g} dB"),
    ]
    if any(s.get("mia_tpr") is not None for s in summary):
        panels.append(("mia_tpr", "membership: TPR at 1 % FPR (messages)"))
    fig = Figure(figsize=(3.2 * len(panels), 3.0), layout="constrained")
    axes = fig.subplots(1, len(panels), sharey=True)
    for ax, (key, label) in zip(axes, panels, strict=True):
        for t in targets:
            color, marker = style[t]
            pts = [s for s in summary if s["target"] == t and s["test_acc"] is not None]
            if key == "epsilon":
                xy = [(_x(s["epsilon"], top), s["test_acc"]) for s in pts]
            else:
                xy = [(_value(s, key), s["test_acc"]) for s in pts if _value(s, key) is not None]
            xy.sort()
            if xy:  # a line over ε; over the audit and the attack, whose x need not grow
                xs, ys = zip(*xy, strict=True)  # with ε, points only
                fmt = ("-" if key == "epsilon" else "") + marker
                ax.plot(xs, ys, fmt, color=color, mec="black", mew=0.4, ms=4, lw=0.8)
        dpsgd = sorted((r.epsilon, r.accuracy) for r in refs if math.isfinite(r.epsilon_requested))
        if key == "epsilon" and dpsgd:
            xs, ys = zip(*dpsgd, strict=True)
            ax.plot(xs, ys, "--x", color="black", lw=1.0, ms=4, label="centralised DP-SGD (opacus)")
        for r, ls in zip(
            [r for r in refs if not math.isfinite(r.epsilon_requested)], (":", "-."), strict=False
        ):
            ax.axhline(r.accuracy, color="0.35", lw=0.9, ls=ls, label=r.name)
        if key == "epsilon":
            ax.set_xscale("log")
            asked = {s["epsilon_requested"] for s in summary} | {r.epsilon_requested for r in refs}
            ticks = sorted(e for e in asked if e is not None and math.isfinite(e)) + [top]
            ax.set_xticks(ticks, [f"{e:g}" for e in ticks[:-1]] + ["∞"])
            ax.minorticks_off()
        ax.set_xlabel(label, fontsize=7.5)
        style_axes(ax)
    axes[0].set_ylabel("test accuracy (average model)", fontsize=7.5)
    for t in targets:
        color, marker = style[t]
        axes[-1].plot([], [], "-" + marker, color=color, mec="black", mew=0.4, ms=4, label=t)
    axes[0].legend(fontsize=6, frameon=False, loc="lower right")
    axes[-1].legend(fontsize=6, frameon=False, loc="best")
    threats = "/".join(dict.fromkeys(s["threat"] for s in summary if s.get("threat")))
    fig.suptitle(
        f"privacy–utility frontier · {threats} threat · test accuracy against ε, audit, attack",
        fontsize=7.5,
    )
    return save_png_pdf(fig, path)


def frontier_markdown(
    summary: Sequence[dict[str, Any]],
    refs: Sequence[Reference],
    configs: Mapping[tuple[str, float | None], RunConfig],
) -> str:
    """The frontier as one Markdown table: per target and requested ε, the accounted ε, the
    audited lower bound, test accuracy, the attack's PSNR/SSIM and how many of the attacked
    images it recovered at ≥ :data:`~privaudit.eval.report.RECOVERED_DB` dB, the membership
    inference's TPR at 1 % FPR ("—" where its non-members cannot resolve it) and label
    counts recovered (where the sweep ran it) and the operating point (``configs``: the
    run of each (defense, requested ε)); the references below."""
    member = any(s.get("mia_auc") is not None for s in summary)  # membership ran
    head = [
        "target",
        "ε asked",
        "ε accounted",
        "audited ε ≥ (one release)",
        "test acc",
        "PSNR dB",
        "SSIM",
        f"≥ {RECOVERED_DB:g} dB",
        *(["MIA TPR @ 1 % FPR", "label counts exact"] if member else []),
        "operating point",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summary:
        lo = s.get("audit_epsilon_lo")
        lines.append(
            "| "
            + " | ".join(
                [
                    f"`{s['target']}`",
                    eps_text(s["epsilon_requested"]),
                    eps_text(s["epsilon"]),
                    "" if lo is None else f"{lo:.3g}",
                    f"{s['test_acc']:.3f}",
                    "—" if s["psnr"] is None else f"{s['psnr']:.1f}",
                    "—" if s["ssim"] is None else f"{s['ssim']:.3f}",
                    f"{s['recovered']} of {s['images']}" if s["images"] else "—",
                    *([_pct(s.get(k)) for k in MEMBERSHIP] if member else []),
                    setting_text(
                        configs[(Target.parse(s["target"]).defense.name, s["epsilon_requested"])]
                    ),
                ]
            )
            + " |"
        )
    for r in refs:
        row = [r.name, eps_text(r.epsilon_requested), eps_text(r.epsilon), "", f"{r.accuracy:.3f}"]
        row += ["", "", ""] + (["", ""] if member else [])
        lines.append("| " + " | ".join(row + [r.setting]) + " |")
    return "\n".join(lines) + "\n"
