"""Test accuracy of every defense at its operating point, beside its references and its paper.

For each defense (``--defenses``), the run of ``privaudit train --defense D --dataset DS
--epsilon E`` at each ``--epsilons`` value (a defense without accountable noise once, at
ε = ∞): its shipped operating point (``privaudit/scenario/presets.py``, found on a validation split
by ``benchmarks/tune.py``), the test accuracy of the agents' average model, σ, and the
accounted ε (worst agent, Poisson q_i = B/n_i, add/remove adjacency). Then the two
references at the same ε: centralised DP-SGD with opacus on the pooled training data (the
best a decentralised algorithm at that ε could hope for: one noise draw for everyone's
batch, where each agent here adds its own) and non-private centralised SGD (the same model
and batches, no clip, no noise), both at dp-dpsgd's operating point, and centralised DP-SGD
at the noise dp-dpsgd's *average model* carries: each agent adds N(0, σ²C²/B²) to its own
batch mean, so the network average carries σC/(B√N) — what a curator adding N(0, σ'²C²) to
the pooled sum of N·B examples adds when σ' = σ√N. At that σ' (and its smaller ε) the
centralised run shows what that much noise on one model allows, however well the agents mix.

Last, each source paper's reported accuracy with its setting (``benchmarks/paper_claims.py``)
beside two runs of ours at the paper's stated ε: σ from the correct accounting, and σ from
the paper's own rule (its σ(ε) formula where it states one, e.g. PDSL's Theorem 1, else its
own count of multiplier and releases), with the correct ε that second σ buys, and one
sentence per defense on why the numbers differ.

    python benchmarks/accuracy.py --data-root DIR [--dataset mnist --epsilons 1,8
        --defenses dsgd,dpdl,dp-dpsgd --agents 10 --topology ring --out DIR --json]

Finished cells are kept in ``OUT/results.jsonl`` (an interrupted benchmark resumes). Each
run and each reference is one task of ``--executor`` (``local``, the default: one after the
other, here; ``ray``: as many at once as the cluster holds, docs/running-at-scale.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from paper_claims import paper_rows  # noqa: E402

from privaudit.api.executor import LocalExecutor, Task, TaskFailed  # noqa: E402
from privaudit.api.frontier import REFERENCE_DEFENSE  # noqa: E402
from privaudit.cli.options import add_executor_options, executor_from_args  # noqa: E402
from privaudit.core.config import RunConfig  # noqa: E402
from privaudit.core.errors import PrivauditError  # noqa: E402
from privaudit.defenses import DEFENSES, get_defense  # noqa: E402
from privaudit.experiments.centralised import reference_for  # noqa: E402
from privaudit.scenario import presets  # noqa: E402
from privaudit.sim.run import Run  # noqa: E402


def key_of(what: str, cfg: RunConfig, epsilon: float) -> str:
    doc = json.dumps([what, cfg.identity(), epsilon], sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def run_config(args: argparse.Namespace, defense: str, epsilon: float) -> RunConfig:
    """``privaudit train --defense D --dataset DS --epsilon E`` at the shipped preset."""
    base = RunConfig(
        defense=defense,
        agents=args.agents,
        topology=get_defense(defense).topology or args.topology,
        dataset=args.dataset,
        data_root=args.data_root,
        seed=args.seed,
        device=args.device,
        epsilon=None if math.isinf(epsilon) else epsilon,
        sigma=0.0 if math.isinf(epsilon) else None,
    )
    cfg, _ = presets.apply(base, "utility", {"params": {}})
    return dataclasses.replace(cfg, checkpoint_every=cfg.rounds)


def noised(defense: str) -> bool:
    """Whether ``defense`` takes σ from the accountant (else it runs once, at ε = ∞)."""
    from privaudit.core.accounting import noised as has_noise
    from privaudit.scenario.topology import build_topology, metropolis_hastings

    d = get_defense(defense)
    W = metropolis_hastings(build_topology(d.topology or "ring", 4)).double()
    params = d.Params()
    return has_noise(d, params, W)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-root", required=True)
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--agents", type=int, default=10)
    p.add_argument("--topology", default="ring")
    p.add_argument("--epsilons", default="1,8")
    p.add_argument("--defenses", default=",".join(DEFENSES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1: as privaudit's CLI)"
    )
    p.add_argument("--out", default="privaudit-out/accuracy")
    p.add_argument("--json", action="store_true")
    add_executor_options(p)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    try:
        executor = executor_from_args(args) or LocalExecutor()
    except PrivauditError as e:
        p.error(str(e))
    warnings.filterwarnings("ignore")
    out = Path(args.out)
    if executor.parallel:  # the workers' working folder is not this one
        out, args.data_root = out.resolve(), str(Path(args.data_root).resolve())
    out.mkdir(parents=True, exist_ok=True)
    log = out / "results.jsonl"
    done: dict[str, dict[str, Any]] = {}
    if log.exists():
        done = {r["key"]: r for r in map(json.loads, log.read_text().splitlines())}

    # every cell not in the log is one task, in the order of the tables; tasks that write one
    # run folder wait for each other (its writer lock refuses a second writer)
    tasks: list[Task] = []
    planned: dict[str, tuple[str, float]] = {}  # a cell's key → (what, ε)
    writer: dict[str, str] = {}  # a run folder → the last task that writes it
    gpus = 1.0 if args.device.startswith("cuda") else 0.0

    def after(cfgs: list[RunConfig], key: str) -> tuple[str, ...]:
        folders = [key_of("run", c, 0.0) for c in cfgs]
        waits = tuple(dict.fromkeys(writer[f] for f in folders if f in writer))
        writer.update(dict.fromkeys(folders, key))
        return waits

    def cell(what: str, cfg: RunConfig, epsilon: float, fn, *fargs, runs=()) -> str:
        key = key_of(what, cfg, epsilon)
        if key not in done and key not in planned:
            planned[key] = (what, epsilon)
            waits = after(list(runs), key)
            label = f"{what} ε={epsilon:g}"
            tasks.append(Task(key, timed, (fn, fargs), waits, label=label, gpus=gpus))
        return key

    epsilons = [float(e) for e in args.epsilons.split(",")]
    rows: list[tuple[str, str, RunConfig]] = []  # (cell, its table row, its configuration)
    for defense in args.defenses.split(","):
        for eps in epsilons if noised(defense) else [math.inf]:
            cfg = run_config(args, defense, eps)
            rows.append((cell(defense, cfg, eps, train, cfg, out, runs=[cfg]), defense, cfg))
    for eps in epsilons:  # at dp-dpsgd's operating point for that ε
        cfg = run_config(args, REFERENCE_DEFENSE, eps)
        key = cell("centralised DP-SGD", cfg, eps, reference, cfg, eps)
        rows.append((key, "centralised DP-SGD (opacus)", cfg))
    ref = run_config(args, REFERENCE_DEFENSE, math.inf)
    key = cell("centralised SGD", ref, math.inf, reference, ref, None)
    rows.append((key, "centralised SGD, non-private", ref))
    for eps in epsilons:  # the centralised run at the noise dp-dpsgd's average model carries
        cfg = run_config(args, REFERENCE_DEFENSE, eps)
        key = cell(AVERAGE_NOISE, cfg, eps, average_noise_reference, cfg, out, runs=[cfg])
        rows.append((key, AVERAGE_NOISE, cfg))
    claims: list[tuple[str, float, str, str]] = []  # (defense, ε, correct cell, rule task)
    for defense in args.defenses.split(","):
        for claim in paper_epsilons(defense, args.dataset):
            # PRV: at ε < 0.1 the RDP conversion's floor exceeds ε whatever σ
            cfg = dataclasses.replace(run_config(args, defense, claim), accountant="prv")
            what = f"{defense} at the paper's ε"
            correct = cell(what, cfg, claim, train, cfg, out, runs=[cfg])
            # the paper's σ needs the run's graph and shards: found by a task after the
            # correct run's, which trains that σ too unless it is the correct one or logged
            rule = f"rule {defense} ε={claim!r}"
            if rule not in {t.key for t in tasks}:
                sigma = done[correct]["sigma"] if correct in done else None
                waits = () if correct in done else (correct,)
                waits = tuple(dict.fromkeys(waits + after([cfg], rule)))
                args_ = (cfg, claim, out, frozenset(done), sigma)
                label = f"{defense} at the paper's rule ε={claim:g}"
                tasks.append(Task(rule, paper_rule, args_, waits, label=label, gpus=gpus))
            claims.append((defense, claim, correct, rule))

    def record(key: str, what: str, epsilon: float, work: dict[str, Any], seconds: float) -> None:
        r = {"key": key, "what": what, "epsilon_target": epsilon, **work, "seconds": seconds}
        with log.open("a") as f:
            f.write(json.dumps(r, default=str) + "\n")
        done[key] = r
        if not args.json:
            print(
                f"{what:<26} ε={epsilon:<4g} acc {r['accuracy']:.4f}  "
                f"σ {r['sigma']:.3g}  ε accounted {r['epsilon']:.3g}  {r['seconds']:.0f} s",
                flush=True,
            )

    rules: dict[str, str | None] = {}  # a rule task → its cell (None: the correct one's)
    failed: list[TaskFailed] = []
    cached = len(({k for k, _, _ in rows} | {c for _, _, c, _ in claims}) & set(done))
    try:
        for t, result in executor.run(tasks, cached=cached):
            if isinstance(result, TaskFailed):  # only where the executor keeps going
                print(result.line(), file=sys.stderr, flush=True)
                failed.append(result)
            elif t.fn is paper_rule:
                cfg, claim = t.args[0], t.args[1]
                if result is not None and result[1] is not None:
                    record(result[0], f"{cfg.defense} at the paper's rule", claim, *result[1:])
                rules[t.key] = None if result is None else result[0]
            else:
                record(t.key, *planned[t.key], *result)
    except PrivauditError as e:  # the executor's: interrupted, no cluster
        if not executor.parallel:
            raise
        sys.exit(f"error: {e}")
    if failed:
        sys.exit(
            f"error: {len(failed)} of {len(tasks)} cells failed (each line above); the "
            f"{len(tasks) - len(failed)} finished are kept in {log}: fix the cause and run the "
            "same command again"
        )
    table_rows = [
        {**done[key], "defense": name, "point": cfg.identity()} for key, name, cfg in rows
    ]
    papers = []
    for defense, claim, correct, rule in claims:
        theirs = rules[rule]
        papers.append(
            (defense, claim, done[correct], done[correct] if theirs is None else done[theirs])
        )
    if args.json:
        print(json.dumps({"rows": table_rows, "papers": papers}, indent=2, default=str))
        return
    print(table(table_rows, epsilons, args))
    print()
    print(paper_table(papers, args.dataset))


def timed(fn, fargs: tuple[Any, ...], *waited: Any) -> tuple[dict[str, Any], float]:
    """A cell as a task: ``fn(*fargs)`` and its seconds (``waited``: the results of the
    tasks it waited for, unused)."""
    t0 = time.perf_counter()
    work = fn(*fargs)
    return work, time.perf_counter() - t0


def train(cfg: RunConfig, out: Path) -> dict[str, Any]:
    run = Run.create(cfg, out / "runs" / key_of("run", cfg, 0.0))
    acc = run.test_accuracy(run.train(progress=False))
    eps = run.resolved["epsilon"]
    return {"accuracy": acc, "sigma": run.resolved["sigma"], "epsilon": eps}


def reference(cfg: RunConfig, epsilon: float | None) -> dict[str, Any]:
    res = reference_for(cfg, epsilon)
    return {"accuracy": res.accuracy, "sigma": res.sigma, "epsilon": res.epsilon}


def paper_rule(
    cfg: RunConfig,
    claim: float,
    out: Path,
    logged: frozenset[str],
    sigma: float | None,
    *waited: Any,
) -> tuple[str, dict[str, Any] | None, float | None] | None:
    """The run at the σ of the paper's own rule for ``claim`` (``cfg``: the correct run, whose
    σ is ``sigma`` or, when None, in the first of ``waited``, its task's result): None when
    the two σ agree (the correct run is the rule's too), else its cell's key with what
    training it gave and its seconds (None, None where the key is ``logged``)."""
    theirs = paper_config(cfg, claim, out)
    if sigma is None:
        sigma = waited[0][0]["sigma"]
    if math.isclose(theirs.sigma, sigma, rel_tol=1e-6):
        return None
    key = key_of(f"{cfg.defense} at the paper's rule", theirs, claim)
    if key in logged:
        return key, None, None
    return (key, *timed(train, (theirs, out)))


AVERAGE_NOISE = "centralised DP-SGD at dp-dpsgd's average-model noise σ√N"


def average_noise_reference(cfg: RunConfig, out: Path) -> dict[str, Any]:
    """Centralised DP-SGD whose noise equals what dp-dpsgd's network average carries at
    ``cfg``: dp-dpsgd's σ times √N, accounted at the pooled rate over the same steps."""
    from privaudit.core.accounting import epsilon_for_sigma
    from privaudit.experiments.centralised import pooled_sample_rate

    run = Run.create(cfg, out / "runs" / key_of("run", cfg, 0.0))  # resolves σ, trains nothing
    sigma = run.resolved["sigma"] * math.sqrt(cfg.agents)
    q = pooled_sample_rate(cfg.batch_size, [len(part) for part in run.ctx.parts])
    eps = epsilon_for_sigma(sigma, cfg.delta, q, cfg.rounds, 1, cfg.accountant)
    res = reference_for(cfg, eps)
    return {"accuracy": res.accuracy, "sigma": res.sigma, "epsilon": res.epsilon}


def paper_epsilons(defense: str, dataset: str) -> list[float]:
    """The numeric ε values a paper reports an accuracy of ``defense`` at on ``dataset``
    (DPDL's tables lost theirs: none)."""
    found = []
    for row in paper_rows(defense):
        try:
            eps = float(row.epsilon)
        except ValueError:
            continue
        if row.dataset == dataset and eps not in found:
            found.append(eps)
    return found


def paper_config(cfg: RunConfig, epsilon: float, out: Path) -> RunConfig:
    """``cfg`` at the σ the paper's own accounting gives ``epsilon``: its σ(ε) rule for one
    release where it states one (solved for σ by bisection: the rule's ε falls as σ grows),
    else its own multiplier and release count composed over the run
    (:func:`privaudit.core.accounting.calibrate` with ``claimed=True``)."""
    from privaudit.core.accounting import calibrate

    run = Run.create(cfg, out / "runs" / key_of("run", cfg, 0.0))  # its graph and shards
    d, W = run.defense, run.ctx.W.cpu().double()
    rates = [a["sample_rate"] for a in run.resolved["agents"]]

    def rule(sigma: float) -> float | None:
        p = dataclasses.replace(run.params, sigma=sigma)
        for kind in d.kinds:
            fn = d.privacy(p, kind, W).paper_epsilon
            if fn is not None:
                return fn(cfg.delta, 1.0)
        return None

    if rule(1.0) is not None:
        lo, hi = 1e-6, 1e6
        for _ in range(200):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if rule(mid) > epsilon else (lo, mid)
        sigma = hi
    else:
        base = dataclasses.replace(run.params, sigma=1.0)
        sigma = calibrate(
            d, base, W, rates, epsilon, cfg.delta, cfg.rounds, cfg.accountant, claimed=True
        )
    return dataclasses.replace(cfg, epsilon=None, sigma=sigma)


# one sentence per defense: why the paper's number and ours at its ε differ
WHY = {
    "pdsl": "at either σ the flat batch clip's noise (σC on a mean of norm ≤ C) keeps the model "
    "at chance, and the paper's own Theorem 1 asks for σ ≈ 840 at ε = 0.08: its accuracy "
    "cannot come from its stated mechanism at its stated ε",
    "dp-dpsgd": "the paper states neither its accounting nor its rounds or batch; accounted "
    "over 100 Poisson rounds of 800-example shards, per-example DP-SGD does not learn at "
    "ε ≤ 0.3",
    "dp-cga": "the paper's count (sensitivity C, d releases) picks a 2.45× smaller σ, whose "
    "true ε is 2.4–2.7× the stated one; at either σ the flat batch clip keeps it at chance",
    "muffliato": "it never clips and calibrates to an assumed bound G = 1 that the model's "
    "gradients exceed, so its noise is relatively smaller than dp-dpsgd's at the same σ: "
    "accuracy close to the paper's at ε = 0.3, with no guarantee behind that ε",
}


def paper_table(papers: list[tuple[str, float, dict, dict]], dataset: str) -> str:
    """The papers' accuracies beside ours at their stated ε (correct σ, and the σ of the
    paper's own rule with the ε it truly buys)."""
    lines = [
        f"The papers' numbers on {dataset} beside ours at the paper's stated ε "
        "(our operating point; accounted ε of the run in brackets)\n",
        "| defense | paper reports | ours, correct σ | ours, the paper's σ (true ε) | why |",
        "|---|---|---|---|---|",
    ]
    for defense, eps, correct, rule in papers:
        paper = next(
            (
                q
                for q in paper_rows(defense)
                if q.dataset == dataset and q.epsilon.strip() == f"{eps:g}"
            ),
            None,
        )
        said = "—" if paper is None else f"{paper.accuracy:g} % at ε = {eps:g} ({paper.source})"
        ours = f"{correct['accuracy']:.3f} (σ {correct['sigma']:.3g})"
        theirs = f"{rule['accuracy']:.3f} (σ {rule['sigma']:.3g}, ε {float(rule['epsilon']):.3g})"
        lines.append(f"| {defense} | {said} | {ours} | {theirs} | {WHY.get(defense, '')} |")
    return "\n".join(lines)


def table(rows: list[dict[str, Any]], epsilons: list[float], args: argparse.Namespace) -> str:
    """The markdown table: one row per defense, accuracy at each ε, its operating point and
    what its paper reports."""
    cols = [f"ε = {e:g}" for e in epsilons] + ["ε = ∞"]
    lines = [
        f"{args.dataset}, {args.agents} agents, {args.topology} (push-sum defenses on their "
        f"own exponential graph), δ = 1e-5, seed {args.seed}; test accuracy of the average "
        "model (accounted ε of the worst agent in brackets); the operating points of the "
        "ε columns in order; the paper's number and ε as printed "
        "(benchmarks/paper_claims.py gives the table and setting)\n",
        "| defense | " + " | ".join(cols) + " | operating point | paper reports |",
        "|---|" + "---|" * (len(cols) + 2),
    ]
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        col = "ε = ∞" if math.isinf(r["epsilon_target"]) else f"ε = {r['epsilon_target']:g}"
        by.setdefault(r["defense"], {})[col] = r
    for name, cells in by.items():
        shown = []
        for c in cols:
            r = cells.get(c)
            shown.append("" if r is None else f"{r['accuracy']:.3f} ({float(r['epsilon']):.3g})")
        points = []
        for r in cells.values():
            pt = r["point"]
            text = f"{pt['model']}, B={pt['batch_size']}, T={pt['rounds']}"
            text += f", α={pt['dirichlet_alpha']:g}"
            text += "".join(f", {k}={v}" for k, v in pt["params"].items())
            if text not in points:
                points.append(text)
        point = " / ".join(points)
        paper = "; ".join(
            f"{q.accuracy:g}% (ε {q.epsilon})"
            for q in paper_rows(name)[:2]
            if q.dataset == args.dataset
        )
        lines.append(f"| {name} | " + " | ".join(shown) + f" | {point} | {paper or '—'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
