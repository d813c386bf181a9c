"""The torch.distributed engine: one process (rank) per agent, the tap on the wire.

Rank r holds agent r and runs the *same* defense code as the simulator:
:meth:`privaudit.sim.run.Run.simulate` steps the rounds through the one round loop
(:class:`privaudit.sim.loop.RoundLoop`), the defense computes over one agent's rows, and
:class:`DistNetwork` moves each per-out-edge row to its receiver with point-to-point
``isend``/``irecv`` (gloo on CPU, nccl on GPU). Its tap records every message where it
arrives, on the receiving rank, so each message is recorded once, as it came off the wire.

Same seed → same messages: agent r's generator is seeded as in the simulator
(:func:`privaudit.core.context.agent_seed`) and draws the same batches and noise in the same
order, and a receiver sums its incoming rows in the same (global link) order. Float results
agree with the simulator to rounding, not bit for bit: the simulator evaluates the gradients
of all N agents in one ``vmap`` and a rank those of one agent, and oneDNN picks its
convolution kernels by batch shape, so the last bits of a gradient can differ (≈1e-7
relative); batches, noise draws and anything not computed from a gradient are identical.

Run directory. Every rank writes its secrets, captured messages and checkpoint rows, in the
simulator's file format, into its own shard ``RUN/shards/rank-NNNNN/``; at every checkpoint
round all ranks meet at a barrier and rank 0 merges the shards into the ordinary files
(``RUN/messages``, ``RUN/secrets``, ``RUN/checkpoints``), then removes them. A distributed run
directory is therefore a simulator run directory: ``privaudit attack --run`` and
:meth:`Run.messages` (which re-simulates rounds that were not captured) work unchanged, and a
run started on one engine resumes on the other. Multi-node runs need ``--out`` on a
filesystem every node shares.

Failure. The process group has a timeout (``--dist-timeout``), so a rank waiting for a peer
that died raises instead of hanging; the launcher stops every rank as soon as one fails and
reports which rank failed (:func:`describe_failure`). Ctrl-C (or the launcher's SIGTERM)
makes every rank write its rows of the last finished round to its shard, as the simulator
writes its interrupt checkpoint. Either way the launcher then merges every round all ranks
wrote and removes the shards (:func:`salvage`): nothing after the last merged checkpoint is
lost that cannot be recomputed, and the same command resumes from it.

The launcher holds the run's writer lock (:mod:`privaudit.sim.runlock`) for the whole launch and
hands it to rank 0, which does all writing outside the shards.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import uuid
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from privaudit.core.config import RunConfig
from privaudit.core.errors import Interrupted, PrivauditError
from privaudit.core.interrupts import signals_deferred
from privaudit.core.messages import CaptureSpec, Tap
from privaudit.core.network import Links, Network
from privaudit.plugins import load_plugins, loaded_files
from privaudit.sim.loop import NO_RESUME
from privaudit.sim.run import Run
from privaudit.sim.rundir import SHARDS, RunDir

DEFAULT_TIMEOUT_S = 300.0  # seconds a rank waits for a peer before it calls the peer lost
# imported once by the fork server that starts the ranks: privaudit, the embedded dataset's
# readers, and torch._dynamo, which torch.func's first vmap(grad) imports (seconds per rank)
PRELOAD = [
    "privaudit.sim.distributed",
    "privaudit.sim.run",
    "skimage.io",
    "skimage.transform",
    "torch._dynamo",
]
LOST = "lost rank"  # marks a failure caused by another rank's failure
# signals whose handlers torch's elastic agent replaces (and does not restore)
HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


class PeerLost(PrivauditError):
    """A rank's point-to-point operation with a peer failed or timed out."""


def _first_line(exc: BaseException) -> str:
    """The first line of a transport error (gloo's can run to pages)."""
    return (str(exc).strip().splitlines() or [""])[0][:200]


class DistNetwork(Network):
    """One agent per rank; ``send`` is a batch of ``isend``/``irecv`` with the neighbours.

    Every rank calls ``send`` in the same sequence (the defense code is the same), so the
    call count is a tag shared by both ends of a link. ``stage_cpu`` moves CUDA rows through
    CPU buffers when the backend cannot (gloo with several ranks on one GPU)."""

    def __init__(
        self,
        adj: Tensor,
        W: Tensor,
        rank: int,
        tap: Tap | None = None,
        device: torch.device | str = "cpu",
        stage_cpu: bool = False,
    ):
        super().__init__(adj, W, [rank], tap, device)
        self.rank = rank
        self.calls = 0
        self.stage_cpu = stage_cpu

    def agree(self, stop: bool) -> bool:
        """One all-reduce of the ranks' stop requests (a Ctrl-C reaches the ranks at slightly
        different moments): every rank stops after the same round."""
        wire = torch.device("cpu") if self.stage_cpu else self.device
        flag = torch.tensor([int(stop)], device=wire)
        try:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        except RuntimeError as exc:
            raise PeerLost(
                f"rank {self.rank}: the check before round {self.round + 1} did not get "
                f"through ({_first_line(exc)})"
            ) from None
        return bool(flag.item())

    def _transfer(self, kind: str, per_out_edge: Tensor, links: Links) -> Tensor:
        self.calls += 1
        wire = torch.device("cpu") if self.stage_cpu else per_out_edge.device
        out = per_out_edge.detach().to(wire).contiguous()
        received = torch.empty((len(links.in_edges), *out.shape[1:]), dtype=out.dtype, device=wire)
        ops = [
            dist.P2POp(dist.isend, out[e], peer, tag=self.calls)
            for e, peer in enumerate(links.out_dst.tolist())
        ]
        ops += [
            dist.P2POp(dist.irecv, received[e], peer, tag=self.calls)
            for e, peer in enumerate(links.in_src.tolist())
        ]
        if ops:
            works = dist.batch_isend_irecv(ops)
            for op, work in zip(ops, works, strict=True):
                try:
                    work.wait()
                except RuntimeError as exc:
                    raise PeerLost(
                        f"rank {self.rank} {LOST} {op.peer}: the {kind} message of round "
                        f"{self.round} did not get through ({_first_line(exc)})"
                    ) from None
        received = received.to(per_out_edge.device)
        self.tap.record(self.round, kind, list(links.in_edges), received)
        return received


# -- the run directory: per-rank shards, merged by rank 0 ------------------------------------
def shard(rd: RunDir, rank: int) -> RunDir:
    """Rank ``rank``'s shard of the run directory (the same layout, its agent's rows only)."""
    return RunDir(rd.path / SHARDS / f"rank-{rank:05d}")


def merge_shards(rd: RunDir, ranks: int, upto: int) -> None:
    """Merge the shards' files of rounds ≤ ``upto`` into ``rd`` and delete them.

    Messages are unioned (with the links each rank tapped); secrets and checkpoint rows are
    stacked in agent order (0-dim state is shared: rank 0's is kept); RNG states are per
    agent already. A round is merged only once every rank has written its file."""
    shards = [shard(rd, r) for r in range(ranks)]

    def complete(what: str) -> list[int]:
        sets = [set(s.rounds(what)) for s in shards]
        return sorted(t for t in set.intersection(*sets) if t <= upto)

    for t in complete("messages"):
        msgs, links = {}, set()
        for s in shards:
            got, tapped = s.read_messages(t)
            msgs.update(got)
            links.update(tapped)
        rd.save_messages(t, msgs, links)
    for t in complete("secrets"):
        parts = [s.load_secrets(t) for s in shards]
        rd.save_secrets(t, {k: torch.cat([p[k] for p in parts]) for k in parts[0]})
    for t in complete("checkpoints"):
        parts = [s.load_checkpoint(t) for s in shards]
        blob: dict[str, Tensor] = {}
        for k, v in parts[0].items():
            if k.startswith("rng."):
                continue
            blob[k] = v if v.dim() == 0 else torch.cat([p[k] for p in parts])
        for p in parts:
            blob.update({k: v for k, v in p.items() if k.startswith("rng.")})
        rd.save_checkpoint(t, blob)
    for what in ("messages", "secrets", "checkpoints"):
        for t in complete(what):
            for s in shards:
                s.remove(what, t)


# -- one rank -------------------------------------------------------------------------------
def _env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        raise PrivauditError(
            f"{name} is not set: run this under torchrun or privaudit train "
            "--backend torch.distributed"
        ) from None


def rank() -> int:
    """This process's rank (0 outside a launcher)."""
    return int(os.environ.get("RANK", "0"))


def under_launcher() -> bool:
    """Whether this process is a rank started by torchrun / torch.distributed's launcher."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def _device_and_backend(device: str, local_rank: int, local_world: int) -> tuple[str, str, bool]:
    """(device, backend, stage through CPU): gloo on CPU; nccl with one GPU per rank; gloo
    through CPU buffers when a node has fewer GPUs than ranks (nccl cannot share a GPU)."""
    if not device.startswith("cuda"):
        return "cpu", "gloo", False
    if not torch.cuda.is_available():
        raise PrivauditError(
            "--device cuda was asked for but CUDA is not available; use --device cpu"
        )
    gpus = torch.cuda.device_count()
    if gpus >= local_world:
        return f"cuda:{local_rank}", "nccl", False
    return f"cuda:{local_rank % gpus}", "gloo", True


def train_rank(
    cfg: RunConfig,
    out: str | Path,
    capture: CaptureSpec | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: bool = True,
    launcher: int | None = None,
) -> None:
    """Run this process's rank of ``cfg`` to its last round (resuming from the last merged
    checkpoint); rank 0 creates the run directory and merges the shards, under the run's
    writer lock: its own, or the one the ``launcher`` process (its PID) holds and hands
    over."""
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world != cfg.agents:
        raise PrivauditError(
            f"{world} ranks for {cfg.agents} agents: the distributed backend runs one process "
            f"per agent; start {cfg.agents} ranks (--nproc {cfg.agents})"
        )
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    device, backend, stage = _device_and_backend(cfg.device, local_rank, local_world)
    if backend == "nccl":
        torch.cuda.set_device(device)
    rd = RunDir(out)
    if rank == 0 and launcher is not None:
        rd.adopt(launcher)
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    try:
        with rd.writer() if rank == 0 else nullcontext():
            _train_rank(cfg, rd, rank, world, capture, device, stage, progress)
    finally:
        dist.destroy_process_group()


def _train_rank(
    cfg: RunConfig,
    rd: RunDir,
    rank: int,
    world: int,
    capture: CaptureSpec | None,
    device: str,
    stage: bool,
    progress: bool,
) -> None:
    if rank == 0:
        Run.create(cfg, rd.path)
    dist.barrier()
    run = Run.open(rd.path, agents=[rank], device=device)
    store = shard(rd, rank)
    store.path.mkdir(parents=True, exist_ok=True)
    (store.path / "pid").write_text(f"{os.getpid()}\n")  # which process is this rank
    until = run.check_until(None)
    start = [run.start_round(until, capture)]
    dist.broadcast_object_list(start, src=0)  # every rank resumes from the same round
    state = run.restore(start[0])
    if start[0] < until:
        tap = Tap(capture or CaptureSpec(rounds=frozenset()))
        net = DistNetwork(run.ctx.adj, run.ctx.W, rank, tap, device, stage)

        def merge(t: int) -> None:
            dist.barrier()
            if rank == 0:
                merge_shards(rd, world, t)

        run.simulate(state, start[0], until, net, progress and rank == 0, store, merge)
    dist.barrier()
    if rank == 0:
        merge_shards(rd, world, until)
        shutil.rmtree(rd.path / SHARDS, ignore_errors=True)  # all merged


def _worker(
    cfg_json: str,
    out: str,
    rounds: list[int] | None,
    timeout_s: float,
    progress: bool,
    launcher: int,
    plugin_files: list[str],
):
    """The launcher's entry point (one call per rank); errors go to the launcher's report.
    The launcher's SIGTERM (its way to stop ranks) interrupts a rank as Ctrl-C does, so the
    rank writes its interrupt checkpoint. The rank first loads the launcher's plugins
    (installed entry points, and ``plugin_files``: a forked rank's environment is the fork
    server's, not the launcher's, so the files come as an argument)."""
    from torch.distributed.elastic.multiprocessing.errors import record

    signal.signal(signal.SIGTERM, signal.default_int_handler)
    record(load_plugins)(plugin_files, environment=False)
    capture = None if rounds is None else CaptureSpec.of(rounds=rounds)
    cfg = RunConfig.from_dict(json.loads(cfg_json))
    record(train_rank)(cfg, out, capture, timeout_s, progress, launcher)


# -- the launcher -----------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    cfg: RunConfig,
    out: str | Path,
    nproc: int | None = None,
    capture: CaptureSpec | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: bool = True,
) -> None:
    """Start one rank per agent on this machine (torch.distributed's launcher API) and train
    ``cfg`` to its last round; a failed rank stops all and raises one clear error."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    nproc = cfg.agents if nproc is None else nproc
    if nproc != cfg.agents:
        raise PrivauditError(
            f"--nproc {nproc} with --agents {cfg.agents}: the distributed backend runs one "
            f"process per agent; use --nproc {cfg.agents}"
        )
    if not timeout_s > 0:
        raise PrivauditError(f"--dist-timeout must be > 0 seconds, got {timeout_s}")
    rd = RunDir(out)
    with rd.writer():  # the ranks write under this process's lock (rank 0 adopts it)
        Run.create(cfg, out)  # config errors surface here, before any process starts
        lc = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=nproc,
            run_id=f"privaudit-{uuid.uuid4().hex[:8]}",
            rdzv_backend="c10d",
            rdzv_endpoint=f"127.0.0.1:{_free_port()}",
            max_restarts=0,
            monitor_interval=0.1,
            # a fork server started clean, with privaudit imported once, forks the ranks:
            # they start in a fraction of spawn's time, and never inherit the locks of this
            # (threaded) process as plain fork would
            start_method="forkserver",
        )
        multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
        rounds = None if capture is None or capture.rounds is None else sorted(capture.rounds)
        # the agent's report becomes one line: silence its loggers (each has its own level)
        quiet = [logging.getLogger("torch.distributed.elastic")] + [
            logging.getLogger(name)
            for name in list(logging.root.manager.loggerDict)
            if name.startswith("torch.distributed.elastic.")
        ]
        levels = [q.level for q in quiet]
        for q in quiet:
            q.setLevel(logging.CRITICAL)
        handlers = {sig: signal.getsignal(sig) for sig in HANDLED}  # the agent replaces them
        args = (cfg.to_json(), str(out), rounds, timeout_s, progress, os.getpid(), loaded_files())
        try:
            elastic_launch(lc, _worker)(*args)
        except ChildFailedError as e:
            salvage(rd, nproc)
            raise PrivauditError(describe_failure(e.failures, rd)) from None
        except (SignalException, KeyboardInterrupt):
            salvage(rd, nproc)
            last = max(rd.checkpoint_rounds(), default=0)
            raise Interrupted(
                "interrupted; run the same command again to resume from "
                f"{f'round {last}' if last else 'the start'} (the last checkpoint)"
            ) from None
        finally:
            for q, level in zip(quiet, levels, strict=True):
                q.setLevel(level)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)


def salvage(rd: RunDir, ranks: int) -> None:
    """After the ranks stopped: merge every round that all ranks wrote to their shards (an
    interrupt checkpoint among them), then delete the shards: a rerun resumes from the last
    merged checkpoint and writes its own."""
    with signals_deferred():
        merge_shards(rd, ranks, upto=10**12)
        shutil.rmtree(rd.path / SHARDS, ignore_errors=True)


def _message(failure: Any) -> str:
    m = failure.message
    if isinstance(m, dict):
        m = m.get("message", "")
    m = str(m or "").strip()
    return "" if m.startswith("To enable traceback") else m  # no error file: nothing said


def _peer_gone(message: str) -> bool:
    """A transport error that another rank's death causes (gloo's TCP pair)."""
    return any(m in message for m in ("Connection closed by peer", "Connection reset by peer"))


def describe_failure(failures: dict[int, Any], rd: RunDir) -> str:
    """One line for the launcher's failure report: the rank that caused it (killed by a
    signal other than the launcher's SIGTERM, else failed on its own, else named lost by a
    neighbour, else a rank whose connection broke), what happened to it, and where the run
    resumes."""

    def signal(f: Any) -> str:
        return f.signal_name() if f.exitcode < 0 else ""

    killed = [r for r, f in failures.items() if signal(f) not in ("", "SIGTERM")]
    own = [
        r
        for r, f in failures.items()
        if _message(f) and LOST not in _message(f) and not _peer_gone(_message(f))
    ]
    named = sorted(
        {int(_message(f).split(LOST, 1)[1].split()[0].rstrip(":")) for f in failures.values()}
        if any(LOST in _message(f) for f in failures.values())
        else set()
    )
    # a rank named lost but not among the failures (the launcher reports the first exit it
    # sees) may only have died of the same cause: then report the rank whose link broke
    gone = [r for r, f in failures.items() if _peer_gone(_message(f))]
    seen = [r for r in named if r in failures]
    culprit = (killed or own or seen or gone or named or sorted(failures))[0]
    f = failures.get(culprit)
    if f is None:
        how = "stopped responding"
    elif signal(f):
        how = f"was killed by {signal(f)}"
    elif _peer_gone(_message(f)):
        # the launcher reports the first exit it sees; when a killed rank and the rank that
        # noticed it are both gone by then, only the latter may be named
        how = "lost its connection to a peer that died (a rank was killed or crashed)"
    elif _message(f):
        how = f"failed: {_message(f).splitlines()[-1]}"
    else:
        how = f"exited with code {f.exitcode}"
    last = max(rd.checkpoint_rounds(), default=0)
    resume = f"round {last}" if last else "the start"
    if f is not None and NO_RESUME in _message(f):  # a divergence: a rerun meets it again
        return (
            f"rank {culprit} (agent {culprit}) {how}; the other ranks were stopped. Train into "
            f"a new --out, or delete {rd.path}"
        )
    return (
        f"rank {culprit} (agent {culprit}) {how}; the other ranks were stopped. "
        f"Run the same command again to resume from {resume} (the last checkpoint)"
    )
