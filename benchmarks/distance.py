"""Privacy against graph distance (issue 35): the audit's ε lower bound, the bounds it is held
to, and the gossip attack's PSNR, for victims d = 1, 2, 3, … hops from one attacker.

For each defense setting — dsgd (ε = ∞), dp-dpsgd and muffliato (``-p enforce=true``, a
formal guarantee) at ε ∈ {1, 8} — and each topology, one run (lenet on photos, batches of
B = 4, ``--agents`` agents, 1 + (largest distance) + 1 rounds so the span and the gossip
algebra have their rounds), then :func:`privaudit.api.distance.distance_sweep` from agent 0:
a white-box audit of a canary in the victim's round-1 batch (``--trials`` trials per point,
Clopper–Pearson at 95 %; past the neighbourhood, on everything agent 0 receives over the
fewest rounds that carry the canary to it, scored by the whitened statistic over everything
agent 0 holds), the local-DP bound of the victim's releases over those rounds, Muffliato's
pairwise network-DP bound towards agent 0 from the exact view of what it holds and, beside
it, the number the paper's Theorem 1 gives (Cyffers et al. 2022), and IG's PSNR on the
victim's round-1 batch (``--iterations`` iterations).

Prints one markdown table; ``--figures DIR`` writes one figure per defense (ε against d:
bounds as lines, audits as markers; PSNR against d). Default: the ring of 8 and 300 trials
per point, about 10 minutes on 2 CPU cores.

    python benchmarks/distance.py [--topologies ring,torus,exponential,erdos-renyi]
        [--defenses dsgd,dp-dpsgd,muffliato] [--trials 300] [--iterations 200]
        [--figures DIR --prefix NAME-] [--json FILE] [--out DIR] [--from-json FILE]

Each setting's points are saved in ``--out`` (default ``privaudit-out/benchmarks/distance``,
its run beside them) as they finish; a rerun into the same folder computes only the settings
not there yet (``benchmarks/resume.py``). ``--json`` is strict JSON (ε = ∞ as "inf").
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from resume import Pieces, add_out  # noqa: E402 - a sibling script, not a package

from privaudit.api.distance import distance_sweep, victims_by_distance
from privaudit.core.config import RunConfig
from privaudit.core.files import dumps_strict, loads_strict
from privaudit.eval.style import save, series_style
from privaudit.scenario.topology import build_topology
from privaudit.sim.run import Run

SETTINGS = {  # defense → (target, [ε, …], params)
    "dsgd": ("dsgd-half-model", [math.inf], {}),
    "dp-dpsgd": ("dp-dpsgd-half-model", [1.0, 8.0], {}),
    "muffliato": ("muffliato-model", [1.0, 8.0], {"enforce": True}),
}
AGENTS = {"ring": 8, "torus": 12, "exponential": 8, "erdos-renyi": 8}
THEOREM = "pairwise, paper's theorem"  # the audit's key for the paper's pairwise number


def settings(a: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (topology, defense, ε) of the sweep: one run and its distance sweep each, the
    identity of a piece of work (``benchmarks/resume.py``)."""
    out = []
    for topo in a.topologies:
        n = a.agents or AGENTS.get(topo, 8)
        for defense in a.defenses:
            for eps in SETTINGS[defense][1]:
                out.append(dict(bench="distance", topology=topo, agents=n, defense=defense,
                                epsilon=eps, trials=a.trials, iterations=a.iterations))  # fmt: skip
    return out


def measure(s: dict[str, Any], work: Path) -> dict[str, Any]:
    """The distance sweep of one setting ``s`` from agent 0, its run in ``work``."""
    topo, n, defense, eps = s["topology"], s["agents"], s["defense"], s["epsilon"]
    target, _, params = SETTINGS[defense]
    far = max(victims_by_distance(build_topology(topo, n), 0))
    cfg = RunConfig(
        defense=defense,
        agents=n,
        topology=topo,
        rounds=far + 2,
        batch_size=4,
        epsilon=None if math.isinf(eps) else eps,
        checkpoint_every=far + 2,
        params=params,
    )
    run = Run.create(cfg, work / "run")
    t0 = time.perf_counter()
    points = distance_sweep(
        run,
        target,
        0,
        trials=s["trials"],
        attack=None if s["iterations"] == 0 else "ig",
        attack_options={"iterations": s["iterations"], "restarts": 1},
    )
    rows = [{"topology": topo, "defense": defense, "epsilon": eps} | dataclasses.asdict(p)
            for p in points]  # fmt: skip
    return {"rows": rows, "seconds": time.perf_counter() - t0}


def sweep(a: argparse.Namespace) -> list[dict[str, Any]]:
    """Every setting's rows, each setting saved in ``--out`` as it finishes and read back
    from there on a rerun (its run kept: a killed one goes on from its last checkpoint)."""
    todo = settings(a)
    pieces = Pieces(a.out, todo, [__file__])
    rows = []
    for s in todo:
        got = pieces.run(s, lambda work, s=s: measure(s, work), keep=True)
        rows += got["rows"]
        print(
            f"  {s['topology']} {s['defense']} ε={s['epsilon']:g}: {len(got['rows'])} "
            f"distances in {got['seconds']:.0f} s",
            flush=True,
        )
    return rows


def fmt(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "—"
    return "∞" if math.isinf(x) else f"{x:.{digits}g}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| topology | defense | ε | d | victim | span | ε_lb | local-DP bound | pairwise bound "
        "| paper's Theorem 1 | verdict (local / pairwise / Theorem 1) | PSNR (dB) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        up = r["upper"]
        v = r["verdicts"]
        verdict = " / ".join(v[k] for k in ("accountant", "pairwise", THEOREM) if k in v)
        note = "not identifiable" if "identifiable" in (r["psnr_note"] or "") else "empty batch"
        psnr = fmt(r["psnr"], 3) if r["psnr"] is not None else f"— ({note})"
        lines.append(
            f"| {r['topology']} | {r['defense']} | {fmt(r['epsilon'])} | {r['distance']} "
            f"| {r['victim']} | {r['span']} | {r['epsilon_lo']:.2f} | {fmt(up['accountant'])} "
            f"| {fmt(up.get('pairwise'))} | {fmt(up.get(THEOREM))} | {verdict} | {psnr} |"
        )
    return "\n".join(lines)


def figures(rows: list[dict[str, Any]], folder: Path, prefix: str = "") -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for defense in dict.fromkeys(r["defense"] for r in rows):
        mine = [r for r in rows if r["defense"] == defense]
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
        series = series_style(list(dict.fromkeys((r["topology"], r["epsilon"]) for r in mine)))
        for (topo, eps), (color, _) in series.items():
            pts = [r for r in mine if (r["topology"], r["epsilon"]) == (topo, eps)]
            d = [r["distance"] for r in pts]
            label = f"{topo}, ε={fmt(eps)}"
            ax.plot(d, [r["epsilon_lo"] for r in pts], "o", color=color, label=f"audit {label}")
            local = [r["upper"]["accountant"] for r in pts]
            if all(math.isfinite(u) for u in local):
                ax.plot(d, local, "-", color=color, alpha=0.6, label=f"local DP {label}")
            pair = [r["upper"].get("pairwise") for r in pts]
            if all(u is not None and math.isfinite(u) for u in pair):
                ax.plot(d, pair, "--", color=color, label=f"pairwise (exact view) {label}")
            paper = [r["upper"].get(THEOREM) for r in pts]
            if all(u is not None and math.isfinite(u) for u in paper):
                ax.plot(d, paper, ":", color=color, label=f"paper's Theorem 1 {label}")
            psnr = [(r["distance"], r["psnr"]) for r in pts if r["psnr"] is not None]
            if psnr:
                bx.plot(*zip(*psnr, strict=True), "o-", color=color, label=label)
        ax.set(xlabel="graph distance d", ylabel="ε", title=f"{defense}: ε bounds vs audit")
        ax.set_yscale("symlog", linthresh=0.1)
        ax.legend(fontsize=6)
        bx.set(xlabel="graph distance d", ylabel="PSNR (dB)", title=f"{defense}: gossip attack")
        if bx.lines:
            bx.legend(fontsize=6)
        fig.suptitle(f"{defense}: who observes at graph distance d — ε bounds, audit, attack")
        fig.tight_layout()
        paths += save(fig, folder / f"{prefix}distance-{defense}.png")  # 300 dpi PNG + PDF
        plt.close(fig)
    return paths


def load(path: str) -> list[dict[str, Any]]:
    """Rows written by ``--json`` (∞ stored as the string "inf")."""
    rows = loads_strict(Path(path).read_text())
    for r in rows:
        r["epsilon"] = float(r["epsilon"])
        r["upper"] = {k: float(u) for k, u in r["upper"].items()}
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topologies", default="ring", help="comma-separated (default ring)")
    p.add_argument("--defenses", default="dsgd,dp-dpsgd,muffliato")
    p.add_argument("--agents", type=int, default=None, help="default: 8 (12 for the torus)")
    p.add_argument("--trials", type=int, default=300, help="white-box trials per point")
    p.add_argument("--iterations", type=int, default=200, help="IG iterations; 0: no attack")
    p.add_argument("--figures", default=None, help="folder for the figures")
    p.add_argument("--prefix", default="", help="prefix of the figures' file names")
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--markdown", default=None, help="write the table here (benchmarks/figures.py)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--from-json", default=None, help="redraw the table and figures of --json")
    add_out(p, "distance")
    a = p.parse_args(argv)
    a.topologies = a.topologies.split(",")
    a.defenses = a.defenses.split(",")
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    if a.from_json:
        rows = load(a.from_json)
    else:
        rows = sweep(a)
    print(table(rows))
    print(
        f"\n{len(rows)} points, {rows[0]['trials']} trials each, {time.perf_counter() - t0:.0f} s"
    )
    if a.figures:
        for path in figures(rows, Path(a.figures), a.prefix):
            print(f"figure: {path}")
    if a.json:
        Path(a.json).write_text(dumps_strict(rows, indent=1, sort_keys=False))
    if a.markdown:
        Path(a.markdown).write_text(
            table(rows) + f"\n\n{len(rows)} points, {rows[0]['trials']} trials each.\n"
        )


if __name__ == "__main__":
    main()
