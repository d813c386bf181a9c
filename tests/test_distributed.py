"""The torch.distributed backend on gloo (CPU): one process per agent, real ranks, real
point-to-point messages. Same seed → the simulator's messages; a killed rank stops the run
with an error naming it, and the run resumes from its last checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import assert_states_match, tiny

from privaudit.core.errors import PrivauditError
from privaudit.core.messages import CaptureSpec
from privaudit.core.network import SimNetwork, make_links
from privaudit.scenario.topology import metropolis_hastings, ring
from privaudit.sim.distributed import describe_failure, launch
from privaudit.sim.run import Run
from privaudit.sim.rundir import RunDir

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or sys.platform == "win32",
    reason="needs torch.distributed with gloo",
)

# Gradients of one agent (a rank) and of N stacked agents (the simulator) may round
# differently: oneDNN picks convolution kernels by batch shape. Everything else — batches,
# noise draws, the order of every sum — is the same, so messages agree to float32 rounding,
# amplified only by a few rounds of training.
RTOL, ATOL = 1e-4, 1e-5


CONFIGS = {
    "dsgd": tiny("dsgd"),
    "dpdl": tiny("dpdl", sigma=1.0, epsilon=None),
    "lppa": tiny("lppa"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_distributed_run_sends_the_simulators_messages(tmp_path, name):
    cfg = CONFIGS[name]
    every = CaptureSpec.of(rounds=range(1, cfg.rounds + 1))
    sim = Run.create(cfg, tmp_path / "sim")
    want = sim.messages(every, progress=False)
    launch(cfg, tmp_path / "dist", capture=every, timeout_s=60, progress=False)
    dist_run = Run.open(tmp_path / "dist")
    got = {t: dist_run.dir.load_messages(t) for t in every.rounds}
    got = {k: v for msgs in got.values() for k, v in msgs.items()}
    assert set(got) == set(want) and len(want) > 0
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=RTOL, atol=ATOL, msg=str(key))
    # what does not pass through a gradient is bitwise identical
    kinds = {k[3] for k in want}
    for key in want:
        if key[3] == "noise" or (key[0] == 1 and key[3] == "model"):
            assert torch.equal(got[key], want[key]), key
    assert "noise" in kinds or name != "lppa"
    for t in every.rounds:
        s, d = sim.dir.load_secrets(t), dist_run.dir.load_secrets(t)
        assert s.keys() == d.keys() == {"index", "labels", "sizes"}
        assert all(torch.equal(s[k], d[k]) for k in s)
    # the merged checkpoints hold every agent's rows and generator state: each agent drew
    # exactly as many random numbers as in the simulator
    assert dist_run.dir.checkpoint_rounds() == sim.dir.checkpoint_rounds() == [2, 3]
    want, got = sim.dir.load_checkpoint(3), dist_run.dir.load_checkpoint(3)
    assert set(want) == set(got)
    assert_states_match(got, want, RTOL, ATOL)
    assert not (tmp_path / "dist" / "shards").exists()  # every shard was merged


def test_a_rank_sees_only_its_links():
    """The vocabulary on one held agent: out-edges it sends on, in-edges it receives on, in
    the global link order, and the reverse map between them."""
    adj, W = ring(5), metropolis_hastings(ring(5))
    links = make_links(SimNetwork(adj, W).edges, [2], "cpu")
    assert links.out_edges == ((2, 1), (2, 3)) and links.in_edges == ((1, 2), (3, 2))
    assert links.out_src.tolist() == [0, 0] and links.in_dst.tolist() == [0, 0]
    assert links.reverse.tolist() == [0, 1]  # 2→1 is answered on 1→2, 2→3 on 3→2
    every = SimNetwork(adj, W).links
    assert every.out_edges == every.in_edges and len(every.edges) == 10


def test_nproc_must_match_agents(tmp_path):
    with pytest.raises(PrivauditError, match="one process per agent; use --nproc 4"):
        launch(tiny("dsgd"), tmp_path / "r", nproc=3)
    assert not (tmp_path / "r").exists()


def test_failure_report_names_the_rank_that_died(tmp_path):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    rd = RunDir(tmp_path)
    killed = ProcessFailure(local_rank=2, pid=11, exitcode=-9, error_file="")
    stopped = ProcessFailure(local_rank=0, pid=10, exitcode=-15, error_file="")
    line = describe_failure({0: stopped, 2: killed}, rd)
    assert line.startswith("rank 2 (agent 2) was killed by SIGKILL")
    assert "resume from the start" in line


def test_failure_report_does_not_blame_a_rank_it_never_saw(tmp_path):
    """Rank 2 killed; rank 1 died of it; the launcher saw only rank 0, whose link to rank 1
    broke: rank 1 did not "stop responding", rank 0 lost its connection to a dead peer."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    error = tmp_path / "error.json"
    said = "rank 0 lost rank 1: the model message of round 3 did not get through "
    said += "([gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4321)"
    error.write_text(json.dumps({"message": said, "timestamp": 0}))
    seen = ProcessFailure(local_rank=0, pid=10, exitcode=1, error_file=str(error))
    line = describe_failure({0: seen}, RunDir(tmp_path))
    assert line.startswith("rank 0 (agent 0) lost its connection to a peer that died"), line


def _cli(out, rounds: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "privaudit.cli",
        "train",
        "--backend",
        "torch.distributed",
        "--defense",
        "dsgd",
        "--agents",
        "4",
        "--rounds",
        str(rounds),
        "--batch-size",
        "2",
        "--checkpoint-every",
        "2",
        "--out",
        str(out),
        "--dist-timeout",
        "30",
        "--no-progress",
    ]


def test_killed_rank_stops_the_run_with_its_name_and_the_run_resumes(tmp_path):
    # checkpoints every 2 rounds keep the ranks busy for seconds after round 2 (the kill)
    out, rounds = tmp_path / "run", 100
    proc = subprocess.Popen(_cli(out, rounds), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = out / "checkpoints" / "round-000002.safetensors"
    deadline = time.monotonic() + 120
    while not first.exists():
        assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
        assert time.monotonic() < deadline, "the distributed run never reached round 2"
        time.sleep(0.01)
    pid_file = out / "shards" / "rank-00002" / "pid"
    assert pid_file.exists(), f"run ended before the kill: {proc.poll()}"
    pid = int(pid_file.read_text())
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)  # no hang: the launcher stops every rank
    assert proc.returncode == 2
    last = err.decode().strip().splitlines()[-1]
    # the launcher reports the first exit it sees: the killed rank, or (when both are gone by
    # then) the rank whose connection to it broke — never a made-up cause
    assert last.startswith("privaudit: error: rank 2 (agent 2) was killed by SIGKILL") or (
        "lost its connection to a peer that died" in last
    ), last
    assert "Run the same command again to resume from round" in last
    done = RunDir(out).checkpoint_rounds()
    assert done and max(done) < rounds
    # the same run resumes from the last checkpoint and finishes like the simulator
    # (checkpoint_every does not change the messages; fewer checkpoints are faster)
    _resume_matches_the_simulator(tmp_path, out, rounds, checkpoint_every=50)


def _resume_matches_the_simulator(tmp_path, out, rounds: int, checkpoint_every: int) -> None:
    """The distributed run in ``out`` resumes to its last round and ends where the simulator
    does (``checkpoint_every`` does not change the messages)."""
    cfg = tiny("dsgd", rounds=rounds, checkpoint_every=checkpoint_every)
    sim = Run.create(cfg, tmp_path / "sim")
    sim.train(progress=False)
    launch(cfg, out, timeout_s=30, progress=False)
    assert RunDir(out).checkpoint_rounds()[-1] == rounds
    want, got = sim.dir.load_checkpoint(rounds), RunDir(out).load_checkpoint(rounds)
    assert_states_match(got, want, RTOL, ATOL)


def test_ctrl_c_leaves_an_interrupt_checkpoint_and_the_run_resumes(tmp_path):
    out, rounds = tmp_path / "run", 800  # far from done when interrupted, even on a fast box
    argv = _cli(out, rounds)
    argv[argv.index("--checkpoint-every") + 1] = "1000"  # any checkpoint is the interrupt's
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, start_new_session=True)
    pid_file = out / "shards" / "rank-00003" / "pid"
    deadline = time.monotonic() + 120
    while not pid_file.exists():
        assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.01)
    time.sleep(2)  # some rounds
    assert proc.poll() is None, "run ended before the interrupt"
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals every process
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("privaudit: error: interrupted"), lines
    done = RunDir(out).checkpoint_rounds()
    assert len(done) == 1 and 0 < done[0] < rounds, done  # the interrupt checkpoint, merged
    assert f"resume from round {done[0]}" in lines[0]
    assert not (out / "shards").exists()  # cleaned
    _resume_matches_the_simulator(tmp_path, out, rounds, checkpoint_every=1000)


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--backend", "mpi"], "--backend must be sim or torch.distributed"),
        (["--capture", "0"], "--capture rounds must lie in 1..3"),
        (["--backend", "torch.distributed", "--nproc", "3"], "use --nproc 4"),
    ],
)
def test_train_cli_rejects_bad_engine_options(tmp_path, capsys, extra, message):
    from privaudit.cli import main

    argv = ["train", "--defense", "dsgd", "--agents", "4", "--rounds", "3"]
    code = main([*argv, "--out", str(tmp_path / "r"), "--no-progress", *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("privaudit: error:") and message in err, err
    assert len(err.splitlines()) == 1 and not (tmp_path / "r").exists()
