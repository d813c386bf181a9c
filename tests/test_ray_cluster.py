"""Studies on a Ray cluster that was joined, not started (:mod:`privaudit.api.cluster`): a
real head started with ``ray start --head`` in a folder of its own, and, for the last tests,
a second node that sees other files than the driver (its own mount namespace: ``--out``
hidden under a tmpfs, a privaudit source file replaced by an edited copy).

Each failure is one ``privaudit: error:`` line naming the fix, exit status 2, within
seconds: a relative ``--out`` (written where the driver looks), an address nothing listens
at, a Ray Client address, a cluster that wants a token, resources no node has, a node that
cannot see ``--out``, a node running other code, and a head node lost during a study.

Every Ray process a test starts runs in a session of its own and is stopped by its process
group, never with ``ray stop`` (which stops every Ray process of the user on the machine).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from privaudit.api import cluster
from privaudit.api.executor import RayExecutor, Task
from privaudit.cli import main
from privaudit.core.errors import PrivauditError

pytest.importorskip("ray")

RAY = str(Path(sys.executable).with_name("ray"))
COMPARE = ["compare", "--targets", "nd-cg", "--rounds", "1", "--epsilons", "1", "--agents", "3"]
COMPARE += ["--victims", "1", "--batch-size", "2", "--iterations", "2", "--no-progress"]


class TookTooLong(BaseException):
    """Raised by :func:`within` (a BaseException, so no ``except Exception`` takes it)."""


@contextlib.contextmanager
def within(seconds: float):
    """Fail the body if it runs longer than ``seconds``: what hung before now ends."""

    def expire(*_):
        raise TookTooLong(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TEMP: dict[int, str] = {}  # a ray start's process group -> its Ray folder


def stop_group(pgid: int, grace: float = 1.0) -> None:
    """Stop the processes of group ``pgid`` (one ``ray start`` and what it spawned): SIGTERM,
    so that a node leaves the cluster cleanly, then SIGKILL for what is left; then remove
    its Ray folder."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            continue
        break
    if pgid in TEMP:
        shutil.rmtree(TEMP.pop(pgid), ignore_errors=True)


def ray_start(args: list[str], cwd: Path, wrap: list[str] | None = None) -> int:
    """Run ``ray start ARGS`` in a session of its own (from ``cwd``, inside ``wrap`` if
    given, its Ray files under a new short folder in /tmp); its process group, which holds
    every process it started."""
    cmd = [*(wrap or []), RAY, "start", *args, f"--dashboard-agent-listen-port={free_port()}"]
    temp = tempfile.mkdtemp(prefix="pa-ray-", dir="/tmp")  # short: it holds sockets
    cmd += [f"--temp-dir={temp}"]
    cmd += ["--disable-usage-stats", "--object-store-memory=100000000"]
    p = subprocess.Popen(
        cmd,
        cwd=cwd,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out = p.communicate(timeout=120)[0]
    if p.returncode != 0:
        stop_group(p.pid)
        shutil.rmtree(temp, ignore_errors=True)
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out[-2000:]}")
    TEMP[p.pid] = temp
    return p.pid


def start_head(root: Path, cpus: int) -> tuple[str, int]:
    """A head node of ``cpus`` CPUs whose workers run in ``root/head-cwd``: its address and
    process group."""
    cwd = root / "head-cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    port = free_port()
    args = ["--head", f"--port={port}", f"--num-cpus={cpus}", "--include-dashboard=false"]
    args.append(f"--dashboard-port={free_port()}")
    return f"127.0.0.1:{port}", ray_start(args, cwd)


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """A two-CPU head started by ``ray start --head``, as a user would, with the driver's
    token mode (Ray reads ``RAY_AUTH_MODE``; unset, a head would turn token auth on as soon
    as ``~/.ray/auth_token`` exists while a driver given an address would not): its address
    and the folder its workers run in."""
    root = tmp_path_factory.mktemp("cluster")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", os.environ.get("RAY_AUTH_MODE") or "disabled")
        mp.delenv("RAY_ADDRESS", raising=False)
        address, group = start_head(root, cpus=2)
        try:
            yield address, root / "head-cwd"
        finally:
            stop_group(group)


def error_line(capsys) -> str:
    """The command's stderr, which must be one ``privaudit: error:`` line."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("privaudit: error: "), err
    return lines[0]


# -- joining: the address ---------------------------------------------------------------------
def test_an_address_where_nothing_listens_is_one_line_within_seconds(tmp_path, capsys):
    address = f"127.0.0.1:{free_port()}"
    with within(30):
        assert (
            main(
                [
                    *COMPARE,
                    "--out",
                    str(tmp_path / "o"),
                    "--executor",
                    "ray",
                    "--ray-address",
                    address,
                ]
            )
            == 2
        )
    line = error_line(capsys)
    assert f"nothing answers at {address}" in line and "`ray start --head" in line
    assert not (tmp_path / "o").exists()


def test_a_ray_client_address_is_refused_in_one_line(tmp_path, capsys):
    assert (
        main(
            [
                *COMPARE,
                "--out",
                str(tmp_path / "o"),
                "--executor",
                "ray",
                "--ray-address",
                "ray://127.0.0.1:10001",
            ]
        )
        == 2
    )
    line = error_line(capsys)
    assert "Ray Client address" in line and "--ray-address 127.0.0.1:10001" in line
    assert "internal error" not in line
    with pytest.raises(PrivauditError, match="must be auto or HOST:PORT"):
        RayExecutor(address="foo")


def test_a_cluster_that_wants_a_token_says_so(tmp_path, capsys, monkeypatch):
    """Ray 2.5x/2.6x, joining a cluster in token mode without the token: ``ray.init``
    raises ConnectionError from a RuntimeError whose text holds Ray's AuthenticationError
    (what Ray 2.60 raises, verbatim apart from the path); the cluster exists."""
    import ray

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    address = f"127.0.0.1:{listening.getsockname()[1]}"
    auth = (
        "Failed to connect to GCS. Last connection error: Traceback (most recent call last):\n"
        '  File "ray/_private/node.py", line 996, in _init_gcs_client\n'
        "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: Authentication token "
        "is missing or incorrect. Note: RAY_AUTH_MODE is currently 'disabled' (not 'token')."
    )

    def refused(*args, **kw):
        try:
            raise RuntimeError(auth)
        except RuntimeError as e:
            raise ConnectionError(f"Failed to connect to Ray cluster at {address}") from e

    monkeypatch.setattr(ray, "init", refused)
    with listening:
        assert (
            main(
                [
                    *COMPARE,
                    "--out",
                    str(tmp_path / "o"),
                    "--executor",
                    "ray",
                    "--ray-address",
                    address,
                ]
            )
            == 2
        )
    line = error_line(capsys)
    assert "wants a token" in line and "RAY_AUTH_MODE=token" in line
    assert "RAY_AUTH_TOKEN" in line and "start one" not in line
    # a cluster that is not there is still told apart
    other = cluster.connect_error(ConnectionError("Failed to connect"), address)
    assert "no Ray cluster at" in str(other) and "RAY_AUTH_MODE" not in str(other)


def test_a_cluster_started_here_runs_its_workers_at_the_cli_niceness(monkeypatch):
    """One setting (``cluster.WORKER_NICENESS``) for the cluster the CLI starts and the one
    ``benchmarks/executor.py`` starts; a joined cluster keeps its own."""
    import ray

    calls: list[dict] = []

    class Stop(Exception):
        pass

    def init(**kw):
        calls.append(kw)
        raise Stop

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(Stop):
        cluster.connect(ray, None)
    assert calls[-1]["_system_config"] == {"worker_niceness": cluster.WORKER_NICENESS}
    with socket.socket() as s:  # a joined cluster: its workers' niceness is its own
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(Stop):
            cluster.connect(ray, f"127.0.0.1:{s.getsockname()[1]}")
    assert "_system_config" not in calls[-1]
    bench = (Path(__file__).parents[1] / "benchmarks" / "executor.py").read_text()
    assert "cluster.start_options()" in bench and "_system_config" not in bench


# -- a joined cluster ---------------------------------------------------------------------------
def test_a_relative_out_is_written_where_the_driver_looks(head, tmp_path, capsys, monkeypatch):
    """The workers of a ``ray start`` cluster run in the folder it was started from: a
    relative ``--out`` is made absolute before any task leaves the driver."""
    address, head_cwd = head
    driver = tmp_path / "driver"
    driver.mkdir()
    monkeypatch.chdir(driver)
    with within(240):
        code = main([*COMPARE, "--out", "study", "--executor", "ray", "--ray-address", address])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    assert len(list((driver / "study" / "results").glob("*/*"))) == 1
    assert not (head_cwd / "study").exists()
    assert not list((driver / "study").glob(".privaudit-probe-*"))  # the probe is removed


def test_resources_no_node_has_are_refused_before_any_cell(head, tmp_path, capsys):
    address, _ = head
    ray_args = ["--executor", "ray", "--ray-address", address]
    with within(60):
        assert main([*COMPARE, "--out", str(tmp_path / "a"), *ray_args, "--cell-cpus", "3"]) == 2
    line = error_line(capsys)
    assert "--cell-cpus 3" in line and "largest node of the cluster has 2 CPUs and 0 GPUs" in line
    assert "--cell-cpus 2 or less" in line
    with within(60):
        assert main([*COMPARE, "--out", str(tmp_path / "b"), *ray_args, "--cell-gpus", "1"]) == 2
    line = error_line(capsys)
    assert "no node of the Ray cluster has a GPU" in line and "--cell-gpus 1" in line
    assert not list(tmp_path.glob("*/results"))  # no cell ran
    # a task on CUDA (--device cuda) asks for a GPU of its own
    cuda = Task("cell", print, ("never run",), gpus=1.0, label="a cell on cuda")
    with within(60), pytest.raises(PrivauditError, match=r"GPU \(--device cuda\).*--device cpu"):
        list(RayExecutor(address=address, threads=1).run([cuda], progress=False))


# -- a node that differs (last: the node stays in the cluster until the module ends) -----------
@pytest.fixture(scope="module")
def odd_node(head, tmp_path_factory):
    """A second node of one CPU, in a mount namespace of its own: a tmpfs over the folder it
    returns (a file the driver writes there is not there for this node) and an edited copy
    of ``privaudit/core/errors.py`` over the original (another code identity)."""
    address, head_cwd = head
    hidden = tmp_path_factory.mktemp("hidden")
    source = Path(__file__).parents[1] / "privaudit" / "core" / "errors.py"
    edited = tmp_path_factory.mktemp("edited") / "errors.py"
    edited.write_text(source.read_text() + "\n# edited on one node only\n")
    if shutil.which("unshare") is None:
        pytest.fail("needs unshare(1) (util-linux) for a node with a view of its own")
    setup = f'mount -t tmpfs none {hidden} && mount --bind {edited} {source} && exec "$@"'
    wrap = ["unshare", "--mount", "sh", "-c", setup, "node"]
    try:
        group = ray_start([f"--address={address}", "--num-cpus=1"], head_cwd, wrap)
    except RuntimeError as e:
        pytest.fail(f"cannot start a node in a mount namespace here: {e}")
    try:
        yield hidden
    finally:
        stop_group(group)


def test_a_node_that_cannot_see_out_is_named(head, odd_node, capsys):
    out = odd_node / "study"
    with within(240):
        assert (
            main([*COMPARE, "--out", str(out), "--executor", "ray", "--ray-address", head[0]]) == 2
        )
    line = error_line(capsys)
    assert f"cannot see {out}" in line and "storage every node shares" in line
    assert not list(out.glob(".privaudit-probe-*")) and not (out / "results").exists()


def test_a_node_running_other_code_is_named_before_any_work(head, odd_node, tmp_path, capsys):
    out = tmp_path / "study"  # a folder both nodes see
    with within(240):
        assert (
            main([*COMPARE, "--out", str(out), "--executor", "ray", "--ray-address", head[0]]) == 2
        )
    line = error_line(capsys)
    assert "privaudit's code differs" in line and "on the driver" in line
    assert "install the same privaudit" in line and line.count("(source ") == 2
    assert not (out / "results").exists()


# -- a head node lost during a study ------------------------------------------------------------
DRIVER = textwrap.dedent(
    """
    import sys, time
    from privaudit.api.executor import RayExecutor, Task
    from privaudit.core.errors import PrivauditError

    def slow(marker):
        open(marker, "w").close()
        time.sleep(300)

    try:
        ex = RayExecutor(address=sys.argv[1], threads=1)
        list(ex.run([Task("slow", slow, (sys.argv[2],), label="slow")], progress=False))
    except PrivauditError as e:  # what privaudit's CLI does with it
        print(f"privaudit: error: {e}", file=sys.stderr)
        sys.exit(2)
    """
)


def test_a_lost_head_node_ends_the_study_with_one_line(tmp_path):
    """The head is killed (SIGKILL, every process of it) while a task runs: the driver
    stops within seconds with one line and exit status 2 (Ray alone would end it a minute
    later with a C++ log line and status 1)."""
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE") or "disabled"}
    env.pop("RAY_ADDRESS", None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", env["RAY_AUTH_MODE"])
        address, group = start_head(tmp_path, cpus=1)
    marker = tmp_path / "started"
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, address, str(marker)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), driver.communicate(timeout=5)
        os.killpg(group, signal.SIGKILL)
        t0 = time.monotonic()
        _, err = driver.communicate(timeout=45)
        took = time.monotonic() - t0
    finally:
        driver.kill()
        stop_group(group)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert driver.returncode == 2 and took < 30, (driver.returncode, took, err)
    assert lines[-1].startswith("privaudit: error: lost the Ray cluster"), err
    assert "run the same command to resume" in lines[-1]
    assert not any(" E " in ln or "terminate" in ln for ln in lines), err
