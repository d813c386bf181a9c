"""``privaudit reproduce``: a paper's experiment beside its published numbers."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from privaudit.cli.options import (
    add_attack_option,
    add_overwrite,
    check_sweep_attack,
    comma_list,
    mark_out,
    nothing_left_on_refusal,
    sweep_base,
    training_options,
)
from privaudit.cli.vocabulary import Vocabulary
from privaudit.core import limits
from privaudit.core.errors import PrivauditError, unknown


def add_parser(sub: Any, words: Vocabulary) -> None:
    """Register ``reproduce`` on the CLI's subparsers."""
    r = sub.add_parser(
        "reproduce",
        help="a paper's experiment beside its published numbers (dpdl-table3)",
        description=(
            "dpdl-table3: the DPDL paper's Table III (MNIST; ring/bipartite/complete × N; "
            "ND-CG, ND-MM, DPDL-CG, DPDL-MM; MSE/PSNR/SSIM) on real MNIST, printed beside the "
            "paper's numbers. Scale --agents and --rounds down for a CPU run."
        ),
        conflict_handler="resolve",
    )
    r.add_argument("experiment", help="dpdl-table3")
    r.add_argument("--out", default=None, help="output folder (default privaudit-out/EXP)")
    add_overwrite(r)
    r.add_argument(
        "--scenarios",
        type=comma_list(str, "--scenarios"),
        default=["ND-CG", "ND-MM", "DPDL-CG", "DPDL-MM"],
        help="comma-separated (default ND-CG,ND-MM,DPDL-CG,DPDL-MM)",
    )
    r.add_argument("--victims", type=int, default=2, help="attacked agents per cell (2)")
    r.add_argument("--iterations", type=int, default=1000, help="attack iterations (1000)")
    add_attack_option(r)
    training_options(r, None)
    r.add_argument(
        "--topologies",
        "--topology",
        dest="topologies",
        type=comma_list(str, "--topologies"),
        default=["ring", "bipartite", "complete"],
        help="comma-separated (default ring,bipartite,complete)",
    )
    r.add_argument(
        "--agents",
        type=comma_list(int, "--agents"),
        default=[10, 20, 30],
        help="N, comma-separated (default 10,20,30, the paper's)",
    )
    r.add_argument(
        "--rounds",
        type=int,
        default=50,
        help="the attacked round (the paper's is unknown; default 50)",
    )
    r.add_argument("--dataset", default="mnist", help="mnist (default; photos for a dry run)")
    r.add_argument(
        "--seeds",
        "--seed",
        dest="seeds",
        default=[0],
        type=comma_list(int, "--seeds"),
        help="run seeds, comma-separated (default 0): each seeds its runs (as train's --seed does) "
        "and their cells' attacks",
    )
    r.set_defaults(func=cmd_reproduce)


def _dpdl_table3(a: argparse.Namespace) -> int:
    from privaudit.api.reproduce import dpdl_table3, format_table3, markdown_table3, table3_rows
    from privaudit.core.files import to_jsonable, write_json

    out = Path(a.out)
    if not a.agents:
        raise PrivauditError("--agents is empty; give at least one N, e.g. 10,20,30")
    for n in a.agents:
        limits.check_int("--agents", n, 2, limits.MAX_AGENTS)
    limits.check_int("--rounds", a.rounds, 1, limits.MAX_ROUNDS, "the attacked round")
    if not a.seeds:
        raise PrivauditError("--seeds is empty; give at least one seed")
    for seed in a.seeds:
        limits.check_seed("--seeds", seed)
    t0 = time.perf_counter()
    base = sweep_base(a, agents=max(a.agents))
    with nothing_left_on_refusal(out):
        mark_out(out, "reproduce")
        rows = dpdl_table3(
            out,
            base,
            a.topologies,
            a.agents,
            a.rounds,
            a.seeds,
            victims=a.victims,
            iterations=a.iterations,
            attack_options=dict(a.attack_option),
            progress=not a.no_progress,
            scenarios=[sc.upper() for sc in a.scenarios],
        )
    table = table3_rows(rows)
    first = next((r for r in rows if r["sigma"]), rows[0])  # a DPDL row: its σ
    setting = (
        f"ours: Poisson batches of {first['batch_size']} image(s) per victim on average, "
        f"{a.victims} victims, round "
        f"{a.rounds}, ε = {base.epsilon:g} (σ = {first['sigma']:.3g} in the first DPDL run), "
        f"{first['attack']} "
        f"{a.iterations} iterations, dataset {a.dataset}, seeds {','.join(map(str, a.seeds))}"
    )
    print(f"DPDL (Yuan et al. 2026) Table III beside ours — {setting}")
    print(format_table3(table))
    note = f"\n{setting}; {time.perf_counter() - t0:.0f} s.\n"
    write_json(out / "table3.json", to_jsonable({"setting": setting, "rows": table}))
    (out / "table3.md").write_text(markdown_table3(table, note))
    print(f"wrote {out / 'table3.md'} and {out / 'table3.json'}")
    return 0


EXPERIMENTS = {"dpdl-table3": _dpdl_table3}


def cmd_reproduce(a: argparse.Namespace) -> int:
    if a.experiment not in EXPERIMENTS:
        raise unknown("experiment", a.experiment, EXPERIMENTS)
    a.out = a.out or f"privaudit-out/{a.experiment}"
    check_sweep_attack(a)
    return EXPERIMENTS[a.experiment](a)
