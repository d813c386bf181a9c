"""Run directories cannot be silently corrupted: the manifest, the writer lock, symlinks,
temporary files — and every corruption ends in one clear error or a correct re-simulation."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from privaudit.cli import main
from privaudit.sim.rundir import RunDir

TRAIN = ["train", "--defense", "nd", "--rounds", "4", "--agents", "3", "--batch-size", "2"]
TRAIN += ["--checkpoint-every", "2", "--no-progress"]
CKPT, MSGS, SECRETS = (
    "checkpoints/round-000002.safetensors",
    "messages/round-000003.safetensors",
    "secrets/round-000003.safetensors",
)


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("privaudit: error:"), err
    return lines[0]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A run with round 3 captured, another run (seed 1) to take foreign files from, and
    the clean results of the three commands of the matrix."""
    root = tmp_path_factory.mktemp("rundir")
    assert main([*TRAIN, "--capture", "3", "--out", str(root / "run")]) == 0
    assert main([*TRAIN, "--capture", "3", "--seed", "1", "--out", str(root / "foreign")]) == 0
    clean = root / "clean"
    shutil.copytree(root / "run", clean)
    for command in COMMANDS:
        assert main(COMMANDS[command](clean, root / f"clean-{command}")) == 0
    return root


ON_ROUND_3 = ["--target", "nd-cg", "--round", "3", "--no-progress"]
COMMANDS = {
    "attack": lambda run, out: (
        ["attack", *ON_ROUND_3, "--run", str(run), "--out", str(out)]
        + ["--iterations", "3", "--no-lpips"]
    ),
    "resume": lambda run, out: [*TRAIN, "--capture", "3", "--out", str(run)],
    "audit": lambda run, out: (
        ["audit", *ON_ROUND_3, "--run", str(run), "--out", str(out)] + ["--trials", "32"]
    ),
}
# what each command reads: a corrupt file among them is an error, any other is left alone
READS = {
    "attack": {"config.json", MSGS, SECRETS},
    "resume": {"config.json", CKPT, MSGS},  # re-simulates round 3 from round 2, merging
    "audit": {"config.json", CKPT, MSGS},  # the planner observes the recorded message
}


def _first_float(tensors: dict[str, torch.Tensor]) -> str:
    return next(k for k in sorted(tensors) if tensors[k].is_floating_point())


def _rewrite(path: Path, change) -> None:
    """Rewrite a safetensors file as a valid one, changed (keeping its metadata)."""
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata=meta)


def truncate(path: Path, root: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_byte(path: Path, root: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def edit_values(path: Path, root: Path) -> None:
    def change(t):
        k = _first_float(t)
        t[k] = t[k] + 1e-3

    _rewrite(path, change)


def wrong_shape(path: Path, root: Path) -> None:
    def change(t):
        k = _first_float(t)
        t[k] = t[k].reshape(-1)[:-1].clone()

    _rewrite(path, change)


def out_of_range(path: Path, root: Path) -> None:
    def change(t):
        t["index"] = t["index"] + 10**6

    _rewrite(path, change)


def malformed_key(path: Path, root: Path) -> None:
    def change(t):
        k = sorted(t)[0]
        t["no key at all"] = t.pop(k)

    _rewrite(path, change)


def foreign(path: Path, root: Path) -> None:
    rel = path.relative_to(path.parents[1]) if path.name != "config.json" else "config.json"
    shutil.copyfile(root / "foreign" / rel, path)


def mistyped_param(path: Path, root: Path) -> None:
    doc = json.loads(path.read_text())
    doc["params"]["momentum"] = "abc"
    path.write_text(json.dumps(doc))


def other_agents(path: Path, root: Path) -> None:
    doc = json.loads(path.read_text())
    doc["agents"] = 5
    path.write_text(json.dumps(doc))


def symlink_file(path: Path, root: Path) -> None:
    outside = root / "outside" / path.name
    outside.parent.mkdir(exist_ok=True)
    shutil.copyfile(path, outside)  # the very same bytes, but not the run's own file
    path.unlink()
    path.symlink_to(outside)


def symlink_folder(path: Path, root: Path) -> None:
    outside = root / f"outside-{path.parent.name}-{time.monotonic_ns()}"
    shutil.move(path.parent, outside)
    path.parent.symlink_to(outside, target_is_directory=True)


CORRUPTIONS = {
    "checkpoint truncated": (CKPT, truncate),
    "checkpoint byte flipped": (CKPT, flip_byte),
    "checkpoint values edited": (CKPT, edit_values),
    "checkpoint of the wrong shape": (CKPT, wrong_shape),
    "checkpoint of another run": (CKPT, foreign),
    "checkpoint a symlink": (CKPT, symlink_file),
    "message values edited": (MSGS, edit_values),
    "message truncated": (MSGS, truncate),
    "message key malformed": (MSGS, malformed_key),
    "messages folder a symlink": (MSGS, symlink_folder),
    "secret indices out of range": (SECRETS, out_of_range),
    "secrets byte flipped": (SECRETS, flip_byte),
    "config of another run": ("config.json", foreign),
    "config param mistyped": ("config.json", mistyped_param),
    "config agent count changed": ("config.json", other_agents),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corruption_is_an_error_or_a_correct_resimulation(base, case, command, capsys):
    rel, corrupt = CORRUPTIONS[case]
    run = base / f"{case}-{command}".replace(" ", "-")
    shutil.copytree(base / "run", run, symlinks=True)
    corrupt(run / rel, base)
    before = (run / rel).read_bytes()
    out = base / f"out-{case}-{command}".replace(" ", "-")
    code, err = run_cli(capsys, *COMMANDS[command](run, out))
    if rel in READS[command] or "symlink" in case:  # links are refused on opening the run
        assert code == 2
        line = one_error_line(err)
        named = Path(rel).parent.name if "folder" in case else Path(rel).name
        assert named in line, line
        assert (run / rel).read_bytes() == before  # reported, never overwritten
        return
    assert code == 0, err
    if command == "attack":  # the same reconstruction as on the clean run
        got = json.loads((out / "result.json").read_text())["metrics"]
        want = json.loads((base / "clean-attack" / "result.json").read_text())["metrics"]
        assert got == want
    elif command == "audit":
        got = json.loads((out / "audit.json").read_text())
        want = json.loads((base / "clean-audit" / "audit.json").read_text())
        assert got["epsilon_lo"] == want["epsilon_lo"] and got["verdict"] == want["verdict"]
    else:  # resume re-simulated round 3: the file it rewrote is the clean run's again
        assert (run / rel).read_bytes() == (base / "clean" / rel).read_bytes()
        RunDir(run).load_secrets(3)  # and verifies


def test_unrecorded_and_temporary_files_are_ignored_then_cleaned(base, capsys):
    run = base / "stray"
    shutil.copytree(base / "run", run)
    # a file privaudit did not record (a writer killed between file and manifest)
    shutil.copyfile(run / CKPT, run / "checkpoints" / "round-000003.safetensors")
    orphan = run / "checkpoints" / ".round-000002.safetensors.x1y2.tmp"
    orphan.write_bytes(b"half a checkpoint")
    assert RunDir(run).checkpoint_rounds() == [2, 4]  # the unrecorded round 3 is not used
    code, err = run_cli(capsys, *COMMANDS["resume"](run, None))
    assert code == 0, err
    assert not orphan.exists()  # the writer removed what a killed writer left
    assert RunDir(run).checkpoint_rounds() == [2, 4]


def test_a_run_without_manifest_is_refused(base, capsys):
    run = base / "old"
    shutil.copytree(base / "run", run)
    (run / "manifest.json").unlink()
    code, err = run_cli(capsys, *COMMANDS["attack"](run, base / "old-out"))
    assert code == 2 and "manifest.json" in one_error_line(err)


def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path, capsys):
    out = tmp_path / "run"
    long = ["train", "--defense", "nd", "--rounds", "100000", "--agents", "3", "--no-progress"]
    long += ["--checkpoint-every", "5"]
    proc_argv = [sys.executable, "-m", "privaudit.cli", *long, "--out", str(out)]
    proc = subprocess.Popen(proc_argv, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / ".lock").exists() or not (out / ".lock").read_text():
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        while not RunDir(out).exists():  # config written: the first is training
            time.sleep(0.05)
        time.sleep(0.5)
        # the same command (same config) and another seed are both refused, at once
        for extra in ([], ["--seed", "7"]):
            started = time.monotonic()
            code, err = run_cli(capsys, *long, *extra, "--out", str(out))
            line = one_error_line(err)
            assert code == 2 and time.monotonic() - started < 30
            if not extra:
                assert f"PID {proc.pid}" in line and "being written" in line, line
        config = (out / "config.json").read_bytes()
        while not RunDir(out).checkpoint_rounds():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in its terminal
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 2, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (out / "config.json").read_bytes() == config  # still the first run's
    last = RunDir(out).checkpoint_rounds()[-1]  # the interrupt checkpoint, readable
    assert f"resume from round {last}" in stderr.decode()
    RunDir(out).load_checkpoint(last)


def test_writes_are_atomic_and_recorded(tmp_path):
    rd = RunDir(tmp_path / "r")
    rd.save_checkpoint(1, {"state.x": torch.arange(6.0).reshape(2, 3)})
    entry = json.loads(rd.manifest.path.read_text())["files"][
        "checkpoints/round-000001.safetensors"
    ]
    assert entry["tensors"] == {"state.x": ["F32", [2, 3]]}
    assert not list((tmp_path / "r" / "checkpoints").glob(".*.tmp"))
    assert torch.equal(rd.load_checkpoint(1)["state.x"], torch.arange(6.0).reshape(2, 3))
    rd.remove("checkpoints", 1)
    assert rd.checkpoint_rounds() == [] and not rd.round_file("checkpoints", 1).exists()


def test_a_checkpoint_is_written_from_the_tensors_without_a_copy(tmp_path):
    """RunDir writes safetensors files byte for byte as ``safetensors.torch.save`` would
    (every dtype a run stores, metadata, an empty and a 0-d tensor), records their digest, and
    reads them back; the write allocates no Python copy of the data (``save`` held two: each
    tensor's bytes, then the whole file)."""
    import tracemalloc

    from safetensors.torch import save

    from privaudit.core import tensorfile

    tensors = {
        "state.x": torch.randn(4, 1_000_000),
        "rng.0": torch.randint(0, 255, (5056,), dtype=torch.uint8),
        "idx": torch.arange(7),
        "flags": torch.tensor([True, False]),
        "f64": torch.randn(3, dtype=torch.float64),
        "half": torch.randn(3).half(),
        "bf16": torch.randn(3).bfloat16(),
        "i32": torch.arange(3, dtype=torch.int32),
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(2.0),
    }
    for meta in (None, {"links": "[[0, 1]]"}):
        path = tmp_path / "f.safetensors"
        tensorfile.write(path, tensors, meta)
        assert path.read_bytes() == save(tensors, metadata=meta)
    store = RunDir(tmp_path / "run")
    tracemalloc.start()
    try:
        store.save_checkpoint(1, tensors)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20, f"{peak / 2**20:.1f} MB of Python allocations for a 16 MB checkpoint"
    back = store.load_checkpoint(1)
    assert back.keys() == tensors.keys()
    assert all(torch.equal(back[k], v) for k, v in tensors.items())
