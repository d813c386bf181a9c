"""The in-process simulator: a defense over N stacked agents, with checkpoints and capture.

All agents live in one ``(N, D)`` tensor per state variable; a round's gradients are one
``torch.func`` ``vmap`` over (model, batch) pairs (see :mod:`privaudit.grads`). Each agent
has its own seeded ``torch.Generator`` (:func:`privaudit.core.context.agent_seed`) that
draws its batches and the noise of the rows it owns; every agent's generator state is saved
with each checkpoint, so a resumed run and a run re-simulated from a checkpoint to capture
an earlier round send bit-identical messages, and a torch.distributed rank holding one agent
(:mod:`privaudit.sim.distributed`) draws exactly what the simulator draws for that agent.
Both engines step rounds through :class:`privaudit.sim.loop.RoundLoop` (:meth:`Run.simulate`),
and so does every re-simulation of the run (an audit's trials, reference runs), through
:mod:`privaudit.sim.copies`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call

from privaudit.core import limits, sampling, text
from privaudit.core.accounting import (
    calibrate,
    calibration_basis,
    noised,
    run_privacy,
    sample_rates,
)
from privaudit.core.config import LENGTH, NON_IDENTITY, RunConfig
from privaudit.core.context import Consumed, State, agent_seed, params_of
from privaudit.core.errors import Interrupted, PrivauditError
from privaudit.core.interrupts import signals_deferred, stop_requests
from privaudit.core.messages import CaptureSpec
from privaudit.core.network import Network
from privaudit.core.params import ParamSpec, flat_params
from privaudit.core.threat import Public
from privaudit.defenses import Context, Defense, get_defense
from privaudit.grads import PairGrads, memory
from privaudit.scenario.data import (
    ImageData,
    dirichlet_partition,
    evaluation_split,
    load_dataset,
    per_agent,
    split_validation,
)
from privaudit.scenario.models import build_model, normalizes_inputs
from privaudit.scenario.topology import build_topology, gossip_matrix, validate_mixing
from privaudit.sim.allocator import keep_freed_memory
from privaudit.sim.copies import network
from privaudit.sim.loop import RoundFailed, RoundLoop
from privaudit.sim.rundir import FOLDERS, Key, RunDir


def resolve_device(name: str) -> torch.device:
    """``name`` as a device; on CUDA, TF32 is switched off for matmuls and convolutions:
    messages, exact identities and audits need float32 (TF32 keeps 10 mantissa bits, so
    messages would drift from a float32 per-agent computation far beyond rounding). Freed
    host memory is kept for the next round (:mod:`privaudit.sim.allocator`)."""
    keep_freed_memory()
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise PrivauditError(
                "--device cuda was asked for but CUDA is not available; use --device cpu"
            )
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return torch.device(name)


def sigma_is_set(cfg: RunConfig) -> bool:
    """Whether ``--sigma``/``--epsilon`` set ``cfg``'s defense's σ: a noise multiplier some
    kind's accounting reads (:func:`privaudit.core.accounting.noised`), on ``cfg``'s graph."""
    defense = get_defense(cfg.defense)
    W = gossip_matrix(cfg.gossip, build_topology(cfg.topology, cfg.agents))
    return noised(defense, params_of(defense.Params, cfg.params), W)


def check_sigma_param(cfg: RunConfig) -> None:
    """One error when ``-p sigma=…`` names a σ that ``--sigma``/``--epsilon`` set (it would
    be replaced by the calibrated one). A ``sigma`` no accountant reads — AdaD²P's paper
    constant (:func:`privaudit.core.accounting.noised` is false for it) — stays a parameter."""
    if "sigma" in cfg.params and sigma_is_set(cfg):
        raise PrivauditError(
            f"-p sigma is {cfg.defense}'s calibrated noise multiplier and would be ignored; "
            "use --sigma S (or --epsilon E) to set the noise multiplier"
        )


def resolve_privacy(
    cfg: RunConfig, defense: Defense, base: Any, W: Tensor, shard_sizes: list[int]
) -> tuple[Any, dict[str, Any]]:
    """The defense's parameters ``base`` (from ``cfg.params``) with σ resolved, and what the
    run reports about privacy.

    σ is ``--sigma`` as given, else calibrated from ``--epsilon`` on the defense's own
    mechanism facts (:func:`privaudit.core.accounting.calibrate`: the worst agent, each at
    its own Poisson rate q_i = B/n_i); a defense whose σ is not a noise multiplier keeps
    its parameter. The ε reported per message kind and per agent then comes from the same
    facts at that σ (:func:`privacy_report`)."""
    W = W.cpu()
    rates = sample_rates(shard_sizes, cfg.batch_size)
    p, calibration = base, None
    if noised(defense, base, W):
        if cfg.sigma is not None:
            sigma = cfg.sigma
        elif cfg.epsilon is not None:
            sigma = calibrate(
                defense, base, W, rates, cfg.epsilon, cfg.delta, cfg.rounds, cfg.accountant
            )
            kinds, basis = calibration_basis(defense, base, W)
            calibration = {"epsilon": cfg.epsilon, "kinds": kinds, "basis": basis}
        else:
            raise PrivauditError(f"{defense.name} adds noise: pass --epsilon or --sigma")
        p = params_of(defense.Params, {**cfg.params, "sigma": sigma})
    return p, privacy_report(cfg, defense, p, W, rates, calibration)


def privacy_report(
    cfg: RunConfig,
    defense: Defense,
    p: Any,
    W: Tensor,
    rates: list[float],
    calibration: dict[str, Any] | None,
) -> dict[str, Any]:
    """What a run of ``cfg`` reports about privacy over its ``cfg.rounds`` rounds, at the
    parameters ``p`` (σ resolved; never calibrated here): ε per kind and per agent
    (:func:`privaudit.core.accounting.run_privacy`), σ, the largest sample rate of
    ``rates`` and ``calibration`` (which kinds ``--epsilon`` set σ on, or None)."""
    report = run_privacy(defense, p, W.cpu(), rates, cfg.delta, cfg.rounds, cfg.accountant)
    report.update(
        sigma=float(getattr(p, "sigma", 0.0) or 0.0),
        sample_rate=max(rates),
        calibrated=calibration,  # which kinds --epsilon set σ on, and by what count
    )
    return report


def calibrated(cfg: RunConfig) -> bool:
    """Whether σ of ``cfg``'s run is calibrated from ``--epsilon`` over its ``rounds``: a
    longer run then has another σ, so other messages from round 1 on."""
    return cfg.sigma is None and cfg.epsilon is not None and sigma_is_set(cfg)


@functools.lru_cache(maxsize=256)
def _run_key(config: str) -> str:
    cfg = RunConfig(**json.loads(config))
    defense = get_defense(cfg.defense)
    params = dataclasses.asdict(params_of(defense.Params, cfg.params))
    return json.dumps(cfg.key(params, calibrated(cfg)), sort_keys=True, allow_nan=False)


def run_key(cfg: RunConfig) -> dict[str, Any]:
    """What determines the messages of ``cfg``'s run up to any round
    (:meth:`RunConfig.key`): its settings with the defense's parameters resolved (defaults
    filled in, each as its field's type) and numbers canonical, and its length only where
    σ is calibrated over it (:func:`calibrated`). Two configurations with one key send the
    same messages in every round both have: the key of a run's folder in a study, of what is
    computed from it, and what :meth:`Run.create` checks a folder against."""
    return json.loads(_run_key(cfg.to_json()))


def _differences(old: RunConfig, new: RunConfig) -> list[str]:
    """The fields in which the run ``new`` is not the run ``old`` (:func:`run_key`; empty:
    the same run). Where ``old`` cannot be keyed any more (its defense or a parameter is
    unknown now), the fields of :meth:`RunConfig.identity` that differ as written."""
    now = run_key(new)
    try:
        was = run_key(old)
    except PrivauditError:
        was, now = old.identity(), new.identity()
        return sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k)) or ["params"]
    return sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))


def _adopted(stored: RunConfig, asked: RunConfig) -> RunConfig:
    """The configuration to open the run ``stored`` with when ``asked`` is the same run
    (:func:`run_key`): its recorded settings (the run as it is written, however ``asked``
    spells them), with ``asked``'s length and the fields that change no message (device,
    memory, …)."""
    keep = {k: getattr(asked, k) for k in (*NON_IDENTITY, LENGTH)}
    return dataclasses.replace(stored, **keep)


@dataclass
class Run:
    """A configured run bound to its directory; trains, resumes and captures."""

    cfg: RunConfig
    dir: RunDir
    resolved: dict[str, Any]
    defense: Defense
    params: Any
    data: ImageData
    ctx: Context
    # this process wrote the run's config (a new run), and created its folder too: what a
    # failure before the first checkpoint removes again (:meth:`train`)
    fresh: bool = False
    made_folder: bool = False

    # -- construction ---------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, agents: list[int] | None = None, **override: Any) -> Run:
        """An existing run; ``override`` may change only non-identity fields (device, …).
        ``agents``: the agents this process holds (default all; one per distributed rank)."""
        stored, _ = RunDir(path).read_config()
        cfg = dataclasses.replace(stored, **override).validate()
        return cls._build(cfg, RunDir(path), stored=stored, agents=agents)

    @classmethod
    def create(cls, cfg: RunConfig, path: str | Path) -> Run:
        """A new run at ``path``, or the run already there if it is this run: the same
        :func:`run_key` (its messages up to any round are these settings'). The run there is
        opened as recorded, with ``cfg``'s length and fields that change no message (device,
        …) (:func:`_adopted`): asked for more rounds than it was configured for, it goes on
        from its last checkpoint and its config.json says the new length; asked for fewer,
        it is trained (and checked) only that far, its later rounds kept."""
        cfg.validate()
        check_sigma_param(cfg)
        rd = RunDir(path)
        stored = cls._claim(rd, cfg)
        if stored is not None:
            cfg = _adopted(stored, cfg)
        return cls._build(cfg, rd, stored=stored)

    @staticmethod
    def _claim(rd: RunDir, cfg: RunConfig) -> RunConfig | None:
        """The configuration recorded in ``rd`` when it holds this run already (None: it
        holds nothing yet); raise if it holds anything else."""
        if rd.path.exists() and not rd.path.is_dir():
            raise PrivauditError(f"{rd.path} is a file, not a folder; choose another --out")
        if rd.exists():
            old, _ = rd.read_config()
            diff = _differences(old, cfg)
            if diff:
                why = (
                    "; σ is calibrated to --epsilon over --rounds, so a run of another length "
                    "has another σ"
                    if diff == [LENGTH]
                    else ""
                )
                raise PrivauditError(
                    f"{rd.path} holds a run with a different configuration "
                    f"({', '.join(diff)}{why}); choose another --out or delete it"
                )
            return old
        if not rd.is_empty():
            raise PrivauditError(
                f"{rd.path} exists and is not a privaudit run; choose another --out"
            )
        return None

    @classmethod
    def _build(
        cls,
        cfg: RunConfig,
        rd: RunDir,
        stored: RunConfig | None,
        agents: list[int] | None = None,
    ) -> Run:
        """The run of ``cfg`` in ``rd``: data, model, graph and σ resolved; a new one's
        config.json written, an existing one (``stored``: its recorded configuration)
        checked against its files and its record, and its length extended to ``cfg``'s."""
        defense = get_defense(cfg.defense)
        device = resolve_device(cfg.device)
        data = load_dataset(cfg.dataset, root=cfg.data_root, download=cfg.download)
        data = evaluation_split(data, cfg.eval_split, cfg.seed)
        given = params_of(defense.Params, cfg.params)
        held = defense.holdout_size(given)
        # a public validation set shared by all agents (PDSL's 𝒬), drawn from the test split
        # and so left out of test_accuracy
        public = defense.public_validation_size(given, len(data.test_y))
        data, val_x, val_y = split_validation(data, public, cfg.seed)
        parts = dirichlet_partition(
            data.train_y,
            cfg.agents,
            cfg.dirichlet_alpha,
            seed=cfg.seed,
            min_size=(cfg.examples_per_agent or cfg.batch_size) + held,
        )
        parts, holdout = split_holdout(parts, held, cfg.seed)
        parts = per_agent(parts, cfg.examples_per_agent, cfg.seed)  # --examples-per-agent
        # the data split and the memory are checked before the dense N×N graph is built

        model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
        n_held = cfg.agents if agents is None else len(agents)
        numel = sum(t.numel() for t in model.parameters())
        limits.check_memory(cfg.agents, n_held, numel, cfg.device)
        adj = build_topology(cfg.topology, cfg.agents)
        W = gossip_matrix(cfg.gossip, adj)
        validate_mixing(W)
        p, resolved = resolve_privacy(cfg, defense, given, W, [len(q) for q in parts])
        dtype = getattr(torch, cfg.precision)  # --precision
        model = model.to(device=device, dtype=dtype)
        spec = ParamSpec.of(model)
        if not normalizes_inputs(model):
            data = dataclasses.replace(
                data, mean=(0.0,) * len(data.mean), std=(1.0,) * len(data.std)
            )
        mean = torch.tensor(data.mean, dtype=dtype).view(-1, 1, 1)
        std = torch.tensor(data.std, dtype=dtype).view(-1, 1, 1)
        held = list(range(cfg.agents)) if agents is None else sorted(agents)
        gens = [torch.Generator(device=device).manual_seed(agent_seed(cfg.seed, a)) for a in held]
        ctx = Context(
            model=model,
            spec=spec,
            grads=PairGrads(model, spec, batch_size=cfg.batch_size, max_memory=cfg.max_memory),
            x0=flat_params(model),
            train_x=((data.train_x.to(dtype) - mean) / std).to(device),
            train_y=data.train_y.to(device),
            parts=[parts[a].to(device) for a in held],
            adj=adj.to(device),
            W=W.to(device),
            batch_size=cfg.batch_size,
            generators=gens,
            device=device,
            holdout=[holdout[a].to(device) for a in held] if holdout else [],
            val_x=None if val_x is None else ((val_x.to(dtype) - mean) / std).to(device),
            val_y=None if val_y is None else val_y.to(device),
            agents=held,
        )
        run = cls(cfg, rd, resolved, defense, p, data, ctx)
        record = {**resolved, "params": dataclasses.asdict(p)}
        if stored is not None:
            run.check_files(numel, max(stored.rounds, cfg.rounds))
            # σ, rates and parameters as recorded at creation, edited config.json or not
            rd.check_accounting(dataclasses.replace(cfg, rounds=stored.rounds), record)
            if cfg.rounds > stored.rounds:
                run.extend(stored, record)
        else:
            made = not rd.path.exists()
            with rd.writer():  # the check and the write as one: a racing writer is refused
                if cls._claim(rd, cfg) is None:
                    rd.write_config(cfg, record)
                    run.fresh, run.made_folder = True, made
        return run

    def check_files(self, numel: int, last: int | None = None) -> None:
        """Refuse a run whose config.json disagrees with its files (the folder was edited:
        say ``agents`` changed and the manifest's hash made to match). Every checkpoint must
        hold one row per agent of ``numel``-parameter models and each agent's generator state,
        no file may be of a round past the last (``last``, default the configured rounds:
        config.json's, where the run is opened for fewer), captured messages must cross
        links of the graph, and secrets must hold every agent's batch size. The manifest's
        tensor shapes say it all: no file is read."""
        cfg, rd = self.cfg, self.dir
        last = cfg.rounds if last is None else last
        for what in FOLDERS:
            for t, shapes in sorted(rd.shapes(what).items()):
                problem = (
                    f"it holds {what} of round {t}"
                    if t > last
                    else self._disagreement(what, t, shapes, numel)
                )
                if problem:
                    raise PrivauditError(
                        f"{rd.path} does not agree with its config.json ({cfg.agents} agents on "
                        f"{cfg.topology}, {last} rounds, {cfg.model}): {problem}; the run "
                        "folder was edited: train again into a new --out"
                    )

    def _disagreement(
        self, what: str, t: int, shapes: dict[str, list[int]], numel: int
    ) -> str | None:
        """What in round ``t``'s file under ``what`` (its tensors' ``shapes``) contradicts the
        config, or None."""
        n = self.cfg.agents
        if what == "checkpoints":
            rows = {k: v[0] for k, v in shapes.items() if k.startswith("state.") and v}
            bad = sorted(k for k, r in rows.items() if r != n)
            if bad:
                return (
                    f"checkpoint {t} holds {rows[bad[0]]} agents' {bad[0].removeprefix('state.')}"
                )
            if shapes.get("state.x", [n, numel])[1:] != [numel]:
                got = shapes["state.x"][1:]
                return f"checkpoint {t} holds models of {got} parameters, not {numel}"
            if {k for k in shapes if k.startswith("rng.")} != {f"rng.{a}" for a in range(n)}:
                return f"checkpoint {t} holds the generator states of other agents"
        elif what == "messages":
            adj = self.ctx.adj.cpu()
            for key in shapes:
                src, dst = (key.split("-", 2) + ["", ""])[:2]
                link = (int(src), int(dst)) if src.isdigit() and dst.isdigit() else None
                if link and not (max(link) < n and bool(adj[link])):
                    return f"round {t}'s messages cross the link {src}→{dst}, not in the graph"
        elif shapes.get("sizes", [n]) != [n]:
            return f"the secrets of round {t} hold {shapes['sizes'][0]} agents' batch sizes"
        return None

    def extend(self, stored: RunConfig, record: dict[str, Any]) -> None:
        """Record that this run now goes on to ``self.cfg.rounds``: config.json (configured
        as ``stored``) and the run's record in the manifest say the new length, with
        ``record`` (the resolved privacy, σ unchanged: it is not calibrated over the rounds,
        :func:`run_key`), written as the run's one writer. Its messages so far are kept:
        none of them depends on how far the run goes."""
        cfg = dataclasses.replace(stored, rounds=self.cfg.rounds)
        with self.dir.writer():
            now, _ = self.dir.read_config()
            if now.rounds < cfg.rounds:  # else another writer extended it meanwhile
                self.dir.write_config(cfg, record)

    def up_to(self, rounds: int) -> Run:
        """This run as far as round ``rounds`` (at most its length): the same folder, data,
        generators and σ, with its length and what it reports about privacy cut there — ε
        spent over those rounds at the σ it is trained with (never calibrated again). What a
        study computes from a run's first rounds (an attack on one, an audit, a membership
        inference) is computed on this view, so it is the same however much further the run
        was trained."""
        if not 1 <= rounds <= self.cfg.rounds:
            raise PrivauditError(f"round {rounds} is outside this run (1..{self.cfg.rounds})")
        cfg = dataclasses.replace(self.cfg, rounds=rounds)
        rates = [row["sample_rate"] for row in self.resolved["agents"]]
        calibration = self.resolved["calibrated"]
        report = privacy_report(cfg, self.defense, self.params, self.ctx.W, rates, calibration)
        return dataclasses.replace(self, cfg=cfg, resolved=report)

    # -- public facts an adversary knows ------------------------------------------------
    def public(self) -> Public:
        return Public(
            defense=self.defense.name,
            model=self.cfg.model,
            input_shape=tuple(self.data.input_shape),
            num_classes=self.data.num_classes,
            mean=tuple(self.data.mean),
            std=tuple(self.data.std),
            batch_size=self.cfg.batch_size,
            W=self.ctx.W.cpu(),
            n=self.cfg.agents,
            x0=self.ctx.x0.cpu(),
            params=dataclasses.asdict(self.params),
            epsilon=self.resolved["epsilon"],
            delta=self.cfg.delta,
        )

    def edges(self) -> list[tuple[int, int]]:
        adj = self.ctx.adj
        return [(i, j) for i in range(self.cfg.agents) for j in range(self.cfg.agents) if adj[i, j]]

    # -- training -------------------------------------------------------------------------
    def train(
        self, until: int | None = None, capture: CaptureSpec | None = None, progress: bool = True
    ) -> State:
        """Advance to round ``until`` (default: the configured rounds), resuming from the
        latest usable checkpoint and recording the messages ``capture`` selects."""
        until = self.check_until(until)
        if self.start_round(until, capture) == until:
            return self.restore(until)
        with self.dir.writer():  # one writer at a time; a second is refused with our PID
            try:
                start = self.start_round(until, capture)  # as the lock found it
                state = self.restore(start)
                if start == until:
                    return state
                self.preflight(state)
                net = network(self.ctx, capture)
                return self.simulate(state, start, until, net, progress)
            except RoundFailed as e:
                raise RoundFailed(f"{e}{self.after_failure(e)}", e.resumable) from e.__cause__

    def preflight(self, state: State) -> None:
        """Stop before the first round, with one line naming the fixes, when the least a
        round needs beyond the state already held (:meth:`Defense.round_bytes`: the smallest
        chunk, and the next state unless it is written into this one; the gradient engine
        sizes the rest to what is free) is more than the device has free — rather than the
        host's out-of-memory killer ending the process mid-round, or a CUDA out-of-memory
        error."""
        device = torch.device(self.ctx.device)
        need = self.defense.round_bytes(self.ctx, state)
        have = memory.available_bytes(device)
        if have is not None and need > have:
            raise RoundFailed(
                f"one round of {self.cfg.agents} agents needs about {memory.human(need)} "
                f"beyond its state, but {memory.human(have)} is free on {device}: lower "
                "--agents or --batch-size, use a smaller --model, free memory, or choose "
                "another --device",
                resumable=True,
            )

    def after_failure(self, e: RoundFailed) -> str:
        """Settle the run directory after a round failed (call as its writer), and say what
        is left in it: a new run with no checkpoint yet is removed again (its folder too if
        this process made it and nothing else is in it); otherwise the checkpoints stay, for
        a resume after the defense is fixed or — the settings diverge — for attacks on the
        rounds before."""
        path, kept = self.dir.path, self.dir.checkpoint_rounds()
        if not kept and self.fresh:
            self.dir.discard(remove_folder=self.made_folder)
            gone = path if not path.exists() else f"what this command wrote to {path}"
            return f"; no round was saved, so {gone} was removed"
        if e.resumable:
            last = f"round {max(kept)}" if kept else "the start"
            return f"; then rerun the same command: it resumes {path} from {last}"
        return f" and train into a new --out, or delete {path} (attacks on its earlier rounds work)"

    def check_until(self, until: int | None) -> int:
        until = self.cfg.rounds if until is None else until
        if not 1 <= until <= self.cfg.rounds:
            raise PrivauditError(
                f"round {until} is outside this run (1..{self.cfg.rounds}); "
                f"train a longer run with --rounds {until}"
            )
        return until

    def start_round(self, until: int, capture: CaptureSpec | None) -> int:
        """The latest checkpoint to resume from: at most ``until``, and before the first
        captured round."""
        start_limit = until
        if capture is not None and capture.rounds:
            start_limit = min(min(capture.rounds) - 1, until)
        return max([c for c in self.dir.checkpoint_rounds() if c <= start_limit], default=0)

    @property
    def loop(self) -> RoundLoop:
        """The round loop over this process's agents, checkpointing into the run directory:
        the one place it is built (a copy of the run, :mod:`privaudit.sim.copies`, steps
        ``run.loop.with_ctx(ctx)``)."""
        return RoundLoop(self.defense, self.params, self.ctx, self.cfg.seed, self.dir)

    def restore(self, t: int) -> State:
        """The held agents' state after round ``t`` and their generators as they were then."""
        return self.loop.restore(t)

    def simulate(
        self,
        state: State,
        start: int,
        until: int,
        net: Network,
        progress: bool,
        store: RunDir | None = None,
        on_checkpoint: Callable[[int], None] | None = None,
    ) -> State:
        """Rounds ``start+1 .. until`` over the agents ``net`` holds, stepped by
        :class:`~privaudit.sim.loop.RoundLoop` in both engines. Secrets, captured messages
        and checkpoints of the held agents go to ``store`` (default the run directory; a
        rank's shard under torch.distributed), and ``on_checkpoint(t)`` runs after each
        checkpoint is written."""
        loop, tap = self.loop, net.tap
        store = store or self.dir
        have = set(self.dir.checkpoint_rounds())
        for t in sorted(c for c in have if start < c <= until):
            self.dir.verify("checkpoints", t)  # kept, not rewritten: it must be what was written
        links = [e for e in (tap.spec.links or self.edges()) if net.tapped(e)]
        bar, task = text.progress(until, f"{self.defense.name} rounds", progress, completed=start)
        # a process holding every agent hands each round its state to write the next one
        # into (Consumed: no second copy of the state); a rank's round waits on peers that
        # may stop halfway, so it keeps its state whole
        consume = net.holds_all
        # the last whole round: its number, state and generators, replaced in one assignment
        # (a signal between two statements never pairs one round's state with another's
        # number); its state is None while a round writes into it
        last: tuple[int, State | None, dict[str, Tensor]] = (start, state, loop.rng_states())
        with bar, stop_requests() as stop:
            agreed = False  # every process holds its stop request at this same boundary
            try:
                for t in range(start + 1, until + 1):
                    agreed = net.agree(stop.requested)
                    if agreed:
                        break
                    idx, batch = loop.sample()
                    handed = last[1]
                    if consume:
                        handed = Consumed(handed)
                        last = (last[0], None, last[2])
                    last = (t, loop.step(handed, t, net, batch).state, loop.rng_states())
                    del handed
                    if tap.spec.wants_round(t):
                        store.save_secrets(t, sampling.secrets(idx, self.ctx.train_y))
                        payloads = {k: m.payload for k, m in tap.messages.items()}
                        store.save_messages(t, payloads, links)
                        tap.clear()
                    if (t % self.cfg.checkpoint_every == 0 or t == until) and t not in have:
                        loop.checkpoint(store, t, last[1], last[2])
                        have.add(t)
                        if on_checkpoint is not None:
                            on_checkpoint(t)
                    bar.advance(task)
            except BaseException:
                # under a stop request, a failure is its consequence (a peer rank that
                # stopped first, the third Ctrl-C): round ``done`` is still whole, unless
                # the cut round was writing into its state
                if not stop.requested:
                    raise
            done, state, rng = last
            if (agreed or stop.requested) and done < until:
                if state is None:  # cut halfway through writing round done + 1's state
                    back = max((c for c in have if c <= done), default=0)
                    again = (
                        f"resume from round {back}, the last checkpoint"
                        if back
                        else "start again (no round was checkpointed yet)"
                    )
                    raise Interrupted(
                        f"interrupted halfway through round {done + 1}, which had begun to "
                        f"overwrite round {done}'s state; run the same command again to {again}"
                    )
                # a rank writes its rows to its shard; the launcher merges complete rounds
                if done > start and done not in have:
                    with signals_deferred():
                        loop.checkpoint(store, done, state, rng)
                raise Interrupted(
                    f"interrupted after round {done}; run the same command again to resume "
                    f"from round {done}"
                )
        return state

    # -- what attacks and eval need ---------------------------------------------------------
    def messages(self, capture: CaptureSpec, progress: bool = True) -> dict[Key, Tensor]:
        """The messages ``capture`` selects, from disk or by re-simulating their rounds."""
        rounds = sorted(capture.rounds or [])

        def load() -> tuple[dict[Key, Tensor], bool]:
            """The selected messages on disk, and whether every round has all it needs."""
            out, complete = {}, True
            for t in rounds:
                msgs, tapped = self.dir.read_messages(t)
                out.update({k: v for k, v in msgs.items() if capture.wants(*k)})
                complete &= links <= set(tapped) and self.dir.has_secrets(t)
            return out, complete

        links = capture.links or set(self.edges())
        out, complete = load()
        if not complete:
            self.train(until=max(rounds), capture=capture, progress=progress)
            out, _ = load()
        return out

    def secret_index(self, t: int, agent: int) -> Tensor:
        """Agent's realised batch of round ``t``: its examples' indices into the training set
        (Poisson, so 0 or more; eval only)."""
        try:
            idx = sampling.secret_index(self.dir.load_secrets(t), agent)[0]
        except KeyError:
            raise PrivauditError(
                f"the secrets of round {t} in {self.dir.path} were written by an older "
                "privaudit (fixed-size batches); delete its secrets and messages folders and "
                "capture again"
            ) from None
        if len(idx) and not 0 <= int(idx.min()) <= int(idx.max()) < len(self.data.train_y):
            raise PrivauditError(
                f"{self.dir.round_file('secrets', t)} indexes examples outside the training "
                "set; delete it and rerun: its round is re-simulated from a checkpoint"
            )
        return idx

    def secret_batch(self, t: int, agent: int) -> tuple[Tensor, Tensor]:
        """Agent's true batch of round ``t``: images in [0, 1] and labels (eval only), as
        many as it realised (:meth:`secret_index`)."""
        idx = self.secret_index(t, agent)
        return self.data.train_x[idx], self.data.train_y[idx]

    def batch_sizes(self, t: int) -> list[int]:
        """Every agent's realised batch size in round ``t`` (from the secrets)."""
        s = self.dir.load_secrets(t)
        if "sizes" not in s:
            self.secret_index(t, 0)  # the older-format error
        return [int(v) for v in s["sizes"]]

    def test_accuracy(self, state: State) -> float:
        """Test accuracy of the agents' average model (on the validation split when the run
        is configured with ``eval_split="validation"``)."""
        return self.accuracies(state["x"].mean(0, keepdim=True))[0]

    def agent_accuracies(self, state: State) -> list[float]:
        """Test accuracy of each agent's own model (row i of ``state["x"]``), in agent order."""
        return self.accuracies(state["x"])

    def accuracies(self, flats: Tensor) -> list[float]:
        """Test accuracy of each flat parameter vector of ``flats`` (M, D) on the test split
        (less a public validation set the defense drew from it)."""
        ctx = self.ctx
        mean = torch.tensor(self.data.mean).view(-1, 1, 1)
        std = torch.tensor(self.data.std).view(-1, 1, 1)
        correct = [0] * len(flats)
        with torch.no_grad():
            for i in range(0, len(self.data.test_y), 1024):
                x = ((self.data.test_x[i : i + 1024] - mean) / std).to(ctx.device, ctx.x0.dtype)
                y = self.data.test_y[i : i + 1024]
                for m, flat in enumerate(flats):
                    out = functional_call(ctx.model, ctx.spec.unflatten(flat), (x,))
                    correct[m] += int((out.argmax(1).cpu() == y).sum())
        n = max(len(self.data.test_y), 1)
        return [c / n for c in correct]


def split_holdout(parts: list[Tensor], size: int, seed: int) -> tuple[list[Tensor], list[Tensor]]:
    """Hold ``size`` seeded examples of each shard out of training (a validation split)."""
    if size <= 0:
        return parts, []
    gen = torch.Generator().manual_seed(seed + 7919)  # apart from the run's own stream
    train, held = [], []
    for part in parts:
        if len(part) <= size:
            raise PrivauditError(
                f"a shard of {len(part)} examples cannot hold out {size} for validation; "
                "lower the defense's val_size or --agents"
            )
        perm = torch.randperm(len(part), generator=gen)
        held.append(part[perm[:size]].sort().values)
        train.append(part[perm[size:]].sort().values)
    return train, held
