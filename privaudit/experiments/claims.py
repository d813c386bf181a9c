"""The claims ledger: the promise, the truth and the evidence, per defense and message kind.

For every message kind of every defense (``privaudit targets``) on one run configuration,
one row puts side by side

- **the promise**: the paper's privacy claim as stated (:attr:`Privacy.paper`), the ε its
  own accounting gives over the run (``claimed_multiplier``, ``claimed_releases``: the
  run's ``epsilon_claimed``), and for the one release the audit observes, the ε of that
  count and of the paper's own σ(ε) rule where it states one;
- **the truth**: the ε a correct accounting gives over the run at the calibrated σ
  (``run.resolved``; ∞ with the reason when the kind has no formal guarantee), and for the
  one release the audit observes;
- **the evidence**: a white-box canary audit of round 1 (:func:`privaudit.experiments.audit.audit`),
  whose ε lower bound holds at the stated confidence whatever the accounting says;
- **the verdicts**: the lower bound against the claim's per-release ε (a "violated" claim
  is refuted by the evidence: its count or its rule promises less than is proven; a claim
  resting on an assumption the run does not enforce is judged on the canaries that respect
  it, and "does not apply" where only others beat it: :func:`claim_verdict`) and against
  the correct per-release bound (a "violated" accounting would be a bug in the
  accounting); a violation is re-audited at a Bonferroni level (:func:`row`). A "loose"
  verdict whose lower bound is 0 is written "no evidence".

Everything is accounted the way the tool accounts everything (:mod:`privaudit.core.accounting`):
adjacency is adding or removing one example, each agent's batch is Poisson sampled at
q_i = B/n_i, and the run's ε is the worst agent's. Per-release bounds are at sample rate 1,
which is what a single-round white-box audit measures.

A row's budget is a number of trials fixed before the study starts (:func:`plan`):
``--trials``, a fixed share of it for the costly kinds (:data:`TRIAL_DIVISORS`). Nothing
timed decides a trial count, so a ledger is the same, byte for byte (:func:`public`), on
any machine, under any load, locally or on a cluster. The setting line states each row's
trials and whether its canary search ran (a search needs more trials than a bound:
:func:`search_needs`).

Rows are cached under ``OUT/rows`` as they finish, keyed by everything that determines them
(the run's configuration, the mechanism facts, the audit's setting and the row's trials), so
an interrupted ledger resumes where it stopped and a changed defense is re-audited. The
cache is the caller's (:class:`RowCache`: the CLI passes :mod:`privaudit.api.cache`, which
this layer may not import): each entry carries a checksum and the code that computed it,
verified on read, so an edited or damaged row, or one written by other code, is recomputed.

On request (``privaudit claims --final-model``: ``final_trials``), each defense also gets
the **final-model audit** (:func:`privaudit.experiments.final_audit.final_model_audit`): the
hidden-state adversary of Cebere et al. (ICLR 2025), who sees only the final models and plants
a gradient canary in the victim's update in every round, on the defense's run over
:data:`FINAL_ROUNDS` rounds (what ``privaudit audit --observe final`` trains by default), its
canary that of the defense's first formal kind (:func:`final_target`). Its ε lower bound, the
accounted ε of the releases it composes (sample rate 1) and the verdict stand on every row of
the defense (:func:`final_result`), cached under ``OUT/final-models`` as the rows are.
Without it the document is what it was before the column existed, key for key.

The ledger document is a dict (:class:`ClaimsLedger` types it); its text — ``OUT/claims.md``
and the table ``privaudit claims`` prints — is :mod:`privaudit.experiments.ledger_text`.

Where each part lives: this module is the entry point (:func:`ledger`, :func:`public`,
:func:`write`: the ledger assembled, resumed, written) and re-exports what callers use of its
parts; the plan and the setting it states (targets, runs, budgets) are
:mod:`~privaudit.experiments.claims_plan`, one row (its audits and verdicts, and
:class:`RowJob` for another process) :mod:`~privaudit.experiments.claims_row`, the
final-model column :mod:`~privaudit.experiments.claims_final`, and where finished results
are kept :mod:`~privaudit.experiments.claims_cache`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from privaudit.core.config import RunConfig
from privaudit.core.errors import Interrupted as RunStopped
from privaudit.core.errors import PrivauditError
from privaudit.core.files import atomic_write, digest, to_jsonable, write_json
from privaudit.core.interrupts import InterruptNote, interrupts_noted
from privaudit.core.text import progress
from privaudit.experiments.claims_cache import Kept, RowCache
from privaudit.experiments.claims_final import (
    FINAL_BATCHES,
    FINAL_OBSERVER,
    FINAL_ROUNDS,
    FINAL_TRIALS,
    FINAL_VICTIM,
    FinalModels,
    final_config,
    final_result,
    final_setting,
    final_target,
)
from privaudit.experiments.claims_plan import (
    CANDIDATES,
    CONFIDENCE,
    ROUND,
    THREAT,
    TRIAL_DIVISORS,
    TRIALS,
    budget_warnings,
    plan,
    privacy_facts,
    row_trials,
    run_config,
    search_needs,
    select,
    setting,
)
from privaudit.experiments.claims_row import (
    CLAIM_WIDTH,
    PROMISES,
    SEVERITY,
    RowJob,
    RowRunner,
    claim_verdict,
    compute_row,
    row,
    short_claim,
)
from privaudit.experiments.final_audit import final_model_audit
from privaudit.experiments.ledger_text import markdown
from privaudit.sim.run import Run
from privaudit.sim.targets import Target

__all__ = [
    "CANDIDATES",
    "CLAIM_WIDTH",
    "CONFIDENCE",
    "FINAL_BATCHES",
    "FINAL_OBSERVER",
    "FINAL_ROUNDS",
    "FINAL_TRIALS",
    "FINAL_VICTIM",
    "PROMISES",
    "ROUND",
    "SEVERITY",
    "THREAT",
    "TRIALS",
    "TRIAL_DIVISORS",
    "ClaimsLedger",
    "FinalModels",
    "Interrupted",
    "Kept",
    "RowCache",
    "RowJob",
    "RowRunner",
    "budget_warnings",
    "claim_verdict",
    "compute_row",
    "final_config",
    "final_model_audit",
    "final_result",
    "final_setting",
    "final_target",
    "ledger",
    "plan",
    "privacy_facts",
    "public",
    "row",
    "row_trials",
    "run_config",
    "search_needs",
    "select",
    "setting",
    "short_claim",
    "write",
]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during the ledger; ``ledger`` holds the rows finished before it."""

    def __init__(self, ledger: dict[str, Any]) -> None:
        super().__init__()
        self.ledger = ledger


@dataclasses.dataclass
class ClaimsLedger:
    """The ledger document (:func:`ledger`), typed: what every row was computed on
    (:func:`setting`), each defense's topology and σ, the rows in registry order (while the
    ledger is computed, a :class:`RowJob` holds the place of a row computed elsewhere),
    whether every row is done, the seconds it took (None where the document leaves them
    out, as the :func:`public` one does) and, with ``--final-model``, each defense's
    final-model audit (:func:`final_result`; None without: the document has no such key).

    :meth:`to_dict` is the document as :func:`ledger` returns it and :func:`write` writes it,
    key for key and in the same order; :meth:`from_dict` reads one back. Both share the
    values (the rows, the setting) rather than copy them."""

    setting: dict[str, Any]
    topologies: dict[str, str]
    sigma: dict[str, float]
    rows: list[Any]
    complete: bool
    seconds: float | None = None
    final_model: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ledger document: ``seconds`` only where it is known, ``final_model`` only
        where the ledger has the column."""
        doc = {
            "setting": self.setting,
            "topologies": self.topologies,
            "sigma": self.sigma,
            "rows": self.rows,
        }
        if self.final_model is not None:
            doc["final_model"] = self.final_model
        doc["complete"] = self.complete
        if self.seconds is not None:
            doc["seconds"] = self.seconds
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ClaimsLedger:
        """The ledger of a document :meth:`to_dict` (or :func:`ledger`) made, e.g. read from
        ``ledger.json``: one that lacks a key other than ``seconds`` and ``final_model``,
        or holds one it does not know (which :meth:`to_dict` would drop), is refused."""
        known = [f.name for f in dataclasses.fields(cls)]
        optional = ("seconds", "final_model")
        wrong = [f"no {k!r}" for k in known if k not in doc and k not in optional]
        wrong += [f"unknown key {k!r}" for k in sorted(set(doc) - set(known))]
        if wrong:
            raise PrivauditError(f"not a claims ledger: {', '.join(wrong)}")
        return cls(**{k: doc[k] for k in known if k in doc})


def ledger(
    base: RunConfig,
    out: str | Path,
    targets: list[str] | None = None,
    trials: int = TRIALS,
    confidence: float = CONFIDENCE,
    seed: int = 0,
    fresh: bool = False,
    progress: bool = True,
    run_rows: RowRunner | None = None,
    cache: RowCache | None = None,
    final_trials: int | None = None,
) -> dict[str, Any]:
    """A row per target (default: every target, :func:`select`) on ``base``'s configuration
    (each defense with :func:`run_config`), each on its budget of trials (:func:`plan`,
    fixed here, before any row runs). Runs live in ``OUT/runs``; with a ``cache``, finished
    rows are kept in ``OUT/rows`` and reused (unless ``fresh``) when they check out. Ctrl-C
    raises :class:`Interrupted` carrying the rows finished so far (each already cached).

    ``run_rows``: compute the rows not cached elsewhere, all at once (e.g. as Ray tasks:
    ``privaudit claims --executor ray``), instead of here one after the other; a row that
    could not finish is reported and, once the others are done, raised.

    ``final_trials``: also audit each defense's final models on that many trials
    (:func:`final_result`, on its run of :func:`final_config`; here, after its rows), cached
    in ``OUT/final-models`` as the rows are; None (the default): no such audit, and the
    document is what it was before the column existed.

    Returns the ledger document (:meth:`ClaimsLedger.to_dict`)."""
    targets = targets or select()
    doc = ClaimsLedger(
        setting=setting(base, trials, confidence, seed, targets),  # refuses too few trials
        topologies={},
        sigma={},
        rows=[],
        complete=False,
    )
    if final_trials is not None:  # refuses too few trials, before any work
        doc.setting["final_model"] = final_setting(final_trials, base.delta, confidence, seed)
        doc.final_model = {}
    by_defense: dict[str, list[str]] = {}
    for t in targets:
        tg = Target.parse(t)
        by_defense.setdefault(tg.defense.name, []).append(tg.kind)
    configs = {n: run_config(base, n) for n in by_defense}
    doc.topologies = {n: c.topology for n, c in configs.items()}
    study = _Study(doc, Path(out), Kept(cache, fresh), progress, run_rows is not None)
    t0 = time.perf_counter()
    finals = 0 if final_trials is None else len(by_defense)
    bar, task = _bar(len(targets) + finals, progress and run_rows is None)
    with bar, interrupts_noted() as interrupted:
        try:
            for name, kinds in by_defense.items():
                run = study.run(name, configs[name])
                for kind in kinds:
                    bar.update(task, description=f"claims {run.defense.name}-{kind}")
                    study.add(run, kind, interrupted)
                    bar.advance(task)
                if final_trials is not None:
                    bar.update(task, description=f"claims {name}: final models")
                    study.final(name, final_config(base, name), interrupted)
                    bar.advance(task)
            if study.jobs and run_rows is not None:
                _run_elsewhere(study, run_rows, len(targets) - len(study.jobs), progress)
        except (KeyboardInterrupt, RunStopped):  # RunStopped: a run's own stop request
            doc.rows = [r for r in doc.rows if not isinstance(r, RowJob)]
            doc.seconds = round(time.perf_counter() - t0, 1)
            raise Interrupted(doc.to_dict()) from None
    doc.complete = True
    doc.seconds = round(time.perf_counter() - t0, 1)
    return doc.to_dict()


@dataclasses.dataclass
class _Study:
    """A ledger being computed: its document, where its runs and rows live, where finished
    rows are kept (``kept``: the cache, and whether cached rows are ignored), whether to draw
    the audits' bars, and whether rows are computed elsewhere (``remote``: :attr:`jobs`
    collects them)."""

    doc: ClaimsLedger
    out: Path
    kept: Kept
    progress: bool
    remote: bool
    jobs: list[RowJob] = dataclasses.field(default_factory=list)

    def run(self, name: str, cfg: RunConfig) -> Run:
        """The run of defense ``name`` on ``cfg``, in ``OUT/runs``; its σ noted."""
        try:
            run = Run.create(cfg, self.out / "runs" / f"{name}-{digest(cfg.identity())}")
        except PrivauditError as e:
            raise PrivauditError(f"{name}: {e}") from None
        self.doc.sigma[name] = run.resolved["sigma"]
        return run

    def add(self, run: Run, kind: str, interrupted: InterruptNote) -> None:
        """Put ``kind``'s row in the ledger: read from the cache, computed here, or (remote)
        a :class:`RowJob` in its place, computed later; ``interrupted``: whether Ctrl-C cut
        the row's audit short (a row of fewer trials than asked is neither kept nor
        followed)."""
        a = self.doc.setting["audit"]
        target = f"{run.defense.name}-{kind}"
        trials = a["plan"][target]["trials"]
        privacy = run.defense.privacy(run.params, kind, run.ctx.W.cpu(), 0)
        # the row's own setting: the ledger's without the other rows' budgets, with its own
        audit_key = {**{k: v for k, v in a.items() if k != "plan"}, "trials": trials}
        key = [run.cfg.identity(), run.resolved["kinds"][kind], privacy_facts(privacy), audit_key]
        path = self.out / "rows" / f"{target}-{digest(key)}.json"
        r = self.kept.read(path, key)
        if r is not None:
            self.doc.rows.append({**r, "cached": True})
            return
        if self.remote:
            rdir = str(Path(run.dir.path).resolve())
            job = RowJob(target, kind, run.cfg, rdir, str(path), key, trials, *self._audit())
            self.jobs.append(job)
            self.doc.rows.append(job)  # its place, filled when it is done
            return
        # the audit's own bar per trial, under the row bar: on a terminal only (elsewhere
        # each nested bar leaves an empty line on stdout)
        inner = self.progress and sys.stdout.isatty()
        confidence, seed, family = self._audit()
        r = row(run, kind, trials, confidence, seed, inner, family)
        if interrupted.seen:
            raise KeyboardInterrupt
        self.kept.keep(path, key, r)
        self.doc.rows.append(r)

    def final(self, name: str, cfg: RunConfig, interrupted: InterruptNote) -> None:
        """Put defense ``name``'s final-model audit on its run of ``cfg`` in the ledger
        (:meth:`FinalModels.result`: read from ``OUT/final-models`` or computed and kept
        there)."""
        setting = self.doc.setting["final_model"]
        finals = FinalModels(setting, self.out, self.kept, self.progress)
        if self.doc.final_model is None:
            self.doc.final_model = {}
        self.doc.final_model[name] = finals.result(name, cfg, interrupted)

    def _audit(self) -> tuple[float, int, int]:
        """The audit's confidence, seed and family (the number of rows)."""
        a = self.doc.setting["audit"]
        return a["confidence"], a["seed"], a["family"]


def _run_elsewhere(study: _Study, run_rows: RowRunner, cached: int, progress: bool) -> None:
    """Compute ``study``'s jobs through ``run_rows``, cache each row and put it in its place
    in the ledger; report each job that could not finish as it happens, and raise once all
    are done."""
    doc, jobs = study.doc, study.jobs
    done = 0
    failed: list[str] = []
    for job, r in run_rows(jobs, cached, progress):
        if isinstance(r, str):
            failed.append(f"{job.target}: {r}")
            print(f"failed: {job.target}: {r}", file=sys.stderr)
        else:
            done += 1
            study.kept.keep(job.path, job.key, r)
            place = next(i for i, x in enumerate(doc.rows) if x is job)
            doc.rows[place] = r
    if failed:
        doc.rows = [r for r in doc.rows if not isinstance(r, RowJob)]
        raise PrivauditError(
            f"{len(failed)} of {len(jobs)} rows failed (each line above); the {done} "
            "finished are kept in OUT/rows: fix the cause and run the same command again"
        )


def _bar(total: int, enabled: bool) -> tuple[Any, Any]:
    """The ledger's bar over its rows (and its task), with the time elapsed."""
    return progress(total, "claims", enabled, elapsed=True)


def public(doc: dict[str, Any]) -> dict[str, Any]:
    """The ledger as it is written and printed: what was computed, without how long it took
    or where each row and final-model audit came from (this run or the cache), so that it is
    the same, byte for byte, wherever, under whatever load and however often it is computed."""
    rows = [
        r if isinstance(r, RowJob) else {k: v for k, v in r.items() if k != "cached"}
        for r in doc["rows"]
    ]
    out = {**{k: v for k, v in doc.items() if k != "seconds"}, "rows": rows}
    if "final_model" in doc:
        out["final_model"] = {
            name: {k: v for k, v in f.items() if k != "cached"}
            for name, f in doc["final_model"].items()
        }
    return out


def write(doc: dict[str, Any], out: str | Path, markdown_path: str | Path | None = None) -> None:
    """``OUT/ledger.json`` and ``OUT/claims.md``, and the markdown at ``markdown_path``: the
    :func:`public` ledger."""
    out = Path(out)
    doc = public(doc)
    write_json(out / "ledger.json", to_jsonable(doc))
    text = markdown(doc)
    for path in [out / "claims.md", *([Path(markdown_path)] if markdown_path else [])]:
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))
