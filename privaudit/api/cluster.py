"""Joining a Ray cluster and checking it before a study, so that a study on Ray fails at
once with one line naming the fix instead of hanging, or computing on the wrong files.

:class:`privaudit.api.executor.RayExecutor` calls these in order:

- :func:`connect`: ``--ray-address`` checked (a Ray Client ``ray://`` address is refused;
  a ``HOST:PORT`` must accept a TCP connection within :data:`CONNECT_TIMEOUT_S`, where Ray
  itself would wait for minutes), then ``ray.init``; a cluster started here runs its workers
  at :data:`WORKER_NICENESS` (:func:`start_options`, shared with ``benchmarks/executor.py``);
  a failure is one line, the token-authentication case (:func:`connect_error`) apart from a
  missing cluster;
- :func:`check_resources`: every task's CPUs and GPUs against the largest node that is up
  (Ray would otherwise wait for ever for a node that never comes);
- :func:`check_nodes`: one small task on every node a task may run on returns its code
  identity (:func:`privaudit.api.cache.producer`) and whether it sees a probe file the
  driver wrote under the study's output folder: a node running other code, or one that
  does not share the output folder, is refused by name before any work starts;
- :class:`Heartbeat`: during the study, whether the head node still answers; a lost head
  ends the study with :class:`ClusterLost` (finished cells are in the cache) instead of
  Ray's own exit of the whole process a minute later.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from privaudit.api import cache
from privaudit.core.errors import PrivauditError

__all__ = [
    "ADDRESS",
    "WORKER_NICENESS",
    "CONNECT_TIMEOUT_S",
    "CHECK_TIMEOUT_S",
    "LOST_AFTER_S",
    "ClusterLost",
    "check_address",
    "start_options",
    "check_reachable",
    "connect",
    "connect_error",
    "alive_nodes",
    "fitting",
    "check_resources",
    "check_nodes",
    "node_report",
    "Heartbeat",
    "quiet_shutdown",
]

# what --ray-address accepts: Ray's "auto" (a Ray process on this machine) or a head's
# HOST:PORT; a Ray Client address ray://HOST:PORT is recognised to be refused in one line
ADDRESS = re.compile(r"auto|(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d{1,5}")
# the niceness of the workers of a cluster privaudit starts (Ray's own default is 15): the
# local executor's process runs at 0, so a study competes alike for the cores either way;
# benchmarks/executor.py starts its cluster with the same setting (start_options)
WORKER_NICENESS = 0
CONNECT_TIMEOUT_S = 5.0  # for the head's TCP port to accept a connection
CHECK_TIMEOUT_S = 300.0  # for every node to answer check_nodes (a first worker imports torch)
LOST_AFTER_S = 5.0  # the head refusing connections this long: the cluster is lost
# what Ray's errors say when the cluster wants a token (RAY_AUTH_MODE=token) it was not given
_AUTH = re.compile(r"AuthenticationError|InvalidAuthToken|Unauthenticated|authentication token")


class ClusterLost(PrivauditError):
    """The head node of the Ray cluster stopped answering during a study."""


def check_address(address: str | None, flag: str = "--ray-address") -> None:
    """Refuse an address privaudit cannot join, before any work (``flag``: where it came
    from): not ``auto`` or ``HOST:PORT``, or a Ray Client address (``ray://``), whose
    connection has no node of its own for the checks and the cancellation a study needs."""
    if address is None:
        return
    if not ADDRESS.fullmatch(address):
        raise PrivauditError(
            f"{flag} must be auto or HOST:PORT, got {address!r}; leave it out to start a "
            "cluster here"
        )
    if address.startswith("ray://"):
        raise PrivauditError(
            f"{flag} {address} is a Ray Client address, which privaudit cannot use; pass "
            f"the head node's HOST:PORT instead (--ray-address {address[6:]} if that is its "
            "GCS port, 6379 unless `ray start --head --port` chose another)"
        )


def start_options() -> dict[str, Any]:
    """The ``ray.init`` options of a cluster this process starts (not of one it joins):
    workers at :data:`WORKER_NICENESS`."""
    return {"_system_config": {"worker_niceness": WORKER_NICENESS}}


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``HOST:PORT`` (``[v6]:PORT`` too); None for ``auto``/``local``."""
    m = re.fullmatch(r"\[?(.+?)\]?:(\d{1,5})", address)
    return (m.group(1), int(m.group(2))) if m else None


def _unreachable(host: str, port: int, timeout: float) -> str | None:
    """Why ``host:port`` refuses a TCP connection within ``timeout`` seconds, or None."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__
    return None


def check_reachable(address: str | None) -> str:
    """Refuse, within :data:`CONNECT_TIMEOUT_S`, a ``HOST:PORT`` (given, or in
    ``RAY_ADDRESS`` when ``address`` is None) where nothing accepts a TCP connection (Ray
    would wait for minutes); the cluster's name for messages."""
    check_address(address)
    named = address or os.environ.get("RAY_ADDRESS") or None
    if address is None and named not in (None, "local"):
        check_address(named, "RAY_ADDRESS")
    where = address or (f"RAY_ADDRESS={named}" if named else "this machine")
    target = _host_port(named) if named else None
    if target is not None:
        why = _unreachable(*target, CONNECT_TIMEOUT_S)
        if why is not None:
            raise PrivauditError(
                f"nothing answers at {where} ({why}); start a Ray head there with "
                f"`ray start --head --port={target[1]}`, or leave out --ray-address (and "
                "RAY_ADDRESS) to start a cluster on this machine"
            )
    return where


def connect(ray: Any, address: str | None) -> bool:
    """Join the cluster at ``address`` (None: ``RAY_ADDRESS``, a ``ray start`` on this
    machine, else a new cluster here, with :func:`start_options`); whether this call
    connected (False: Ray was initialised already, its cluster is used). A ``HOST:PORT``
    must answer first (:func:`check_reachable`). Ray's driver installs its own
    SIGINT/SIGTERM handlers: the caller's come back."""
    if ray.is_initialized():
        return False
    where = check_reachable(address)
    named = address or os.environ.get("RAY_ADDRESS") or None
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    kw: dict[str, Any] = {
        "address": address,
        "include_dashboard": False,
        "logging_level": logging.WARNING,
    }
    try:
        if named is None or named == "local":  # may start a cluster: ours runs at our nice
            try:
                ray.init(**kw, **start_options())
            except ValueError as e:  # it found one to join, whose settings are its own
                if "_system_config" not in str(e):
                    raise
                ray.init(**kw)
        else:
            with _quiet_driver():
                ray.init(**kw)
    except (ConnectionError, RuntimeError) as e:
        raise connect_error(e, where) from None
    finally:
        for s, h in saved.items():
            if h is not None:
                signal.signal(s, h)
    return True


def _chain(e: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def connect_error(e: BaseException, where: str) -> PrivauditError:
    """The one line for ``ray.init``'s failure ``e`` to join ``where``: a cluster that wants
    a token it was not given (Ray's token authentication: the cluster exists) apart from no
    cluster at all."""
    if any(_AUTH.search(f"{type(x).__name__}: {x}") for x in _chain(e)):
        return PrivauditError(
            f"the Ray cluster at {where} wants a token (Ray's token authentication) and this "
            "process gave it none or the wrong one; set RAY_AUTH_MODE=token, with the "
            "cluster's token in RAY_AUTH_TOKEN, in the file RAY_AUTH_TOKEN_PATH names, or in "
            "~/.ray/auth_token (`ray get-auth-token` on the head prints it)"
        )
    return PrivauditError(
        f"no Ray cluster at {where} ({_first_line(e)}); start one with `ray start --head`, or "
        "leave out --ray-address to start one here"
    )


# -- what the cluster holds ---------------------------------------------------------------------
def alive_nodes(ray: Any) -> list[dict[str, Any]]:
    """The nodes that are up (``ray.nodes()``), each with its ``NodeID``,
    ``NodeManagerAddress`` and ``Resources``."""
    return [n for n in ray.nodes() if n.get("Alive")]


def fitting(nodes: list[dict[str, Any]], cpus: float, gpus: float) -> list[dict[str, Any]]:
    """The nodes of ``nodes`` that have ``cpus`` CPUs and ``gpus`` GPUs (in all, free or
    not): where a task that reserves them may run."""
    return [
        n
        for n in nodes
        if n.get("Resources", {}).get("CPU", 0.0) >= cpus
        and n.get("Resources", {}).get("GPU", 0.0) >= gpus
    ]


def check_resources(
    nodes: list[dict[str, Any]], requests: Iterable[tuple[float, float, str]]
) -> None:
    """Refuse, before anything is submitted, a task no node that is up can hold:
    ``requests`` are ``(cpus, gpus, why)`` per task, ``why`` the flag that set the GPUs
    (``--cell-gpus N`` or ``--device cuda``). Ray would wait for ever for such a node."""
    cpu = max((n.get("Resources", {}).get("CPU", 0.0) for n in nodes), default=0.0)
    gpu = max((n.get("Resources", {}).get("GPU", 0.0) for n in nodes), default=0.0)
    largest = f"{cpu:g} CPUs and {gpu:g} GPUs"
    for cpus, gpus, why in dict.fromkeys(requests):
        if fitting(nodes, cpus, gpus):
            continue
        if cpus > cpu:
            raise PrivauditError(
                f"each Ray task reserves {cpus:g} CPUs (--cell-cpus {cpus:g}) but the largest "
                f"node of the cluster has {largest}, so no task would ever start; pass "
                f"--cell-cpus {cpu:g} or less, or add a node with more CPUs"
            )
        if gpu == 0:
            raise PrivauditError(
                f"each Ray task needs {gpus:g} GPU ({why}) but no node of the Ray cluster has a "
                f"GPU (the largest: {largest}), so no task would ever start; use --device cpu "
                "and --cell-gpus 0, or join a cluster with GPUs (`ray start --num-gpus N`)"
            )
        raise PrivauditError(
            f"each Ray task reserves {cpus:g} CPUs and {gpus:g} GPUs ({why}) but no node of "
            f"the cluster has both (the largest: {largest}), so no task would ever start; "
            "lower --cell-cpus or --cell-gpus, or add a larger node"
        )


# -- every node: the same code, the same files --------------------------------------------------
def node_report(
    setup: Callable[[], None] | None, expected: dict[str, Any], probe: str | None, token: str
) -> dict[str, Any]:
    """Run on one node by :func:`check_nodes`: load what a task loads (``setup``: plugins),
    then say whether this node runs the driver's code (``expected``, its producer: the
    refusal :func:`privaudit.api.cache.require` gives, or None) and whether it reads
    ``token`` from the file ``probe`` (None: nothing to probe)."""
    if setup is not None:
        setup()
    mismatch = None
    try:
        cache.require(expected)
    except PrivauditError as e:
        mismatch = str(e)
    sees = None
    if probe is not None:
        try:
            sees = Path(probe).read_text() == token
        except OSError:
            sees = False
    return {"host": socket.gethostname(), "mismatch": mismatch, "sees": sees}


def _name(node: dict[str, Any], host: str | None = None) -> str:
    """``node IP (host, id 1a2b3c4d)``: the IP and the short id ``ray status`` and ``ray list
    nodes`` show (two nodes may share an IP)."""
    ip = node.get("NodeManagerAddress", "?")
    about = [host] if host and host != ip else []
    about.append(f"id {str(node.get('NodeID', '?'))[:8]}")
    return f"node {ip} ({', '.join(about)})"


def check_nodes(
    ray: Any,
    nodes: list[dict[str, Any]],
    setup: Callable[[], None] | None,
    producer: dict[str, Any],
    shared: Path | None,
    timeout: float = CHECK_TIMEOUT_S,
) -> None:
    """Run :func:`node_report` on each of ``nodes`` (pinned there by node affinity, with no
    CPU reserved, so it runs beside anything) and refuse, naming the node, one that runs
    other code than this driver (``producer``) or does not see the file this driver wrote
    under ``shared`` (the folder every task writes into): its cells would be computed by
    other code, or written where this driver never looks."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    token = secrets.token_hex(16)
    probe = None
    if shared is not None:
        shared.mkdir(parents=True, exist_ok=True)
        probe = shared / f".privaudit-probe-{token[:12]}"
        probe.write_text(token)
    try:
        remote = ray.remote(num_cpus=0, max_retries=1)(node_report)
        refs = {
            remote.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
                name="privaudit: node check",
            ).remote(setup, producer, None if probe is None else str(probe), token): n
            for n in nodes
        }
        answers = _gather(ray, refs, timeout)
    finally:
        if probe is not None:
            probe.unlink(missing_ok=True)
    _refuse(shared, [(node, answers[ref]) for ref, node in refs.items()])


def _refuse(shared: Path | None, answers: list[tuple[dict[str, Any], Any]]) -> None:
    """The first problem among the nodes' answers to :func:`node_report`, as one line: a
    node that could not answer, then one that does not see ``shared``, then one that runs
    other code."""
    for node, got in answers:
        if isinstance(got, BaseException):
            raise PrivauditError(
                f"{_name(node)} could not run privaudit's check ({_first_line(got)}); install "
                "the same privaudit, torch and plugins on every node of the cluster"
            )
    for node, got in answers:
        if got["sees"] is False:
            raise PrivauditError(
                f"{_name(node, got['host'])} cannot see {shared} (a file this driver wrote "
                "there is missing on that node); put --out on storage every node shares (NFS, "
                "a shared volume) at the same path, and run the same command again"
            )
    for node, got in answers:
        if got["mismatch"]:
            raise PrivauditError(f"{_name(node, got['host'])}: {got['mismatch']}")


def _gather(ray: Any, refs: dict[Any, dict[str, Any]], timeout: float) -> dict[Any, Any]:
    """Each ref's value, or the exception ``ray.get`` raised for it; a node that has not
    answered within ``timeout`` seconds is refused by name. Waits in short steps, so that
    Ctrl-C stays prompt."""
    deadline = time.monotonic() + timeout
    out: dict[Any, Any] = {}
    pending = list(refs)
    while pending:
        if time.monotonic() > deadline:
            raise PrivauditError(
                f"{_name(refs[pending[0]])} did not answer privaudit's check within "
                f"{timeout:g} s; check that the node is up and not overloaded (`ray status`)"
            )
        ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
        for ref in ready:
            try:
                out[ref] = ray.get(ref)
            except Exception as e:  # the node died, or its privaudit could not run the check
                out[ref] = getattr(e, "cause", None) or e
    return out


# -- during a study -----------------------------------------------------------------------------
class Heartbeat:
    """Whether the head node at ``address`` (its GCS, ``HOST:PORT``) still accepts a TCP
    connection: checked at most every ``every`` seconds; :meth:`lost` once it has accepted
    none for ``patience`` seconds. Ray's driver would otherwise wait, then end the whole
    process a minute later with a log line of its own."""

    def __init__(self, address: str | None, every: float = 1.0, patience: float = LOST_AFTER_S):
        self.target = _host_port(address) if address else None
        self.every = every
        self.patience = patience
        self.answered = self.checked = time.monotonic()

    def lost(self) -> bool:
        """Whether the head has stopped answering (checking it now if it is time)."""
        now = time.monotonic()
        if self.target is None or now - self.checked < self.every:
            return False
        self.checked = now
        if _unreachable(*self.target, min(self.every, 1.0)) is None:
            self.answered = time.monotonic()
            return False
        return time.monotonic() - self.answered >= self.patience


@contextlib.contextmanager
def _quiet_driver() -> Iterator[None]:
    """Around ``ray.init`` joining a cluster: this driver's C++ core logs only fatal errors
    (``RAY_BACKEND_LOG_LEVEL``, read once as it starts, unless the user set it), with file
    descriptor 2 silenced meanwhile (Ray says so there, and repeats each failed attempt to
    connect). Its failures are privaudit's one line; a cluster lost later would otherwise
    add C++ lines of its own before it."""
    user = os.environ.get("RAY_BACKEND_LOG_LEVEL")
    if user is None:
        os.environ["RAY_BACKEND_LOG_LEVEL"] = "fatal"
    try:
        with _stderr_silenced():
            yield
    finally:
        if user is None:
            os.environ.pop("RAY_BACKEND_LOG_LEVEL", None)


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """File descriptor 2 to /dev/null (Ray's C++ logs write there, not to ``sys.stderr``)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def quiet_shutdown(ray: Any) -> None:
    """Disconnect from a cluster whose head is gone, without the C++ log lines Ray writes
    while it gives up on it; a driver left connected would be ended by Ray later."""
    with _stderr_silenced():
        ray.shutdown()
