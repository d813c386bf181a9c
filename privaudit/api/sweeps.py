"""Plan, run and cache a comparison sweep: targets × attacked rounds × ε × seeds.

One training run per (defense, ε, seed), trained once to the largest round any of its
targets needs and kept under ``OUT/runs/``; one attack per (target, round, ε, seed), cached
under ``OUT/results/`` as ``result.json`` (scores) beside ``recon.safetensors`` (the true
and the matched reconstructed images, for the figures). Both paths end in a hash of
everything that determines their content, so re-running the same sweep reuses every
finished run and result (and reproduces the same numbers), an interrupted sweep resumes
where it stopped, and sweeps with other settings can share one ``OUT``.

A run is keyed by what determines its messages up to any round
(:func:`privaudit.sim.run.run_key`: the defense's parameters with their defaults filled in,
numbers in one spelling), not by how far it is trained: a sweep that attacks later rounds
trains the same run further, from its last checkpoint, and every cell, audit and membership
inference is computed on the run as far as its own observation reaches
(:meth:`privaudit.sim.run.Run.up_to`: the ε it reports is what was spent up to there), so
none is recomputed, or changes, when a later round is added. Where σ is calibrated to ε
over the rounds trained (``horizon`` unset), a longer run has another σ: it is another run,
its cells are computed again, and the study says so in one line; a ``horizon`` fixes the
rounds σ is calibrated over, and attacked rounds then only choose where to look.

Every cached result, audit, membership inference and accuracy is read only when its files
are what was written and it was written by the code running now (:mod:`privaudit.api.cache`:
privaudit's code identity and the loaded plugins' sources); a run folder is kept only while
the code that trained it is the code running now (:func:`adopt_run`). Anything else is
recomputed, with one line on stderr saying why.

A defense whose σ is not set from ε (no Gaussian noise multiplier: dsgd, nd, lppa,
adad2p, …) is run once per seed and reported with ε = ∞ at every ε.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from safetensors.torch import load, save_file

from privaudit.api import cache
from privaudit.api.executor import (
    Executor,
    LocalExecutor,
    Task,
    TaskFailed,
    commit_folder,
    remove_stale,
)
from privaudit.api.message_membership import mia
from privaudit.api.pipeline import reconstruct
from privaudit.core import limits
from privaudit.core.accounting import noised as sigma_noised
from privaudit.core.config import RunConfig, canonical
from privaudit.core.context import params_of
from privaudit.core.errors import PrivauditError, unknown
from privaudit.core.files import digest, dumps_strict, loads_strict
from privaudit.core.messages import CaptureSpec
from privaudit.defenses import get_defense
from privaudit.experiments.audit import audit, check_trials
from privaudit.scenario import presets
from privaudit.scenario.data import load_dataset
from privaudit.scenario.topology import build_topology, metropolis_hastings
from privaudit.sim.run import Run, calibrated, run_key
from privaudit.sim.rundir import RunDir
from privaudit.sim.targets import Target

__all__ = [
    "Sweep",
    "Cell",
    "accuracy_path",
    "read_accuracy",
    "write_accuracy",
    "adopt_run",
    "configure",
    "plan",
    "execute",
    "run_dir",
    "result_dir",
]

RESULT = "result.json"  # a cell's scores, beside RECON (the images, for the figures)
RECON = "recon.safetensors"
MIA_MESSAGES = 8  # rounds of messages a sweep's membership inference scores, per target
# whose view it scores unless the sweep names a threat: the strongest, every link, against
# which every DP guarantee is stated (the attacks keep the weakest adversary that observes)
MIA_THREAT = "global"


@dataclass(frozen=True)
class Cell:
    """One attack: ``target``'s message of ``round`` in the run of (ε, seed)."""

    target: str
    round: int
    epsilon: float | None  # None: the defense adds no accountable noise (ε = ∞)
    seed: int


@dataclass
class Sweep:
    """Everything a comparison varies and fixes.

    ``base``: the training configuration shared by every run (its ``defense``, ``rounds``,
    ``epsilon`` and ``seed`` are set per run; its ``topology`` is replaced by a defense's
    own graph when the defense needs one, e.g. the push-sum defenses' exponential graph).
    ``victims``: agents ``0 .. victims−1`` are attacked in every cell (one Observation each,
    as ``privaudit attack --victim``); ``threat=None`` lets each target use the weakest
    adversary that observes it (:func:`privaudit.api.pipeline.observe`).
    ``audit``: also run the white-box canary audit (:mod:`privaudit.experiments.audit`) of each
    noised target at its largest round, for an empirical ε lower bound.
    ``membership``: also run message-level membership inference and label-count recovery
    (:func:`privaudit.api.message_membership.mia`, its defaults) on each target's last
    :data:`MIA_MESSAGES` rounds up to its largest attacked round, private or not, under
    ``threat`` or else :data:`MIA_THREAT`: the axis on which private and non-private runs
    separate at large batches.
    ``preset``: ``attack`` (``base`` is every run's setting) or ``utility``: each (defense, ε)
    trains at its operating point (:func:`privaudit.scenario.presets.apply`, with the user's
    ``explicit`` settings on top), ``rounds`` empty attacks each run's last round, ε = ∞ in
    ``epsilons`` runs a noised defense without noise (:mod:`.frontier` draws the result).
    ``horizon``: the rounds each run is configured for, over which σ is calibrated to ε
    (at least every round a cell needs; each run is trained only as far as its cells need);
    None: the rounds trained, the largest any cell of the run needs.
    """

    targets: list[str]
    rounds: list[int]
    epsilons: list[float]
    seeds: list[int]
    base: RunConfig = field(default_factory=RunConfig)
    threat: str | None = None
    victims: int = 4
    attack: str | None = None
    iterations: int | None = None
    attack_options: dict[str, Any] = field(default_factory=dict)
    lpips: bool = False
    audit: bool = False
    audit_trials: int | None = None
    membership: bool = False
    preset: str = "attack"
    explicit: dict[str, Any] = field(default_factory=dict)
    horizon: int | None = None

    def validate(self) -> Sweep:
        if not self.targets:
            raise PrivauditError("--targets is empty; name at least one (privaudit targets)")
        for t in self.targets:
            Target.parse(t)
        if len(set(self.targets)) != len(self.targets):
            raise PrivauditError("--targets names a target twice; list each once")
        if self.preset not in presets.PRESETS:
            raise unknown("preset", self.preset, presets.PRESETS)
        if not self.rounds and self.preset != "utility":
            raise PrivauditError("--rounds is empty; give at least one attacked round")
        if self.rounds and min(self.rounds) < 1:
            raise PrivauditError(f"--rounds must be ≥ 1, got {self.rounds}")
        for r in self.rounds:
            limits.check_int("--rounds", r, 1, limits.MAX_ROUNDS, "attacked rounds")
        if not self.epsilons:
            raise PrivauditError("--epsilons is empty; give at least one ε")
        for eps in self.epsilons:
            if eps != math.inf:  # ∞: the noised defenses without noise
                limits.check_float("--epsilons", eps, *limits.EPSILON, hint="ε per agent")
        if not self.seeds:
            raise PrivauditError("--seeds is empty; give at least one seed")
        for seed in self.seeds:
            limits.check_seed("--seeds", seed)
        if not 1 <= self.victims <= self.base.agents:
            raise PrivauditError(
                f"--victims must be 1..{self.base.agents} (at most --agents), got {self.victims}"
            )
        if self.base.sigma is not None:
            raise PrivauditError("a sweep sets σ from --epsilons; --sigma is not supported here")
        if self.audit and self.audit_trials is not None:
            check_trials(self.audit_trials, self.base.delta)
        if self.horizon is not None:
            limits.check_int("--horizon", self.horizon, 1, limits.MAX_ROUNDS, "rounds")
            if self.preset == "utility":
                raise PrivauditError(
                    "--horizon is for the attack preset: the utility preset trains each run "
                    "to its operating point's rounds"
                )
        return self


def noised(defense_name: str, topology: str, agents: int) -> bool:
    """Whether ``--epsilon`` sets the defense's σ (it makes Gaussian releases of a batch)."""
    d = get_defense(defense_name)
    W = metropolis_hastings(build_topology(topology, agents)).double()
    return sigma_noised(d, params_of(d.Params, {}), W)


def _topology(sweep: Sweep, defense: str) -> str:
    """The graph of ``defense``'s runs: a base that keeps the default graph asks for none,
    so a defense with its own graph gets that."""
    base = sweep.base.topology
    return get_defense(defense).topology_for(None if base == RunConfig.topology else base)


def configure(sweep: Sweep, defense: str, epsilon: float | None, seed: int = 0) -> RunConfig:
    """The training configuration of ``defense``'s run at ``epsilon`` (None: a defense without
    accountable noise; ∞: a noised one without noise) before its rounds are fixed: ``base``,
    or at the utility preset that (defense, ε)'s operating point under the explicit flags."""
    noise: dict[str, Any] = {"epsilon": epsilon, "sigma": None}
    if epsilon is None:
        noise["sigma"] = sweep.base.sigma
    elif math.isinf(epsilon):
        noise = {"epsilon": None, "sigma": 0.0}
    cfg = dataclasses.replace(
        sweep.base, defense=defense, topology=_topology(sweep, defense), seed=seed, **noise
    )
    if sweep.preset == "utility":
        cfg = presets.apply(cfg, "utility", sweep.explicit)[0]
    return cfg


def plan(sweep: Sweep) -> tuple[dict[tuple[str, float | None, int], RunConfig], list[Cell]]:
    """The runs ``{(defense, ε or None, seed): RunConfig}`` and the cells to attack. A run's
    ``rounds`` are its configured length: ``sweep.horizon``, else the largest round any of
    its cells needs (:func:`_until`: how far it is trained)."""
    sweep.validate()
    by_defense: dict[str, list[str]] = {}
    for t in sweep.targets:
        by_defense.setdefault(Target.parse(t).defense.name, []).append(t)
    runs: dict[tuple[str, float | None, int], RunConfig] = {}
    cells: list[Cell] = []
    n = sweep.base.agents
    for name, targets in by_defense.items():
        topo = _topology(sweep, name)
        eps_list: Sequence[float | None] = sweep.epsilons if noised(name, topo, n) else [None]
        for eps in eps_list:
            for seed in sweep.seeds:
                cfg = configure(sweep, name, eps, seed)
                rounds = sweep.rounds or [cfg.rounds]  # utility: the operating point's last
                need = max(
                    max(Target.parse(t).rounds_needed(r, n)) for t in targets for r in rounds
                )
                if sweep.preset == "utility":
                    need = max(need, cfg.rounds)
                if sweep.horizon is not None:
                    if need > sweep.horizon:
                        raise PrivauditError(
                            f"{name}'s cells need round {need}, past --horizon "
                            f"{sweep.horizon}; raise the horizon or attack earlier rounds"
                        )
                    need = sweep.horizon
                runs[(name, eps, seed)] = dataclasses.replace(cfg, rounds=need).validate()
                cells += [Cell(t, r, eps, seed) for t in targets for r in rounds]
    return runs, cells


def _psnr_ssim(metrics: dict[str, Any]) -> str:
    """A result's PSNR and SSIM, or why it has none (every victim's batch was empty)."""
    if metrics["psnr"] is None:
        return "empty batches, nothing to reconstruct"
    return f"PSNR {metrics['psnr']:.2f} dB, SSIM {metrics['ssim']:.3f}"


def _eps_tag(eps: float | None) -> str:
    return "inf" if eps is None else f"{eps:g}"


def run_dir(out: Path, cfg: RunConfig) -> Path:
    """``OUT/runs/<defense>-eps<ε>-seed<s>-<hash of the run's key>``
    (:func:`privaudit.sim.run.run_key`: not how far it is trained)."""
    return out / "runs" / f"{_run_prefix(cfg)}{digest(run_key(cfg))}"


def _run_prefix(cfg: RunConfig) -> str:
    """The start of the folder names of ``cfg``'s defense, ε and seed, whatever the rest."""
    tag = _eps_tag(cfg.epsilon) if cfg.sigma is None else f"sigma{cfg.sigma:g}"
    return f"{cfg.defense}-eps{tag}-seed{cfg.seed}-"


def _attack_key(sweep: Sweep, cell: Cell, cfg: RunConfig) -> dict[str, Any]:
    """What a cell computes: its run's key (:func:`privaudit.sim.run.run_key`, not how far
    the run is trained: the cell is computed on the run up to its own rounds) and the
    attack's settings, numbers in one spelling (:func:`~privaudit.core.config.canonical`);
    the code that computes it is checked apart (:mod:`privaudit.api.cache`), so the key
    holds no version."""
    key = {
        "run": run_key(cfg),
        "target": cell.target,
        "round": cell.round,
        "threat": sweep.threat,
        "victims": sweep.victims,
        "attack": sweep.attack,
        "iterations": sweep.iterations,
        "options": sweep.attack_options,
        "lpips": sweep.lpips,
    }
    return canonical(key)


def result_dir(out: Path, sweep: Sweep, cell: Cell, cfg: RunConfig) -> Path:
    """``OUT/results/<target>/r<round>-eps<ε>-seed<s>-<hash of run + attack settings>``."""
    key = digest(_attack_key(sweep, cell, cfg))
    name = f"r{cell.round}-eps{_eps_tag(cell.epsilon)}-seed{cell.seed}-{key}"
    return out / "results" / cell.target / name


def adopt_run(cfg: RunConfig, rdir: Path) -> None:
    """Make sure the run folder ``rdir`` holds no run trained by other code: beside it,
    ``<rdir>.producer.json`` records the code that trained it (:mod:`privaudit.api.cache`);
    when that is not the code running now (privaudit or a plugin changed), or the record is
    damaged, the run is discarded (one line on stderr) and trained again. A folder without a
    record (a run trained by ``privaudit train`` into the study's folder,
    docs/running-at-scale.md) is adopted as this code's."""
    mark = rdir.with_name(rdir.name + ".producer.json")
    key = {"run": run_key(cfg)}
    if cache.read_value(mark, key, covers=rdir) is None:
        cache.write_value(mark, key, {"run": rdir.name})


def _cell_result(rd: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The cached result of the cell whose entry is ``rd``, verified (None: none, or
    discarded)."""
    got = cache.read(rd, [RESULT], key)
    return None if got is None else loads_strict(got[RESULT])


def attack_cell(run: Any, sweep: Sweep, cell: Cell, progress: bool) -> tuple[dict, dict]:
    """Attack one cell: observe each victim's message, invert all as one batch, score.

    Returns the result (the fields of :func:`privaudit.api.pipeline.attack`'s, plus per-image
    scores) and the tensors for the figures (truth and matched reconstructions)."""
    kw = {"iterations": sweep.iterations} if sweep.iterations is not None else {}
    a = reconstruct(
        run,
        cell.target,
        cell.round,
        attack=sweep.attack,
        threat=sweep.threat,
        victims=list(range(sweep.victims)),
        seed=cell.seed,
        options=sweep.attack_options,
        lpips=sweep.lpips,
        progress=progress,
        **kw,
    )
    result = {
        **{k: v for k, v in a.result.to_dict().items() if k not in ("wall_s", "threat_chosen")},
        "seed": cell.seed,
        "epsilon_requested": cell.epsilon,
        "per_image": {
            m: sum((list(s["per_image"][m] or []) for s in a.scores), []) for m in ("psnr", "ssim")
        },
    }
    tensors = {
        "truth": torch.cat([t for t, _ in a.truths]).contiguous(),
        "truth_labels": torch.cat([lab for _, lab in a.truths]).contiguous(),
        "recon": torch.cat(
            [r.images.detach().cpu()[s["perm"]] for r, s in zip(a.recons, a.scores, strict=True)]
        ).contiguous(),
    }
    return result, tensors


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The images of the cell cached in ``path``, verified against its manifest (a damaged
    file is discarded, and the command says to run again)."""
    got = cache.read(path, [RECON], None)
    if got is None:
        raise PrivauditError(
            f"{path / RECON} is gone or damaged (the line above); run the same command again "
            "to recompute it"
        )
    return load(got[RECON])


def _commit(
    rd: Path, result: dict[str, Any], tensors: dict[str, torch.Tensor], key: dict[str, Any]
) -> bool:
    """Write the cache entry ``rd`` (its tensors, ``result.json`` and, last, the manifest
    of both, :func:`privaudit.api.cache.seal`) all at once
    (:func:`~privaudit.api.executor.commit_folder`); False when another worker wrote it
    first."""

    def write(tmp: Path) -> None:
        save_file(tensors, str(tmp / RECON))
        (tmp / RESULT).write_text(dumps_strict(result) + "\n")
        cache.seal(tmp, key)

    return commit_folder(rd, write, cache.MANIFEST)


# the run this process trained or opened last (one at a time, as a local study holds one):
# the next cell of that run in this process attacks it as it is in memory, not reopened
_runs: dict[str, Run] = {}


def _keep(rdir: str, run: Run) -> Run:
    _runs.clear()
    _runs[rdir] = run
    return run


def train_run(
    cfg: RunConfig,
    rdir: str,
    rounds: list[int],
    progress: bool,
    prepare: bool,
    producer: dict[str, Any],
    until: int | None = None,
) -> None:
    """A study's task that trains the run of ``cfg`` in ``rdir`` to round ``until``
    (default its configured rounds), resuming what is there, recording the messages of
    ``rounds`` while it trains, and caches its test accuracy at ``until``.

    ``prepare``: its cells run in other processes, at the same time: the messages of
    ``rounds`` not captured while training here (the run was trained that far already) are
    read, or re-simulated here, once, rather than by each cell (a run has one writer at a
    time). The run is kept in memory for the cells
    that follow in this process. ``producer``: the study's code, taken where the study was
    planned (:func:`privaudit.api.cache.producer`); a worker running other code refuses."""
    cache.require(producer)
    path = Path(rdir)
    until = cfg.rounds if until is None else until
    run = Run.create(cfg, path)
    finished = until in run.dir.checkpoint_rounds()  # else capture while training
    # captured on the way: the rounds not trained yet (those before the last checkpoint
    # are on disk, or re-simulated once they are read: below, or by the cell)
    done = max([0, *run.dir.checkpoint_rounds()])
    wanted = [] if finished else [t for t in rounds if t > done]
    capture = CaptureSpec.of(rounds=wanted) if wanted else None
    state = run.train(until=until, capture=capture, progress=progress)
    missing = [t for t in rounds if t not in wanted]
    if prepare and missing:
        run.messages(CaptureSpec.of(rounds=missing), progress=progress)
    if read_accuracy(path, cfg, until) is None:
        write_accuracy(path, cfg, run.test_accuracy(state), until)
    _keep(rdir, run)


def attack_run_cell(
    sweep: Sweep,
    cell: Cell,
    cfg: RunConfig,
    rdir: str,
    rd: str,
    progress: bool,
    producer: dict[str, Any],
    *_: Any,
) -> dict[str, Any]:
    """A study's task that attacks ``cell`` of the (trained) run in ``rdir`` and caches the
    result in ``rd``; returns the result. A cell cached meanwhile (by another worker) is
    read, never run again. The run is opened once per process for its cells in a row, and
    attacked as far as the cell's own rounds (:meth:`~privaudit.sim.run.Run.up_to`: its
    result, ε included, does not depend on how far the run was trained).
    ``producer``: as :func:`train_run`'s."""
    cache.require(producer)
    entry, key = Path(rd), _attack_key(sweep, cell, cfg)
    found = _cell_result(entry, key)
    if found is not None:
        return found
    run = _runs.get(rdir)
    if run is None or run_key(run.cfg) != run_key(cfg):
        run = _keep(rdir, Run.create(cfg, Path(rdir)))
    view = run.up_to(max(_rounds(cell, cfg)))  # the run as far as this cell looks
    result, tensors = attack_cell(view, sweep, cell, progress)
    result["key"] = key
    _commit(entry, result, tensors, key)
    return result


def _as_far_as(cfg: RunConfig, rdir: str, target: str, r: int) -> Run:
    """The run of ``cfg`` in ``rdir`` as far as observing ``target`` at round ``r`` reaches
    (:meth:`~privaudit.sim.run.Run.up_to`), for an audit or a membership inference."""
    last = max(Target.parse(target).rounds_needed(r, cfg.agents))
    return Run.create(cfg, Path(rdir)).up_to(last)


def audit_run(
    sweep: Sweep,
    cfg: RunConfig,
    rdir: str,
    wanted: list[tuple[str, int, str]],
    progress: bool,
    producer: dict[str, Any],
    *_: Any,
) -> None:
    """A study's task: the white-box canary audit of each (target, round) in ``wanted`` on
    the run in ``rdir``, cached at its path (:func:`_audits`). ``producer``: as
    :func:`train_run`'s."""
    cache.require(producer)
    for target, r, where in wanted:
        path, key = Path(where), _audit_key(sweep, cfg, target, r)
        if cache.read_value(path, key) is not None:
            continue
        kw = {"trials": sweep.audit_trials} if sweep.audit_trials else {}
        run = _as_far_as(cfg, rdir, target, r)
        res = audit(run, target, "white-box", r, progress=progress, **kw)
        found = {
            "epsilon_lo": res.epsilon_lo,
            "epsilon_upper": res.upper["accountant"],
            "verdict": res.verdict,
        }
        cache.write_value(path, key, found)


def membership_run(
    sweep: Sweep,
    cfg: RunConfig,
    rdir: str,
    wanted: list[tuple[str, int, str]],
    progress: bool,
    producer: dict[str, Any],
    *_: Any,
) -> None:
    """A study's task: message-level membership inference on each (target, last round) in
    ``wanted`` — the rounds up to it, :data:`MIA_MESSAGES` of them — on the run in ``rdir``,
    its summary cached at its path (:func:`_memberships`). ``producer``: as
    :func:`train_run`'s."""
    cache.require(producer)
    for target, r, where in wanted:
        path, key = Path(where), _membership_key(sweep, cfg, target, r)
        if cache.read_value(path, key) is not None:
            continue
        first = max(1, r - MIA_MESSAGES + 1)
        run = _as_far_as(cfg, rdir, target, r)
        found: dict[str, Any] = {"error": None}
        try:
            threat = sweep.threat or MIA_THREAT
            res = mia(run, target, first, messages=r - first + 1, threat=threat, progress=progress)
        except PrivauditError as e:  # e.g. every batch empty: no member to find; say why
            found["error"] = str(e)
        else:
            found.update(
                auc=res.auc,
                epsilon_lo=res.epsilon_lo,
                label_counts_exact=res.details["label_counts_exact"],
                label_tv=res.details["label_tv"],
                # None where the non-members cannot resolve the FPR (fewer than 1/FPR)
                tpr_at_1pct=_resolved_tpr(res.tpr_at_fpr["0.01"]),
                tpr_at_01pct=_resolved_tpr(res.tpr_at_fpr["0.001"]),
                violations=len(res.details["violations"]),
                members=res.members,
            )
        cache.write_value(path, key, found)


def execute(
    sweep: Sweep,
    out: str | Path,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    executor: Executor | None = None,
) -> list[dict[str, Any]]:
    """Train what is missing, attack every cell not cached, and return one row per cell:
    the cached result plus ``dir`` (its folder), ``test_acc`` (the run's average model at
    its last round) and, with ``sweep.audit``, ``audit_epsilon_lo``; with
    ``sweep.membership``, ``mia_auc``, ``mia_tpr`` (at 1 % FPR) and ``label_counts_exact``.

    ``executor``: where the work runs (:mod:`privaudit.api.executor`; default
    :class:`~privaudit.api.executor.LocalExecutor`, here, one task after the other). Each
    run is one task and each cell not cached another, which depends on its run's; the rows
    are the same whichever executor ran them. A parallel executor keeps going past a failed
    cell (each failure is reported as it happens) and raises at the end, its finished
    cells cached. Interrupting loses at most the cells in progress; the same call resumes."""
    out = Path(out)
    runs, cells = plan(sweep)
    b = sweep.base
    load_dataset(b.dataset, root=b.data_root, download=b.download)  # fail before any work
    executor = executor or LocalExecutor()
    parallel = executor.parallel
    console = Console(stderr=True, highlight=False)
    say = log or (console.print if progress else (lambda s: None))
    inner = progress and not parallel  # the tasks' own bars: only in this process
    study = _Schedule(producer=cache.producer())
    for (defense, eps, seed), cfg in runs.items():
        mine = [
            c
            for c in cells
            if (Target.parse(c.target).defense.name, c.epsilon, c.seed) == (defense, eps, seed)
        ]
        _schedule_run(
            study, sweep, out, (defense, eps, seed), cfg, mine, len(cells), inner, parallel
        )
    for note in study.notes:  # one line each, unwrapped, as the cache's
        (log or (lambda s: print(s, file=sys.stderr, flush=True)))(note)
    _run_tasks(study, sweep, out, executor, cells, progress, say, log or console.print)
    return _rows(sweep, out, study.groups)


@dataclass
class _Schedule:
    """What :func:`execute` hands its executor, gathered run by run by
    :func:`_schedule_run`: the tasks, each run's (config, folder, cells, ε), the line a
    task prints when it starts here, each cell task's place in the study, how many
    cells were cached already and the lines to show before any task runs."""

    producer: dict[str, Any]
    tasks: list[Task] = field(default_factory=list)
    groups: list[tuple[RunConfig, Path, list[Cell], float | None]] = field(default_factory=list)
    starts: dict[str, str] = field(default_factory=dict)  # a task's line before it runs here
    numbers: dict[str, int] = field(default_factory=dict)  # a cell task's place (local)
    cached: int = 0
    notes: list[str] = field(default_factory=list)  # lines shown before the tasks run


def _schedule_run(
    study: _Schedule,
    sweep: Sweep,
    out: Path,
    key: tuple[str, float | None, int],
    cfg: RunConfig,
    mine: list[Cell],
    total: int,
    inner: bool,
    parallel: bool,
) -> None:
    """Add to ``study`` the tasks of one run, ``key`` (defense, ε, seed): its training
    (when a cell or its accuracy is missing), each cell not cached (depending on the
    training), and its audit and membership inference when asked for and not cached."""
    defense, eps, seed = key
    rdir = run_dir(out, cfg)
    adopt_run(cfg, rdir)
    todo = [
        c
        for c in mine
        if not cache.valid(result_dir(out, sweep, c, cfg), _attack_key(sweep, c, cfg))
    ]
    gpus = 1.0 if cfg.device.startswith("cuda") else 0.0
    producer = study.producer
    train_key, depends = f"train {rdir}", ()
    until = _until(sweep, cfg, mine)
    if todo or read_accuracy(rdir, cfg, until) is None:
        rounds = sorted({t for c in todo for t in _rounds(c, cfg)})
        label = f"{defense} ε={_eps_tag(eps)} seed {seed}"
        study.tasks.append(
            Task(
                train_key,
                train_run,
                (cfg, str(rdir), rounds, inner, parallel, producer, until),
                label=f"{label}: train to round {until}",
                cell=False,
                gpus=gpus,
            )
        )
        study.starts[train_key] = (
            f"[{len(study.numbers) + study.cached}/{total}] {label}: "
            f"train to round {until} in {rdir}"
        )
        note = _another_length(out, cfg, rdir)
        if note:
            study.notes.append(f"{label}: {note}")
        depends = (train_key,)
    for c in mine:
        rd = result_dir(out, sweep, c, cfg)
        if c not in todo:
            study.cached += 1
            continue
        study.numbers[str(rd)] = len(study.numbers) + study.cached + 1
        label = f"{c.target} round {c.round} ε={_eps_tag(eps)} seed {seed}"
        study.tasks.append(
            Task(
                str(rd),
                attack_run_cell,
                (sweep, c, cfg, str(rdir), str(rd), inner, producer),
                depends=depends,
                label=label,
                gpus=gpus,
            )
        )
    _schedule_extras(study, sweep, key, cfg, rdir, mine, depends, inner, gpus)
    study.groups.append((cfg, rdir, mine, eps))


def _schedule_extras(
    study: _Schedule,
    sweep: Sweep,
    key: tuple[str, float | None, int],
    cfg: RunConfig,
    rdir: Path,
    mine: list[Cell],
    depends: tuple[str, ...],
    inner: bool,
    gpus: float,
) -> None:
    """Add to ``study`` one run's canary audit and membership inference tasks (each after
    the run's training, ``depends``), for what the sweep asks and the cache lacks; apart
    from :func:`_schedule_run` to keep each short."""
    defense, eps, seed = key
    producer = study.producer
    extras = (  # per run, cached beside it: the canary audit, the membership inference
        ("audit", audit_run, _audits, sweep.audit and eps is not None),
        ("membership", membership_run, _memberships, sweep.membership),
    )
    for what, fn, where, wanted_here in extras:
        if not wanted_here:
            continue
        wanted = [
            (t, r, str(p))
            for t, r, p, k in where(sweep, cfg, rdir, mine)
            if cache.read_value(p, k) is None
        ]
        if wanted:
            study.tasks.append(
                Task(
                    f"{what} {rdir}",
                    fn,
                    (sweep, cfg, str(rdir), wanted, inner, producer),
                    depends=depends,
                    label=f"{defense} ε={_eps_tag(eps)} seed {seed}: {what}",
                    cell=False,
                    gpus=gpus,
                )
            )


def _run_tasks(
    study: _Schedule,
    sweep: Sweep,
    out: Path,
    executor: Executor,
    cells: list[Cell],
    progress: bool,
    say: Callable[[str], None],
    warn: Callable[[str], None],
) -> None:
    """Run ``study``'s tasks on ``executor``, one line per finished cell (``say``) and per
    failure (``warn``, shown even without progress); stale results are cleared whatever
    happens, and a failure raises once every other task has finished."""
    parallel = executor.parallel
    failures: list[TaskFailed] = []
    done = study.cached

    def started(task: Task) -> None:
        if task.key in study.starts:
            say(study.starts[task.key])

    try:
        for task, result in executor.run(
            study.tasks, progress=progress, cached=study.cached, on_start=started
        ):
            if isinstance(result, TaskFailed):
                failures.append(result)
                warn(result.line())
                continue
            if not task.cell:
                if parallel and task.fn is train_run:
                    say(f"{task.label}: done")
                continue
            done += 1
            cell: Cell = task.args[1]
            number = done if parallel else study.numbers[task.key]
            say(
                f"[{number}/{len(cells)}] {cell.target} round {cell.round} "
                f"ε={_eps_tag(cell.epsilon)} seed {cell.seed}: {_psnr_ssim(result['metrics'])} "
                f"({result['threat']})"
            )
    finally:
        _runs.clear()
        groups = study.groups
        for folder in {result_dir(out, sweep, c, cfg).parent for cfg, _, m, _ in groups for c in m}:
            remove_stale(folder)
    if failures:
        n = sum(f.task.cell for f in failures)
        raise PrivauditError(
            f"{n} of {len(cells)} cells failed and {len(failures) - n} of their runs or audits "
            f"(each line above); the {done} finished are kept in {out}: fix the cause and run "
            "the same command again"
        )


def _rows(
    sweep: Sweep, out: Path, groups: list[tuple[RunConfig, Path, list[Cell], float | None]]
) -> list[dict[str, Any]]:
    """:func:`execute`'s rows, read back from the cache once every task is done: each cell's
    result with its folder and its run's test accuracy, and the audit's and membership
    inference's numbers where the sweep asked for them."""
    rows: list[dict[str, Any]] = []
    for cfg, rdir, mine, eps in groups:
        until = _until(sweep, cfg, mine)
        test_acc = _found(read_accuracy(rdir, cfg, until), accuracy_path(rdir, until))
        mine_rows: list[dict[str, Any]] = []
        for c in mine:
            rd = result_dir(out, sweep, c, cfg)
            row = _found(_cell_result(rd, _attack_key(sweep, c, cfg)), rd)
            row.update(dir=str(rd), test_acc=test_acc)
            mine_rows.append(row)
        if sweep.audit and eps is not None:
            _annotate(sweep, cfg, rdir, mine, mine_rows)
        if sweep.membership:
            for target, _, path, key in _memberships(sweep, cfg, rdir, mine):
                found = _found(cache.read_value(path, key), path)
                for row in mine_rows:
                    if row["target"] == target:
                        row["mia_auc"] = found.get("auc")
                        row["mia_tpr"] = found.get("tpr_at_1pct")
                        row["label_counts_exact"] = found.get("label_counts_exact")
        rows += mine_rows
    return rows


def _resolved_tpr(point: dict[str, Any]) -> float | None:
    """A TPR at an FPR its sample resolves, else None (never printed below its resolution)."""
    return point["tpr"] if point.get("resolved", True) else None


def _found(value: Any, where: Path) -> Any:
    """``value`` read back from the cache at ``where`` after the study wrote it; None (it
    was damaged meanwhile, and discarded with one line) stops the command."""
    if value is None:
        raise PrivauditError(
            f"{where} was damaged or removed while the study ran (the line above); run the same "
            "command again to recompute it"
        )
    return value


def accuracy_path(rdir: Path, rounds: int) -> Path:
    """Where the test accuracy of the run in ``rdir`` (its average model) after round
    ``rounds`` is kept: one file per round, as one run may be trained further by a study."""
    return rdir.with_name(f"{rdir.name}.r{rounds}.accuracy.json")


def _accuracy_key(cfg: RunConfig, rounds: int) -> dict[str, Any]:
    return {"accuracy": run_key(cfg), "round": rounds}


def read_accuracy(rdir: Path, cfg: RunConfig, rounds: int | None = None) -> float | None:
    """The cached test accuracy of the run of ``cfg`` in ``rdir`` after round ``rounds``
    (default its configured rounds; :func:`accuracy_path`), verified
    (:func:`privaudit.api.cache.read_value`); None: not cached (or discarded)."""
    rounds = cfg.rounds if rounds is None else rounds
    found = cache.read_value(accuracy_path(rdir, rounds), _accuracy_key(cfg, rounds))
    return None if found is None else found["test_acc"]


def write_accuracy(rdir: Path, cfg: RunConfig, accuracy: float, rounds: int | None = None) -> None:
    """Cache the test accuracy of the run of ``cfg`` in ``rdir`` after round ``rounds``
    (default its configured rounds)."""
    rounds = cfg.rounds if rounds is None else rounds
    value = {"test_acc": accuracy, "round": rounds}
    cache.write_value(accuracy_path(rdir, rounds), _accuracy_key(cfg, rounds), value)


def _rounds(cell: Cell, cfg: RunConfig) -> list[int]:
    return [t for t in Target.parse(cell.target).rounds_needed(cell.round, cfg.agents) if t >= 1]


def _until(sweep: Sweep, cfg: RunConfig, cells: list[Cell]) -> int:
    """How far the run of ``cfg`` is trained for ``cells``: its configured rounds, or under
    a ``horizon`` the largest round any of its cells needs."""
    if sweep.horizon is None:
        return cfg.rounds
    return max(t for c in cells for t in _rounds(c, cfg))


def _another_length(out: Path, cfg: RunConfig, rdir: Path) -> str:
    """Why a run of this defense, ε and seed already in ``out`` is not this one's, when the
    only difference is the rounds σ is calibrated to ε over (a study that attacks later
    rounds than before): the line that says its cells are computed again; else ''."""
    if rdir.exists() or not calibrated(cfg):
        return ""
    for other in sorted((out / "runs").glob(f"{_run_prefix(cfg)}*")):
        if not other.is_dir() or other == rdir:
            continue
        try:
            was, _ = RunDir(other).read_config()
            same = run_key(dataclasses.replace(was, rounds=cfg.rounds)) == run_key(cfg)
        except PrivauditError:
            continue
        if same:
            return (
                f"σ is calibrated to ε over the rounds trained, so a run to round "
                f"{cfg.rounds} is another run than {other.name} (to round {was.rounds}): "
                "its cells are computed again (a horizon fixes σ over a set number of rounds)"
            )
    return ""


def _audit_key(sweep: Sweep, cfg: RunConfig, target: str, r: int) -> dict[str, Any]:
    return {"run": run_key(cfg), "target": target, "round": r, "trials": sweep.audit_trials}


Per = list[tuple[str, int, Path, dict[str, Any]]]  # (target, round, file, key) beside a run


def _per_target(
    rdir: Path, cells: list[Cell], tag: str, key: Callable[[str, int], dict[str, Any]]
) -> Per:
    """Each target of this run at its largest attacked round, the file beside the run
    where its ``tag`` result is cached (named by a hash of its key) and the key,
    ``key(target, round)``."""
    out = []
    for target in sorted({c.target for c in cells}):
        r = max(c.round for c in cells if c.target == target)
        k = key(target, r)
        name = f"{rdir.name}.{tag}-{target}-{digest(k)}.json"
        out.append((target, r, rdir.with_name(name), k))
    return out


def _audits(sweep: Sweep, cfg: RunConfig, rdir: Path, cells: list[Cell]) -> Per:
    """The white-box canary audits of this run (:func:`_per_target`)."""
    return _per_target(rdir, cells, "audit", lambda t, r: _audit_key(sweep, cfg, t, r))


def _membership_key(sweep: Sweep, cfg: RunConfig, target: str, r: int) -> dict[str, Any]:
    threat = sweep.threat or MIA_THREAT
    return {
        "run": run_key(cfg),
        "target": target,
        "round": r,
        "messages": MIA_MESSAGES,
        "threat": threat,
    }


def _memberships(sweep: Sweep, cfg: RunConfig, rdir: Path, cells: list[Cell]) -> Per:
    """The membership inferences of this run, each up to that round (:func:`_per_target`)."""
    return _per_target(rdir, cells, "mia", lambda t, r: _membership_key(sweep, cfg, t, r))


def _annotate(
    sweep: Sweep, cfg: RunConfig, rdir: Path, cells: list[Cell], rows: list[dict[str, Any]]
) -> None:
    """Put each audit's ε lower bound and the accountant's ε for the same single release
    (the comparable upper bound: one round, sample rate 1) into every row of this run and
    target as ``audit_epsilon_lo`` / ``audit_epsilon_upper``."""
    for target, _, path, key in _audits(sweep, cfg, rdir, cells):
        found = _found(cache.read_value(path, key), path)
        for row in rows:
            if row["target"] == target:
                row["audit_epsilon_lo"] = found["epsilon_lo"]
                row["audit_epsilon_upper"] = found["epsilon_upper"]
