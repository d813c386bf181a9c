"""The hardening probe's classes (issue 44) as tests: a plugin whose code answers nonsense
or raises away from the loader's probe point, an edited run identity, an interrupted audit,
and a run lock under a locale that cannot spell the command line. Each is one
``privaudit: error:`` line, exit code 2, no traceback, and no file of the user's changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import run_cli

from privaudit.sim.manifest import entry

QUIET = ["--agents", "4", "--rounds", "2", "--batch-size", "2", "--no-progress"]


def one_error_line(err: str, *needles: str) -> str:
    """The single ``privaudit: error:`` line of ``err`` (nothing else, no traceback)."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("privaudit: error:"), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def accountant_plugin(tmp_path: Path, body: str, name: str = "probebogus") -> Path:
    """A plugin accountant that answers sanely at the loader's probe point (σ = 1, q = 0.01,
    T = 100) and ``body`` elsewhere."""
    path = tmp_path / f"{name}.py"
    path.write_text(
        textwrap.dedent(
            f"""
            import math
            from privaudit.core.accountants import Accountant, register_accountant


            @register_accountant
            class Bogus(Accountant):
                name = "{name}"

                def epsilon(self, z, delta, sample_rate, rounds):
                    if abs(z - 1.0) < 1e-12 and abs(sample_rate - 0.01) < 1e-12:
                        return 1.0  # what the loader's probe sees
                    {body}
            """
        )
    )
    return path


def train_with(capsys, plugin: Path, accountant: str, out: Path, *flags: str):
    """``privaudit --plugin PLUGIN train`` of dp-dpsgd with that accountant into ``out``."""
    return run_cli(
        capsys, "--plugin", str(plugin), "train", "--defense", "dp-dpsgd", "--preset",
        "attack", "--accountant", accountant, "--out", str(out), *flags, *QUIET,
    )  # fmt: skip


@pytest.mark.parametrize("answer", ["-3.0", "float('nan')", "0.0"])
def test_an_accountant_answering_garbage_off_its_probe_point_is_one_line(tmp_path, capsys, answer):
    """A negative, NaN or impossible (0) ε at the run's own point is never read as "ε = 0":
    train stops with one line naming the accountant and its plugin, and no run is left."""
    plugin = accountant_plugin(tmp_path, f"return {answer}")
    out = tmp_path / "run"
    code, _, err = train_with(capsys, plugin, "probebogus", out, "--sigma", "1")
    assert code == 2
    one_error_line(err, "probebogus", "plugin")
    assert not (out / "config.json").exists()


def test_an_accountant_that_raises_names_itself_not_a_privaudit_bug(tmp_path, capsys):
    plugin = accountant_plugin(tmp_path, "raise KeyError('boom')", name="proberaiser")
    code, _, err = train_with(capsys, plugin, "proberaiser", tmp_path / "run", "--epsilon", "1")
    assert code == 2
    line = one_error_line(err, "proberaiser", "boom")
    assert "internal error" not in line


def test_an_attack_plugin_that_raises_names_the_plugin(tmp_path, capsys):
    plugin = tmp_path / "badattack.py"
    plugin.write_text(
        textwrap.dedent(
            """
            from privaudit.attacks import register_attack


            def explode(
                observations, *, iterations=None, restarts=None, seed=0, device=None,
                progress=False,
            ):
                raise ZeroDivisionError("bad attack")


            register_attack("explode", explode)
            """
        )
    )
    code, _, err = run_cli(
        capsys,
        "--plugin",
        str(plugin),
        "attack",
        "--target",
        "dpdl-cg",
        "--round",
        "2",
        "--attack",
        "explode",
        "--out",
        str(tmp_path / "a"),
        *QUIET,
    )
    assert code == 2
    line = one_error_line(err, "explode", "bad attack")
    assert "internal error" not in line


def test_an_edited_rounds_with_its_hash_updated_is_refused(tmp_path, capsys):
    """Forging ``rounds`` in config.json and updating its hash in manifest.json (as a
    careful editor would) does not make the run account for more rounds than it recorded."""
    out = tmp_path / "run"
    code, _, _ = run_cli(
        capsys, "train", "--defense", "dp-dpsgd", "--preset", "attack", "--epsilon", "1",
        "--out", str(out), *QUIET,
    )  # fmt: skip
    assert code == 0
    cfg_path, man_path = out / "config.json", out / "manifest.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["rounds"] = 4
    cfg_path.write_text(json.dumps(cfg, indent=2))
    man = json.loads(man_path.read_text())
    man["files"]["config.json"] = entry(cfg_path.read_bytes())  # the hash, updated by hand
    man_path.write_text(json.dumps(man))
    snapshot = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"}
    code, _, err = run_cli(
        capsys, "mia", "--target", "dp-dpsgd-half-model", "--attack", "loss", "--run", str(out),
        "--out", str(tmp_path / "mia"), "--no-progress",
    )  # fmt: skip
    assert code == 2
    one_error_line(err, "rounds")
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == snapshot


def test_a_unicode_out_under_the_c_locale_is_not_an_internal_error(tmp_path):
    """The run lock writes the command line; under LC_ALL=C a UTF-8 --out cannot be encoded
    by the locale, and the lock must neither fail nor leave the folder holding only .lock."""
    out = tmp_path / "r\u00e9sultat-\u03b5"
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "privaudit.cli", "train", "--defense", "dsgd", "--preset",
         "attack", "--out", os.fsencode(str(out)), *QUIET],
        env=env, capture_output=True, timeout=600,
    )  # fmt: skip
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0, err
    assert "internal error" not in err and "Traceback" not in err
    assert (out / "config.json").exists()


def test_an_interrupted_audit_exits_non_zero_with_the_interrupted_line(
    tmp_path, capsys, monkeypatch
):
    """A Ctrl-C in the middle of the trials keeps the bounds of the trials that ran (the
    audit returns them, ``interrupted`` set), but the command says so — in the text report's
    last line on stderr — and exits 2, so a script never takes it for a finished audit."""
    from privaudit.experiments import audit as experiment

    real = experiment.audit

    def cut_short(*args, **kw):
        res = real(*args, **kw)
        res.details["interrupted"] = True  # as if Ctrl-C had ended the trials here
        return res

    monkeypatch.setattr(experiment, "audit", cut_short)
    code, out, err = run_cli(
        capsys, "audit", "--target", "dp-dpsgd-half-model", "--trials", "200",
        "--out", str(tmp_path / "a"), *QUIET,
    )  # fmt: skip
    assert code == 2
    one_error_line(err, "interrupted after", "of 200 trials", "run the same command again")
    assert "ε lower ≥" in out  # the bounds of the trials that ran are still shown
    assert json.loads((tmp_path / "a" / "audit.json").read_text())["interrupted"] is True


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--cell-cpus", "nan"], "--cell-cpus"),
        (["--cell-cpus", "inf"], "--cell-cpus"),
        (["--cell-gpus", "nan"], "--cell-gpus"),
        (["--ray-address", "garbage"], "--ray-address"),
        (["--ray-address", ""], "--ray-address"),
    ],
)
def test_ray_settings_are_checked_before_any_cluster_starts(tmp_path, capsys, flags, needle):
    out = tmp_path / "study"
    code, _, err = run_cli(
        capsys, "compare", "--targets", "nd-cg", "--rounds", "1", "--executor", "ray",
        *flags, "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert code == 2
    one_error_line(err, needle)
    assert not out.exists() or not any(out.iterdir())


def test_running_out_of_memory_is_one_line_naming_the_fixes(tmp_path, capsys, monkeypatch):
    """Settings that need more memory than the machine gives (64–140 ResNet-18 agents on
    this machine failed inside the defense's init()) are the user's to change, not a bug."""
    from privaudit.sim.run import Run

    def too_big(*args, **kw):
        raise MemoryError

    monkeypatch.setattr(Run, "create", classmethod(lambda cls, *a, **k: too_big()))
    code, _, err = run_cli(
        capsys, "train", "--defense", "dsgd", "--preset", "attack", "--out",
        str(tmp_path / "r"), *QUIET,
    )  # fmt: skip
    assert code == 2
    line = one_error_line(err, "out of memory", "--agents")
    assert "internal error" not in line


def test_a_threat_whose_sees_raises_past_the_probe_names_its_plugin(tmp_path, capsys):
    """The loader probes ``sees`` on a few links; one that raises on another link (here any
    link into agent 3) fails where the attack builds its view: one line naming the threat
    model, its plugin and the method."""
    plugin = tmp_path / "fragile.py"
    plugin.write_text(
        textwrap.dedent(
            """
            from dataclasses import dataclass

            from privaudit.core.threat import Threat, register_threat


            @register_threat
            @dataclass(frozen=True)
            class Fragile(Threat):
                name = "fragile"
                strength = 5
                summary = "raises on links into agent 3"

                def sees(self, src, dst):
                    if dst == 3:
                        raise LookupError("no inbox for 3")
                    return dst in self.agents
            """
        )
    )
    code, _, err = run_cli(
        capsys, "--plugin", str(plugin), "attack", "--target", "dpdl-cg", "--round", "2",
        "--threat", "fragile", "--attacker", "1", "--victim", "0", "--iterations", "5",
        "--out", str(tmp_path / "a"), *QUIET,
    )  # fmt: skip
    assert code == 2
    line = one_error_line(err, "fragile", "sees()", "no inbox for 3")
    assert "internal error" not in line


def test_a_defense_returning_a_state_of_the_wrong_shape_names_its_plugin(tmp_path, capsys):
    plugin = tmp_path / "shrinking.py"
    plugin.write_text(
        textwrap.dedent(
            """
            from privaudit.defenses import register
            from privaudit.defenses.dsgd import DSGD


            @register
            class Shrinking(DSGD):
                name = "shrinking"

                def round(self, ctx, p, state, net, batch):
                    out = super().round(ctx, p, state, net, batch)
                    return {"x": out["x"][:, :-1]}  # one coordinate short
            """
        )
    )
    out = tmp_path / "r"
    code, _, err = run_cli(
        capsys, "--plugin", str(plugin), "train", "--defense", "shrinking", "--preset",
        "attack", "--out", str(out), *QUIET,
    )  # fmt: skip
    assert code == 2
    line = one_error_line(err, "shrinking", "plugin", "shape")
    assert "internal error" not in line
