"""A run never goes on silently past a broken state (issue 30): an absurd step size is
refused before training, a diverging run stops at the round it diverges and never reports
an accuracy, an attack refuses a non-finite message, a capture run checks the checkpoints it
keeps, a config that disagrees with its files is refused, and a defense that raises is one
line — each time exit code 2, exactly one ``privaudit: error:`` line, no traceback, and
nothing the user had changed or half made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny

from privaudit.cli import main
from privaudit.core.errors import PLUGIN_ENV
from privaudit.defenses import DEFENSES
from privaudit.plugins import load_plugins
from privaudit.sim import runlock
from privaudit.sim.distributed import describe_failure
from privaudit.sim.loop import NO_RESUME, RoundFailed
from privaudit.sim.manifest import entry
from privaudit.sim.run import Run
from privaudit.sim.rundir import RunDir

SMALL = ["--agents", "3", "--batch-size", "2", "--checkpoint-every", "2", "--no-progress"]
ND = ["train", "--defense", "nd", "--rounds", "3", *SMALL]
# ReLU CNN, nd at the largest step size allowed: the weights reach float32's limit and the
# state is NaN in round 3 (rounds 1 and 2 are finite, round 2 is checkpointed)
DIVERGES = [*ND, "--model", "cnn", "--lr", "1e4"]


def failed(capsys, *argv: str) -> tuple[str, str]:
    """Run the CLI, assert exit code 2 with exactly one error line and no traceback; the line
    and the standard output."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("privaudit: error:")]
    assert code == 2, err
    assert len(lines) == 1 and err.rstrip().endswith(lines[0]), err
    assert "Traceback" not in err + out, err
    return lines[0], out


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder`` but the lock files (a writer notes its PID there): its
    bytes and modification time."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in (runlock.WRITER, runlock.IO)
    }


# -- 1. step sizes and divergence ---------------------------------------------------------------
def test_an_absurd_step_size_is_refused_before_training(tmp_path, capsys):
    run = tmp_path / "run"
    line, out = failed(capsys, *ND, "--lr", "1e300", "--json", "--out", str(run))
    assert "lr must be a finite number in (0, 10000], got 1e+300" in line, line
    assert "test_accuracy" not in out
    assert not run.exists()


def test_a_diverging_run_stops_at_that_round_and_keeps_its_checkpoints(tmp_path, capsys):
    run = tmp_path / "run"
    line, out = failed(capsys, *DIVERGES, "--json", "--out", str(run))
    assert line.startswith("privaudit: error: round 3: nd diverged at lr=10000"), line
    assert "agent(s) 0, 1, 2 is not finite" in line and "cannot continue" in line, line
    assert "smaller step size (--lr or -p lr)" in line and "new --out" in line, line
    assert "test_accuracy" not in out  # no accuracy of a non-finite model
    rd = RunDir(run)
    assert rd.checkpoint_rounds() == [2]  # the last finite round, usable
    assert all(torch.isfinite(v).all() for v in rd.load_checkpoint(2).values())
    before = snapshot(run)
    again, _ = failed(capsys, *DIVERGES, "--out", str(run))  # resumes at 2, diverges again
    assert again == line
    assert snapshot(run) == before


def test_a_new_run_that_diverges_before_its_first_checkpoint_is_removed(tmp_path, capsys):
    run = tmp_path / "run"
    line, _ = failed(capsys, *DIVERGES, "--checkpoint-every", "3", "--out", str(run))
    assert "round 3: nd diverged" in line and f"so {run} was removed" in line, line
    assert not run.exists()


def _nan(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {
        k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
        for k, v in tensors.items()
    }


def nan_messages(rd: RunDir) -> None:
    msgs, links = rd.read_messages(1)
    rd.save_messages(1, _nan(msgs), links)


def nan_checkpoint(rd: RunDir) -> None:
    rd.save_checkpoint(2, _nan(rd.load_checkpoint(2)))


@pytest.mark.parametrize(
    "spoil, round_, needle",
    [
        (nan_messages, "1", "the nd-cg message 0→1 of round 1 is not finite"),
        (nan_checkpoint, "3", "the checkpoint of round 2 in"),
    ],
)
def test_an_attack_refuses_non_finite_messages(tmp_path, capsys, spoil, round_, needle):
    run = tmp_path / "run"
    assert main([*ND, "--capture", "1", "--out", str(run)]) == 0
    spoil(RunDir(run))  # through the run directory's own API: the manifest agrees
    before = snapshot(run)
    capsys.readouterr()
    attack = ["attack", "--target", "nd-cg", "--round", round_, "--run", str(run)]
    attack += ["--iterations", "2", "--no-lpips", "--no-progress", "--out", str(tmp_path / "a")]
    line, _ = failed(capsys, *attack)
    assert needle in line and "not finite" in line, line
    assert snapshot(run) == before
    assert not (tmp_path / "a" / "result.json").exists()


# -- 2. a capture run checks the checkpoints it keeps ---------------------------------------------
def test_a_capture_run_detects_a_truncated_final_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    argv = [*ND, "--capture", "all", "--out", str(run)]
    assert main(argv) == 0
    final = RunDir(run).round_file("checkpoints", 3)
    final.write_bytes(final.read_bytes()[:100])
    before = snapshot(run)
    line, _ = failed(capsys, *argv)
    assert str(final) in line and "delete it and rerun" in line, line
    assert snapshot(run) == before  # no message rewritten, the checkpoint left as found


# -- 3. a config that disagrees with the files ---------------------------------------------------
def edit_config(run: Path, **change) -> None:
    """Change config.json and record its new hash in the manifest, as privaudit writes it."""
    rd = RunDir(run)
    doc = json.loads(rd.config_path.read_text())
    doc.update(change)
    data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    rd.config_path.write_bytes(data)
    files = rd.manifest.files()
    files["config.json"] = entry(data)
    rd.manifest.path.write_bytes(rd.manifest.text(files))


def forget_record(run: Path) -> None:
    """Rewrite the manifest without the run's record, as privaudit wrote manifests before
    runs recorded what they are (the files' digests kept)."""
    rd = RunDir(run)
    doc = {"format": 1, "files": rd.manifest.files()}
    rd.manifest.path.write_text(json.dumps(doc))


EDITS = {  # field → (new value, what the line says of a run without a record)
    "agents": (5, "checkpoint 2 holds 4 agents'"),
    "model": ("cnn", "holds models of [15826] parameters"),
    "rounds": (2, "it holds checkpoints of round 3"),
    "topology": ("bipartite", "round 1's messages cross the link 0→1, not in the graph"),
}


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "older-manifest"])
@pytest.mark.parametrize("field", list(EDITS))
def test_a_config_edited_against_its_files_is_refused(tmp_path, capsys, field, recorded):
    """Refused by the record of what the run is (its manifest's), and — for a run whose
    manifest predates that record — by its files' shapes."""
    run = tmp_path / "run"
    base = ["train", "--defense", "nd", "--rounds", "3", "--agents", "4", *SMALL[2:]]
    assert main([*base, "--capture", "1", "--out", str(run)]) == 0
    value, needle = EDITS[field]
    if not recorded:
        forget_record(run)
    else:
        old = json.loads((run / "config.json").read_text())[field]
        needle = f"{field} = {value!r} in config.json, {old!r} when it was created"
    edit_config(run, **{field: value})
    before = snapshot(run)
    capsys.readouterr()
    attack = ["attack", "--target", "nd-cg", "--round", "1", "--run", str(run)]
    attack += ["--iterations", "2", "--no-lpips", "--no-progress", "--out", str(tmp_path / "a")]
    line, _ = failed(capsys, *attack)
    assert "does not agree with its config.json" in line and needle in line, line
    assert "train again into a new --out" in line, line
    if field == "agents":  # training on, with the flags as edited, is refused the same way
        edited = [a if a != "4" else "5" for a in base]
        assert failed(capsys, *edited, "--capture", "1", "--out", str(run))[0] == line
    assert snapshot(run) == before


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "older-manifest"])
def test_more_rounds_written_into_config_are_refused_edited_hash_or_not(tmp_path, capsys, recorded):
    """Issue 44: ``rounds`` raised in config.json with its hash updated. No file contradicts
    it (none is of a round past the new last), so the files' shapes cannot tell; the record
    of what the run is does — the rounds themselves, or, for a manifest written before runs
    recorded them, σ: calibrated for the edited rounds, it is not the σ the run was trained
    with. Before, the run went on with σ recalibrated and reported ε over 4 rounds."""
    run = tmp_path / "run"
    train = ["train", "--defense", "dp-dpsgd", "--rounds", "2", "--epsilon", "8", *SMALL]
    assert main([*train, "--out", str(run)]) == 0
    sigma = json.loads((run / "config.json").read_text())["resolved"]["sigma"]
    if not recorded:
        forget_record(run)
    edit_config(run, rounds=4)
    before = snapshot(run)
    capsys.readouterr()
    attack = ["attack", "--target", "dp-dpsgd-half-model", "--round", "3", "--run", str(run)]
    attack += ["--iterations", "2", "--no-lpips", "--no-progress", "--out", str(tmp_path / "a")]
    line, _ = failed(capsys, *attack)
    assert "does not agree with its config.json" in line and "new --out" in line, line
    if recorded:
        assert "rounds = 4 in config.json, 2 when it was created" in line, line
    else:
        assert f"recomputed from config.json, {sigma:.6g} when it was created" in line, line
    assert snapshot(run) == before and RunDir(run).checkpoint_rounds() == [2]


def test_an_edited_resolved_sigma_is_refused(tmp_path, capsys):
    """The σ config.json reports (what attacks print and audits read) is checked against the
    record too: changing it, hash updated, is refused (nd adds no noise: σ = 0)."""
    run = tmp_path / "run"
    assert main([*ND, "--out", str(run)]) == 0
    doc = json.loads((run / "config.json").read_text())
    edit_config(run, resolved={**doc["resolved"], "sigma": 5.0})
    capsys.readouterr()
    line, _ = failed(capsys, *ND, "--out", str(run))
    assert "σ = 5 in config.json, 0 when it was created" in line, line


# -- 4. a defense that raises ---------------------------------------------------------------------
@pytest.fixture
def registries(monkeypatch):
    """The built-in defenses before and after the test (a plugin registers one), and no
    PRIVAUDIT_PLUGINS left behind for later tests' processes."""
    monkeypatch.delenv(PLUGIN_ENV, raising=False)
    saved = dict(DEFENSES)
    yield
    DEFENSES.clear()
    DEFENSES.update(saved)


def plugin(tmp_path: Path, fails_in: int, raises: str = "ValueError('boom')") -> Path:
    """A plugin file whose defense 'boom' raises ``raises`` from round ``fails_in`` on (0:
    in its ``init``, before round 1)."""
    path = tmp_path / "boom.py"
    path.write_text(
        "from dataclasses import dataclass\n"
        "from privaudit.defenses import Defense, register\n\n"
        "@dataclass\nclass P:\n    lr: float = 0.1\n\n"
        "@register\nclass Boom(Defense):\n    name = 'boom'\n    kinds = {'m': 'a message'}\n"
        "    Params = P\n\n"
        "    def init(self, ctx, p):\n"
        f"        if {fails_in} == 0:\n            raise {raises}\n"
        "        return super().init(ctx, p)\n\n"
        "    def round(self, ctx, p, state, net, batch):\n"
        f"        if net.round >= {fails_in}:\n            raise {raises}\n"
        "        return state\n\n"
        "    def observe(self, view, kind, t, src, dst):\n        return None\n"
    )
    return path


BOOM = ["train", "--defense", "boom", "--rounds", "3", *SMALL]


WHERE = {0: "before round 1: its init()", 1: "in round 1: its round()"}


@pytest.mark.parametrize("fails_in", list(WHERE))
def test_a_defense_raising_in_a_new_run_is_one_line_and_leaves_nothing(
    tmp_path, capsys, registries, fails_in
):
    run = tmp_path / "run"
    file = plugin(tmp_path, fails_in)
    line, _ = failed(capsys, "--plugin", str(file), *BOOM, "--out", str(run))
    said = f"defense 'boom' (plugin {file}) failed {WHERE[fails_in]} raised ValueError: boom"
    assert said in line and "fix the plugin" in line and f"so {run} was removed" in line, line
    assert not run.exists()
    # a folder the user made is kept (empty, as it was): only what the command wrote goes
    run.mkdir()
    failed(capsys, "--plugin", str(file), *BOOM, "--out", str(run))
    assert run.is_dir() and not [p for p in run.iterdir() if not p.name.startswith(".")]


def test_a_defense_raising_later_keeps_the_checkpoints_to_resume_from(tmp_path, capsys, registries):
    run = tmp_path / "run"
    line, _ = failed(capsys, "--plugin", str(plugin(tmp_path, 3)), *BOOM, "--out", str(run))
    assert "failed in round 3" in line and f"it resumes {run} from round 2" in line, line
    assert RunDir(run).checkpoint_rounds() == [2]


def test_the_error_chains_the_defenses_exception_and_passes_memory_errors(tmp_path, registries):
    load_plugins([plugin(tmp_path, 1)], environment=False)
    run = Run.create(tiny("boom", agents=3), tmp_path / "run")
    with pytest.raises(RoundFailed) as e:
        run.train(progress=False)
    assert isinstance(e.value.__cause__, ValueError) and str(e.value.__cause__) == "boom"
    DEFENSES.pop("boom")
    (tmp_path / "m").mkdir()
    load_plugins([plugin(tmp_path / "m", 1, "MemoryError()")], environment=False)
    run = Run.create(tiny("boom", agents=3), tmp_path / "m-run")
    with pytest.raises(MemoryError):  # not the defense's bug: not turned into a line
        run.train(progress=False)


def test_a_rank_that_diverged_is_not_told_to_resume(tmp_path):
    """Under torch.distributed the rank's line comes through the launcher's report: a
    divergence is not followed by "run the same command again"."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    said = f"RoundFailed: round 3: nd diverged at lr=10000: …; {NO_RESUME}: choose a smaller"
    error = tmp_path / "error.json"
    error.write_text(json.dumps({"message": said, "timestamp": 0}))
    rank = ProcessFailure(local_rank=1, pid=10, exitcode=1, error_file=str(error))
    line = describe_failure({1: rank}, RunDir(tmp_path))
    assert line.startswith("rank 1 (agent 1) failed: RoundFailed: round 3: nd diverged"), line
    assert line.endswith(f"Train into a new --out, or delete {tmp_path}"), line
    assert "same command" not in line


def test_a_round_that_cannot_fit_stops_before_training_and_resumes_after(
    tmp_path, capsys, monkeypatch
):
    """The pre-flight check: when the free memory is less than what one round needs beyond
    the state (the smallest chunk), the run stops before the round with
    one line naming the fixes — a new run leaves nothing behind, a resumed one keeps its
    checkpoints — and once memory is free the same command resumes."""
    from privaudit.grads import memory

    run = tmp_path / "run"
    dpdl = ["train", "--defense", "dpdl", "--rounds", "4", *SMALL, "--out", str(run)]
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1000)
    line, _ = failed(capsys, *dpdl)
    assert "needs about" in line and "is free on cpu" in line and "--agents" in line, line
    assert f"so {run} was removed" in line and not run.exists()

    monkeypatch.undo()
    Run.create(tiny("dpdl", agents=3, rounds=4), run).train(until=2, progress=False)
    state = Run.open(run).restore(2)
    need = Run.open(run).defense.round_bytes(Run.open(run).ctx, state)
    # one receiver's 2(2 + 1) + 3 rows; the next state is written into this one (Consumed)
    assert need == 9 * state["x"].shape[1] * 4
    monkeypatch.setattr(memory, "available_bytes", lambda device: need - 1)
    line, _ = failed(capsys, *dpdl)
    assert f"it resumes {run} from round 2" in line, line
    assert RunDir(run).checkpoint_rounds() == [2]
    monkeypatch.setattr(memory, "available_bytes", lambda device: need)
    assert main(dpdl) == 0
    assert RunDir(run).checkpoint_rounds()[-1] == 4
