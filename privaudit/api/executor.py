"""Where the cells of a multi-cell study run: in this process, or as tasks on a Ray cluster.

A study (``privaudit compare``: targets × rounds × ε × seeds) is a small graph of
:class:`Task` s: the training of each run, then the attacks of its cells, which depend on it
(and its audit). Every task is a pure function of its canonical configuration and writes its
result into the content-addressed cache under ``--out``, keyed by the digest the cache
already uses (:func:`privaudit.core.files.digest`; the code that computed an entry is
checked apart: :mod:`privaudit.api.cache`): the executor only decides *where* a task runs.
A Ray worker whose privaudit, torch or plugins differ from the driver's refuses every task
with one line naming both (:func:`privaudit.api.cache.require`). Two implement :class:`Executor`:

- :class:`LocalExecutor`, the default: every task in this process, one after the other, in
  the order given; the first error ends the study (what ``privaudit compare`` always did).
- :class:`RayExecutor`: every task as a Ray task (``ray`` is imported only here, when it is
  used): a run is trained by one task, once, and its attacks receive that task's ObjectRef,
  so they start when it is done and never train it a second time; tasks get ``cell_cpus``
  CPUs and ``cell_gpus`` GPUs (a whole GPU per task that uses CUDA by default), a worker
  that held a GPU is recycled after one task (``max_calls=1``, so no CUDA memory outlives
  its cell), and a task whose worker was killed (preempted, out of memory) is retried
  ``max_retries`` times. A failed task is reported with its label and error line while the
  others finish; Ctrl-C cancels what has not finished and keeps what has. Before anything
  is submitted the cluster is checked (:mod:`privaudit.api.cluster`: the address answers,
  every task fits on a node, every node runs the driver's code and sees the study's
  folder), and a head node lost during the study ends it with one line.

The cache is safe for any number of concurrent writers (:func:`commit_folder`): an entry is
written in a hidden temporary folder and renamed into place in one step, so a reader sees
a complete entry or none, two workers racing on one entry leave one complete entry, and a
killed worker leaves only a hidden temporary folder, removed by the next writer of that
entry or at the end of the study (:func:`remove_stale`).
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from privaudit.api import cache, cluster
from privaudit.core.errors import Interrupted, PrivauditError

__all__ = [
    "Task",
    "TaskFailed",
    "Executor",
    "LocalExecutor",
    "RayExecutor",
    "RAY_MISSING",
    "commit_folder",
    "remove_stale",
]

RAY_MISSING = '--executor ray needs Ray: pip install "privaudit[ray]"'


@dataclass(frozen=True)
class Task:
    """One unit of a study: ``fn(*args, *results of depends)``.

    ``key``: unique within the study (a cell's cache folder, a run's folder); ``depends``:
    the keys of tasks that must finish first, whose results are passed after ``args`` (every
    one of them must come earlier in the list handed to :meth:`Executor.run`). ``cell``:
    whether the task is one of the study's cells (counted on the progress bar) or a
    prerequisite of some (a training run). ``gpus``: the GPUs it needs where the executor
    is not told (1 for a task on CUDA, 0 otherwise). ``fn`` and ``args`` must pickle (a
    module-level function; plain data) for an executor that runs it elsewhere.
    """

    key: str
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    depends: tuple[str, ...] = ()
    label: str = ""
    cell: bool = True
    gpus: float = 0.0


@dataclass(frozen=True)
class TaskFailed:
    """What a task that could not finish yields in place of its result: its one error line
    (or, for a task whose prerequisite failed, that prerequisite's)."""

    task: Task
    error: str

    def line(self) -> str:
        return f"failed: {self.task.label}: {self.error}"


class Executor(Protocol):
    """Runs a study's tasks and yields ``(task, result)`` as each finishes; with
    ``keeps_going`` a task's failure is yielded as a :class:`TaskFailed` (and its
    dependents' too) while the others run on, otherwise its exception propagates at once.
    ``parallel``: tasks of one study may run at the same time, in other processes (a task
    that hands files to later ones must then write them all before it returns)."""

    keeps_going: bool
    parallel: bool

    def run(
        self,
        tasks: Sequence[Task],
        *,
        progress: bool = True,
        cached: int = 0,
        on_start: Callable[[Task], None] | None = None,
    ) -> Iterator[tuple[Task, Any]]: ...


def _check_order(tasks: Sequence[Task]) -> None:
    seen: set[str] = set()
    for t in tasks:
        if t.key in seen:
            raise ValueError(f"two tasks share the key {t.key!r}")
        missing = [d for d in t.depends if d not in seen]
        if missing:
            raise ValueError(f"task {t.key!r} depends on {missing}, which do not come before it")
        seen.add(t.key)


class LocalExecutor:
    """Every task in this process, in the order given: the behaviour of a study before
    executors existed, and the default. ``on_start(task)`` is called before each task (a
    caller's progress line), and ``progress``/``cached`` are unused: the tasks draw their
    own bars here."""

    keeps_going = False
    parallel = False

    def run(
        self,
        tasks: Sequence[Task],
        *,
        progress: bool = True,
        cached: int = 0,
        on_start: Callable[[Task], None] | None = None,
    ) -> Iterator[tuple[Task, Any]]:
        _check_order(tasks)
        results: dict[str, Any] = {}
        needed = {d for t in tasks for d in t.depends}
        for t in tasks:
            if on_start is not None:
                on_start(t)
            result = t.fn(*t.args, *(results[d] for d in t.depends))
            if t.key in needed:
                results[t.key] = result
            yield t, result


def _call(
    threads: int | None,
    setup: Callable[[], None] | None,
    producer: dict[str, Any] | None,
    task: Task,
    *deps: Any,
) -> Any:
    """A task as it runs in a Ray worker: the driver's torch thread count (the same kernels,
    so the same floating-point sums, as a local run), the caller's ``setup`` (e.g. loading
    plugins), the check that this worker runs the driver's code (``producer``), then the
    task."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    if setup is not None:
        setup()
    if producer is not None:
        cache.require(producer)
    return task.fn(*task.args, *deps)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise PrivauditError(RAY_MISSING) from None
    return ray


def _error_line(e: BaseException) -> str:
    """One line for a task's failure: the exception a task raised (unwrapped from Ray's),
    or what killed its worker."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException) and cause is not e:
        e = cause
    if isinstance(e, PrivauditError):
        text = str(e)
    else:
        name = type(e).__name__
        text = f"{name}: {e}" if "Worker" not in name and "Actor" not in name else str(e)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


class RayExecutor:
    """Every task as a Ray task on the cluster at ``address``.

    ``address``: None finds a running cluster (``RAY_ADDRESS``, or the latest ``ray start``
    on this machine) or starts one on this machine; ``"auto"`` must find one; ``HOST:PORT``
    connects to that head node (which must answer within seconds: :func:`cluster.connect`).
    A cluster this executor started is shut down when the study ends; one it joined is left
    running. ``cell_cpus``/``cell_gpus``: what each task reserves (``cell_gpus`` None: a
    whole GPU for each task that runs on CUDA, none otherwise), checked against the nodes
    that are up before anything is submitted. ``max_calls``: tasks a worker runs before it
    is replaced (None: 1 for a task that holds a GPU, so no CUDA memory outlives its cell,
    and unlimited otherwise, as a CPU worker's start — importing torch — costs seconds).
    ``max_retries``: how often a task whose worker died is run again (a task that raises is
    not: it would raise again). ``setup``: called in the worker before each task (it must
    pickle: e.g. a :func:`functools.partial` of a module-level function). ``threads``:
    torch's CPU threads in the workers (None: this process's). ``shared``: the folder every
    task writes into (a study's ``--out``), made absolute here; before a study, every node
    must read back a probe file written there and run this process's code
    (:func:`cluster.check_nodes`). Where Ray is already initialised in this process
    (``ray.init(num_cpus=2)``: a cluster of one's own making), its cluster is used and
    ``address`` is not looked at.
    """

    keeps_going = True
    parallel = True

    def __init__(
        self,
        address: str | None = None,
        cell_cpus: float = 1.0,
        cell_gpus: float | None = None,
        max_calls: int | None = None,
        max_retries: int = 3,
        setup: Callable[[], None] | None = None,
        threads: int | None = None,
        shared: str | Path | None = None,
    ) -> None:
        _import_ray()  # refuse at once, before any work, where Ray is not installed
        if not (math.isfinite(cell_cpus) and cell_cpus > 0):
            raise PrivauditError(f"--cell-cpus must be a number > 0, got {cell_cpus:g}")
        if cell_gpus is not None and not (math.isfinite(cell_gpus) and cell_gpus >= 0):
            raise PrivauditError(f"--cell-gpus must be a number ≥ 0, got {cell_gpus:g}")
        cluster.check_reachable(address)  # a head that is not there: refused before any work
        if max_retries < 0:
            raise PrivauditError(f"max_retries must be ≥ 0, got {max_retries}")
        if threads is None:
            import torch

            threads = torch.get_num_threads()
        self.address = address
        self.cell_cpus = cell_cpus
        self.cell_gpus = cell_gpus
        self.max_calls = max_calls
        self.max_retries = max_retries
        self.setup = setup
        self.threads = threads
        self.shared = None if shared is None else Path(shared).expanduser().absolute()
        self.producer = cache.producer()  # the driver's code and plugins, loaded by now

    # -- the cluster ------------------------------------------------------------------------
    def options(self, task: Task) -> dict[str, Any]:
        """The Ray task options of ``task``."""
        gpus = task.gpus if self.cell_gpus is None else self.cell_gpus
        calls = self.max_calls if self.max_calls is not None else (1 if gpus > 0 else 0)
        return {
            "num_cpus": self.cell_cpus,
            "num_gpus": gpus,
            "max_calls": calls,  # a setting of ray.remote, not of .options: see _submit
            "max_retries": self.max_retries,
            "retry_exceptions": False,
            "name": (task.label or task.key)[:100],
        }

    def check(self, ray: Any, tasks: Sequence[Task]) -> None:
        """Before anything is submitted: every task fits on a node that is up, and every
        node a task may run on runs this process's code and sees :attr:`shared`."""
        nodes = cluster.alive_nodes(ray)
        why = "--device cuda" if self.cell_gpus is None else f"--cell-gpus {self.cell_gpus:g}"
        requests = [(self.cell_cpus, self.options(t)["num_gpus"], why) for t in tasks]
        cluster.check_resources(nodes, requests)
        usable = cluster.fitting(nodes, self.cell_cpus, min(r[1] for r in requests))
        cluster.check_nodes(ray, usable, self.setup, self.producer, self.shared)

    @staticmethod
    def _cancel(ray: Any, pending: dict[Any, Task]) -> None:
        """Cancel every task not finished: those waiting never start, those running get a
        KeyboardInterrupt (their cache entries are written whole or not at all)."""
        for ref in pending:
            try:
                ray.cancel(ref, force=False, recursive=True)
            except Exception:  # already finished, or its worker already gone
                pass

    # -- a study ----------------------------------------------------------------------------
    def run(
        self,
        tasks: Sequence[Task],
        *,
        progress: bool = True,
        cached: int = 0,
        on_start: Callable[[Task], None] | None = None,
    ) -> Iterator[tuple[Task, Any]]:
        """Check the cluster (:meth:`check`), submit every task at once (each
        prerequisite's ObjectRef passed to the tasks that need it) and yield each as it
        finishes, under one bar over the study's cells: done, running, cached (``cached``:
        cells found in the cache, not submitted) and failed. ``on_start`` is not called:
        where a task starts is the cluster's choice. A head node lost during the study ends
        it with :class:`cluster.ClusterLost`."""
        _check_order(tasks)
        ray = _import_ray()
        started = cluster.connect(ray, self.address)
        lost = False
        try:
            if tasks:
                self.check(ray, tasks)
            yield from self._run(ray, tasks, progress, cached)
        except cluster.ClusterLost:
            lost = True
            raise
        finally:
            if lost:
                cluster.quiet_shutdown(ray)
            elif started:
                ray.shutdown()

    def _submit(self, ray: Any, tasks: Sequence[Task]) -> dict[Any, Task]:
        """Submit every task, in order; each one's ObjectRef → the task."""
        remotes: dict[int, Any] = {}  # max_calls → the remote function
        refs: dict[str, Any] = {}
        pending: dict[Any, Task] = {}
        for t in tasks:
            opts = self.options(t)
            calls = opts.pop("max_calls")
            if calls not in remotes:
                remotes[calls] = ray.remote(max_calls=calls)(_call)
            deps = [refs[d] for d in t.depends]
            ref = (
                remotes[calls]
                .options(**opts)
                .remote(self.threads, self.setup, self.producer, t, *deps)
            )
            refs[t.key] = ref
            pending[ref] = t
        return pending

    def _run(
        self, ray: Any, tasks: Sequence[Task], progress: bool, cached: int
    ) -> Iterator[tuple[Task, Any]]:
        pending = self._submit(ray, tasks)
        cells = sum(t.cell for t in tasks)
        slots = max(1, int(ray.cluster_resources().get("CPU", 1) // self.cell_cpus))
        finished: set[str] = set()
        failed: dict[str, str] = {}
        count = {"done": 0, "failed": 0}
        head = cluster.Heartbeat(getattr(ray.get_runtime_context(), "gcs_address", None))
        bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),  # stdout keeps only the tables
            disable=not progress,
            transient=True,
        )
        bar_task = bar.add_task("cells", total=cells + cached)

        def describe() -> str:
            ready = sum(1 for t in pending.values() if all(d in finished for d in t.depends))
            return (
                f"cells: {count['done']} done, {min(ready, slots)} running, {cached} cached, "
                f"{count['failed']} failed"
            )

        def kept() -> str:
            return f"{count['done'] + cached} of {cells + cached} cells finished and kept"

        bar.update(bar_task, completed=cached, description=describe())
        with bar:
            try:
                while pending:
                    for ref in self._wait(ray, pending, head, kept):
                        t = pending.pop(ref)
                        result = self._result(ray, ref, t, failed)
                        finished.add(t.key)
                        if t.cell:
                            count["failed" if isinstance(result, TaskFailed) else "done"] += 1
                            bar.advance(bar_task)
                        bar.update(bar_task, description=describe())
                        yield t, result
                    bar.update(bar_task, description=describe())
            except GeneratorExit:  # the caller stopped reading (its own error, a Ctrl-C)
                self._cancel(ray, pending)
                raise
            except KeyboardInterrupt:
                self._cancel(ray, pending)
                raise Interrupted(
                    f"interrupted: {kept()} in the cache, the rest cancelled; run the same "
                    "command again to resume"
                ) from None

    @staticmethod
    def _wait(
        ray: Any, pending: dict[Any, Task], head: cluster.Heartbeat, kept: Callable[[], str]
    ) -> list[Any]:
        """The refs of ``pending`` that finished within half a second (so that Ctrl-C stays
        prompt); :class:`cluster.ClusterLost` when the head node no longer answers."""
        why = None
        try:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
        except (ConnectionError, ray.exceptions.RaySystemError) as e:
            ready, why = [], _error_line(e)
        if why is None and not head.lost():
            return ready
        where = f" at {':'.join(map(str, head.target))}" if head.target else ""
        raise cluster.ClusterLost(
            f"lost the Ray cluster: its head node{where} no longer answers"
            f"{f' ({why})' if why else ''}; {kept()} in the cache; start the cluster again "
            "and run the same command to resume"
        )

    @staticmethod
    def _result(ray: Any, ref: Any, t: Task, failed: dict[str, str]) -> Any:
        """The finished task's result, or a :class:`TaskFailed` for it (recorded in
        ``failed``): its error, or that of the prerequisite it could not run without."""
        try:
            return ray.get(ref)
        except Exception as e:  # a task's error, or its worker died
            upstream = [failed[d] for d in t.depends if d in failed]
            why = f"not run: {upstream[0]}" if upstream else _error_line(e)
            failed[t.key] = why if upstream else f"{t.label}: {why}"
            return TaskFailed(t, why)


# -- the cache ------------------------------------------------------------------------------
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def _temporary(name: str | None) -> re.Pattern[str]:
    """The names of the temporary folders of entry ``name`` (None: of any entry):
    ``.NAME.<host>-<pid>.<random>.tmp``."""
    head = re.escape(f".{name}.") if name is not None else r"\..+\."
    return re.compile(head + r"([0-9a-f]{8})-(\d+)\.[^/]*\.tmp")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(folder: Path, name: str | None = None) -> int:
    """Remove the temporary folders in ``folder`` (of the entry ``name`` only, if given)
    that a writer on this machine left when it was killed (its process is gone); return how
    many. A writer on another machine is left alone (its process cannot be seen from here):
    its folder is hidden, and no reader looks at it."""
    pattern = _temporary(name)
    removed = 0
    try:
        entries = list(folder.iterdir())
    except OSError:
        return 0
    for p in entries:
        m = pattern.fullmatch(p.name)
        if m and m.group(1) == _HOST and not _alive(int(m.group(2))):
            shutil.rmtree(p, ignore_errors=True)
            removed += 1
    return removed


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_folder(final: Path, write: Callable[[Path], None], marker: str) -> bool:
    """Write a cache entry, the folder ``final``, all at once: ``write(tmp)`` fills a hidden
    temporary folder beside it, whose files are synced to disk and which is then renamed to
    ``final``. A reader sees a complete entry (with its ``marker`` file) or none; a killed
    writer leaves only its temporary folder (:func:`remove_stale`).

    Returns False when another writer committed a complete ``final`` first (its entry is
    kept and this one dropped: a cell is a pure function of its key, so both hold the same);
    a ``final`` without its marker (left by an older writer) is replaced."""
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(final.parent, final.name)
    prefix = f".{final.name}.{_HOST}-{os.getpid()}."
    tmp = Path(tempfile.mkdtemp(suffix=".tmp", prefix=prefix, dir=final.parent))
    try:
        os.chmod(tmp, 0o777 & ~_UMASK)  # mkdtemp's 0700, widened as mkdir would make it
        write(tmp)
        for p in tmp.iterdir():
            _fsync(p)
        _fsync(tmp)
        for _ in range(3):
            try:
                os.rename(tmp, final)  # atomic; refuses a non-empty final
                _fsync(final.parent)
                return True
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
            if (final / marker).exists():
                return False  # another writer's complete entry
            aside = tmp.with_name(tmp.name[: -len(".tmp")] + "-old.tmp")
            try:
                os.rename(final, aside)  # an incomplete entry: set it aside, ours goes in
            except FileNotFoundError:
                pass
            shutil.rmtree(aside, ignore_errors=True)
        raise PrivauditError(f"could not write {final}: other writers keep replacing it")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
