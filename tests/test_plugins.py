"""Plugins (privaudit/plugins.py): the example package's defenses and attack through every
command and both engines, its installation through entry points, and one clear line for
every broken plugin with the built-ins left working."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_states_match, run_cli

from privaudit.attacks import ATTACKS
from privaudit.core.accountants import ACCOUNTANTS
from privaudit.core.accounting import epsilon_for_sigma, release_epsilon
from privaudit.core.errors import PLUGIN_ENV as ENV
from privaudit.defenses import DEFENSES
from privaudit.sim.run import Run
from privaudit.sim.rundir import RunDir

pytestmark = pytest.mark.usefixtures("registries")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "plugin"
DEFENSE = EXAMPLE / "privaudit_example" / "defense.py"
ATTACK = EXAMPLE / "privaudit_example" / "attack.py"
THREAT = EXAMPLE / "privaudit_example" / "threat.py"
ACCOUNTANT = EXAMPLE / "privaudit_example" / "accountant.py"
PLUGINS = ["--plugin", str(DEFENSE), "--plugin", str(ATTACK)]
NEW_TARGETS = ["cta-dpsgd-model", "cta-dpsgd-halfnoise-model"]
QUIET = ["--no-progress", "--json"]


def cli_process(*argv: str, env: dict[str, str] | None = None):
    """The CLI in a fresh process, which loads only what it finds itself (``env``: extra
    environment variables)."""
    base = {k: v for k, v in os.environ.items() if k != ENV}
    return subprocess.run(
        [sys.executable, "-m", "privaudit.cli", *argv],
        capture_output=True,
        text=True,
        env=base | (env or {}),
    )


def targets(capsys, *plugins: str) -> list[str]:
    code, out, err = run_cli(capsys, *plugins, "targets", "--json")
    assert code == 0, err
    return [row["target"] for row in json.loads(out)]


# -- a plugin defense gets what a built-in gets ---------------------------------------------------
def test_targets_lists_the_plugins_targets_after_the_built_ins(capsys):
    built_in = targets(capsys)
    assert not set(NEW_TARGETS) & set(built_in)
    assert targets(capsys, *PLUGINS) == built_in + NEW_TARGETS
    assert targets(capsys) == built_in + NEW_TARGETS  # loaded once, for this process


def test_train_attack_with_a_plugin_defense_and_attack(tmp_path, capsys):
    run = tmp_path / "run"
    train = "train --defense cta-dpsgd --agents 3 --rounds 3 --sigma 1 --batch-size 4".split()
    code, out, err = run_cli(capsys, *PLUGINS, *train, "--out", str(run), *QUIET)
    assert code == 0, err
    eps = json.loads(out)["kinds"]["model"]["epsilon"]
    assert json.loads((run / "config.json").read_text())["defense"] == "cta-dpsgd"
    assert 0 < eps < math.inf
    attack = ["attack", "--run", str(run), *"--target cta-dpsgd-model --round 1".split()]
    for name in ("ig", "guess"):  # a built-in attack, then the plugin's
        extra = ["--iterations", "4"] if name == "ig" else []
        argv = [*attack, "--attack", name, *extra, "--no-lpips", "--out", str(tmp_path / name)]
        code, out, err = run_cli(capsys, *PLUGINS, *argv, *QUIET)
        assert code == 0, err
        result = json.loads(out)
        assert result["attack"] == name and result["target"] == "cta-dpsgd-model"
        assert result["epsilon"] == pytest.approx(eps)
        assert result["exact_observation"]  # round 1: every model is x_0
        assert result["noise_std"] == [pytest.approx(1.0 * 1.0 / 4)]  # σC/B


def test_a_plugin_threat_model_and_accountant_work_like_the_built_ins(tmp_path, capsys):
    """The example's ``inbox`` threat (what an agent receives, not what it sends) and
    ``advanced`` accountant (amplification + advanced composition), loaded from files:
    training accounts with the plugin accountant (a larger σ for the same ε than RDP, as the
    looser bound must give), and the attack runs under the plugin threat where it observes
    the message (D-PSGD's model: a broadcast) and refuses, with one line, where it does not
    (DPDL's cross-gradient needs the receiver's own outgoing model)."""
    plugins = ["--plugin", str(THREAT), "--plugin", str(ACCOUNTANT)]
    sigmas = {}
    for acc in ("rdp", "advanced"):
        argv = "train --defense dp-dpsgd --agents 3 --rounds 3 --epsilon 8 --batch-size 4"
        argv = [*argv.split(), "--accountant", acc, "--out", str(tmp_path / acc), *QUIET]
        code, out, err = run_cli(capsys, *plugins, *argv)
        assert code == 0, err
        sigmas[acc] = json.loads(out)["sigma"]
        assert json.loads((tmp_path / acc / "config.json").read_text())["accountant"] == acc
    assert sigmas["advanced"] > 1.2 * sigmas["rdp"]
    z, q = 1.0, 0.01
    assert ACCOUNTANTS["advanced"].epsilon(z, 1e-5, q, 100) > epsilon_for_sigma(z, 1e-5, q, 100)

    attack = ["attack", "--threat", "inbox", "--attacker", "1", "--round", "1"]
    attack += ["--iterations", "2", "--no-lpips", *QUIET]
    run = ["--run", str(tmp_path / "rdp")]
    argv = [*attack, *run, "--target", "dp-dpsgd-half-model", "--victim", "0"]
    code, out, err = run_cli(capsys, *plugins, *argv, "--out", str(tmp_path / "a"))
    assert code == 0, err
    assert json.loads(out)["adversaries"] == ["inbox 1"]
    train = "train --defense dpdl --agents 3 --rounds 1 --sigma 1 --batch-size 4".split()
    code, _, err = run_cli(capsys, *train, "--out", str(tmp_path / "dpdl"), *QUIET)
    assert code == 0, err
    argv = [*attack, "--run", str(tmp_path / "dpdl"), "--target", "dpdl-cg", "--victim", "0"]
    code, _, err = run_cli(capsys, *plugins, *argv, "--out", str(tmp_path / "b"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "the inbox adversary does not see" in err


def test_a_run_of_a_plugin_defense_needs_the_plugin_again(tmp_path, capsys):
    """A run records its defense's name only: a fresh process without the plugin says how
    to load it; with PRIVAUDIT_PLUGINS it attacks the run."""
    run = tmp_path / "run"
    argv = "train --defense cta-dpsgd --agents 3 --rounds 2 --sigma 1 --no-progress".split()
    code, _, err = run_cli(capsys, "--plugin", str(DEFENSE), *argv, "--out", str(run))
    assert code == 0, err
    attack = ["attack", "--run", str(run), "--target", "cta-dpsgd-model", "--round", "1"]
    attack += ["--iterations", "2", "--no-lpips", *QUIET, "--out", str(tmp_path / "a")]
    proc = cli_process(*attack)
    assert proc.returncode == 2
    assert proc.stderr.startswith("privaudit: error: unknown target 'cta-dpsgd-model'")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "--plugin FILE.py" in proc.stderr and "pip install its package" in proc.stderr
    proc = cli_process(*attack, env={ENV: str(DEFENSE)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["target"] == "cta-dpsgd-model"


def test_audit_passes_the_plugin_and_catches_its_halved_noise(tmp_path, capsys):
    """σ = 1, one release: ε = 4.39 at δ = 1e-5. The correct defense's observation is that
    Gaussian release (μ = 1): its lower bound stays below 4.39. The twin's noise is σ/2
    (μ = 2, ε ≈ 10): its bound at confidence 0.999 lies well above 4.39. The audit seed is
    fixed, so the outcome is deterministic."""
    verdicts = {}
    audit = "--agents 4 --rounds 2 --sigma 1 --trials 400 --confidence 0.999".split()
    for name in ("cta-dpsgd", "cta-dpsgd-halfnoise"):
        argv = ["audit", "--target", f"{name}-model", *audit, "--out", str(tmp_path / name)]
        code, out, err = run_cli(capsys, *PLUGINS, *argv, *QUIET)
        assert code == 0, err
        res = json.loads(out)
        assert res["upper"]["accountant"] == pytest.approx(release_epsilon(1.0, 1e-5))
        verdicts[name] = res["verdict"]
        assert "gdp" in res  # the observation is exactly the Gaussian release
    assert verdicts["cta-dpsgd"] != "violated"
    assert verdicts["cta-dpsgd-halfnoise"] == "violated"


def test_the_ledger_real_example_audit_catches_the_halved_noise(tmp_path, capsys):
    """The ledger's input-space audit (a real training example as the canary) on the
    setting above: within the correct defense's ε, above the twin's stated one (its noise is
    half what it states); the twin's violation holds at the ledger's Bonferroni level."""
    argv = "claims --defense cta-dpsgd,cta-dpsgd-halfnoise --agents 4 --rounds 2 --sigma 1"
    argv += " --trials 400 --confidence 0.999 --json --no-progress"
    code, out, err = run_cli(capsys, *PLUGINS, *argv.split(), "--out", str(tmp_path))
    assert code == 0, err
    rows = {r["target"]: r for r in json.loads(out)["rows"]}
    ok, twin = rows["cta-dpsgd-model"], rows["cta-dpsgd-halfnoise-model"]
    assert ok["real"]["epsilon_lo"] <= ok["accounting"]["epsilon"]
    assert ok["real"]["verdict"] != "violated"
    assert twin["real"]["epsilon_lo"] > twin["accounting"]["epsilon"]
    assert twin["real"]["verdict"] == "violated" and twin["real"]["confidence"] > 0.999


def test_distributed_ranks_load_the_plugin_and_resume(tmp_path, capsys):
    """Forked ranks load the launcher's plugin files; the run ends where the simulator's
    does, and resumes on the distributed engine from a checkpoint."""
    assert torch.distributed.is_available() and torch.distributed.is_gloo_available()
    out = tmp_path / "dist"
    argv = ["--plugin", str(DEFENSE), "train", "--backend", "torch.distributed", "--defense"]
    argv += ["cta-dpsgd", "--agents", "3", "--rounds", "4", "--batch-size", "2", "--sigma", "1"]
    argv += ["--checkpoint-every", "2", "--dist-timeout", "60", "--out", str(out), "--no-progress"]
    code, _, err = run_cli(capsys, *argv)
    assert code == 0, err
    cfg = Run.open(out).cfg
    assert (cfg.defense, cfg.agents, cfg.sigma) == ("cta-dpsgd", 3, 1.0)
    sim = Run.create(cfg, tmp_path / "sim")  # the same run on the simulator
    sim.train(progress=False)
    first = RunDir(out).load_checkpoint(4)
    _assert_same_state(first, sim.dir.load_checkpoint(4))
    RunDir(out).remove("checkpoints", 4)  # as if stopped after round 2
    assert RunDir(out).checkpoint_rounds() == [2] and Run.open(out).start_round(4, None) == 2
    code, _, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert RunDir(out).checkpoint_rounds() == [2, 4]
    _assert_same_state(RunDir(out).load_checkpoint(4), first)


def _assert_same_state(got: dict, want: dict) -> None:
    """The agents' rows to float32 rounding (one rank's gradients may round differently
    from the simulator's stacked ones); every generator state bit for bit: each agent drew
    the same batches and noise."""
    assert set(got) == set(want) and any(k.startswith("rng.") for k in want)
    assert_states_match(got, want, rtol=1e-4, atol=1e-5)


# -- installed as a package: entry points -------------------------------------------------------
def test_installed_package_registers_through_entry_points(tmp_path):
    """pip (the running interpreter's own, with the setuptools the dev install declares)
    installs the example package into a folder; a process with that folder on its path loads
    the package's entry points, one without it does not."""
    site = tmp_path / "site"
    source = tmp_path / "plugin"  # pip builds in place: keep the build files out of the repo
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q"]
    installed = subprocess.run(
        [*pip, "--target", str(site), str(source)], capture_output=True, text=True
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    assert (site / "privaudit_example").is_dir()
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path}

    proc = cli_process("targets", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    names = [row["target"] for row in json.loads(proc.stdout)]
    assert names[-2:] == NEW_TARGETS and "dpdl-cg" in names
    code = "from privaudit import plugins, attacks; plugins.load_plugins(); print(attacks.ATTACKS)"
    attacks = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ | env
    )
    assert "'guess'" in attacks.stdout, attacks.stderr
    code = (
        "from privaudit import plugins; from privaudit.core import accountants, threat; "
        "plugins.load_plugins(); print(sorted(threat.THREATS), sorted(accountants.ACCOUNTANTS))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ | env
    )
    assert "'inbox'" in loaded.stdout and "'advanced'" in loaded.stdout, loaded.stderr
    listed = cli_process("targets", "--list", "threats", env=env).stdout
    assert "inbox" in listed and "what some agents receive" in listed
    # the same defenses again by path: one line naming the installed copy and the fix
    proc = cli_process("--plugin", str(DEFENSE), "targets", env=env)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "taken by plugin cta-dpsgd (entry point 'privaudit_example.defense'" in proc.stderr
    # a process without the folder on its path does not see the package
    assert "cta-dpsgd-model" not in cli_process("targets").stdout


# -- broken plugins: one line, exit 2, built-ins intact ------------------------------------------
def defense_source(name: str, kinds: str = "{'m': 'a message'}", methods=("round", "observe")):
    """A plugin file defining (and registering) a Defense with only ``methods`` overridden."""
    body = {
        "round": "    def round(self, ctx, p, state, net, batch):\n        return state\n",
        "observe": "    def observe(self, view, kind, t, src, dst):\n        return None\n",
    }
    return (
        "from dataclasses import dataclass\n"
        "from privaudit.defenses import Defense, register\n\n"
        "@dataclass\nclass P:\n    lr: float = 0.1\n\n"
        f"@register\nclass D(Defense):\n    name = {name!r}\n    kinds = {kinds}\n"
        "    Params = P\n" + "".join(body[m] for m in methods)
    )


USES = "from privaudit.attacks import ATTACKS, register_attack\n"
BROKEN = {  # case → (plugin source, what its one line says)
    "import error": (
        "import privaudit_no_such_module\n",
        "importing it raised ModuleNotFoundError: No module named 'privaudit_no_such_module' "
        "(line 1); fix: fix the file",
    ),
    "syntax error": ("def broken(:\n", "importing it raised SyntaxError"),
    "built-in name": (defense_source("dsgd"), "defense name 'dsgd' is taken by the built-in"),
    "no observe": (
        defense_source("mine", methods=("round",)),
        "defense 'mine' (D) does not override Defense.observe; fix: define observe(self, view",
    ),
    "no round": (
        defense_source("mine", methods=("observe",)),
        "does not override Defense.round; fix: define round(self, ctx, p, state, net, batch)",
    ),
    "target clash": (
        defense_source("dp", kinds="{'dpsgd-half-model': 'a message'}"),
        "target 'dp-dpsgd-half-model' is also a target of the built-in defense 'dp-dpsgd'",
    ),
    "not registered": (
        defense_source("mine").replace("@register\n", ""),
        "registers no defense, attack, threat model or accountant; fix: decorate your "
        "Defense subclass with @",
    ),
    "attack signature": (
        USES + "register_attack('mine', lambda obs: [])\n",
        "attack 'mine' lacks the keyword-only option(s) iterations, restarts, seed, device, "
        "progress; fix: define it as def mine(observations, *,",
    ),
    "attack not callable": (
        USES + "register_attack('mine', 3)\n",
        "attack 'mine' is a int, not a function",
    ),
    "attack name clash": (
        USES + "register_attack('ig', ATTACKS['dlg'])\n",
        "attack name 'ig' is taken by the built-in attack",
    ),
    "replaces a built-in": (
        USES + "ATTACKS['ig'] = ATTACKS['dlg']\n",
        "it replaces or removes the attack 'ig' (the built-in attack)",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_plugin_is_one_line_and_the_built_ins_keep_working(tmp_path, capsys, case):
    source, needle = BROKEN[case]
    plugin = tmp_path / "bad_plugin.py"
    plugin.write_text(source)
    defenses, attacks = dict(DEFENSES), dict(ATTACKS)
    code, out, err = run_cli(capsys, "--plugin", str(plugin), "targets")
    assert code == 2 and not out
    assert err.startswith(f"privaudit: error: plugin {plugin}: "), err
    assert len(err.strip().splitlines()) == 1 and "; fix" in err and needle in err, err
    assert DEFENSES == defenses and ATTACKS == attacks  # nothing of it stays registered
    assert [k for k, v in DEFENSES.items() if v is defenses[k]] == list(defenses)
    code, out, err = run_cli(capsys, "targets")
    assert code == 0 and "dsgd-half-model" in out and not err


def test_a_name_taken_by_another_plugin_names_that_plugin(tmp_path, capsys):
    copy = tmp_path / "copy.py"
    copy.write_text(DEFENSE.read_text())
    code, _, err = run_cli(capsys, "--plugin", str(DEFENSE), "--plugin", str(copy), "targets")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"plugin {copy}: defense name 'cta-dpsgd' is taken by plugin {DEFENSE}" in err
    assert "cta-dpsgd" in DEFENSES  # the first copy stays loaded


@pytest.mark.parametrize(
    "path, needle",
    [("missing.py", "no such file; fix: check the path"), ("notes.txt", "not a .py file")],
)
def test_a_plugin_path_that_is_no_python_file(tmp_path, capsys, path, needle):
    (tmp_path / "notes.txt").write_text("hello")
    code, _, err = run_cli(capsys, "--plugin", str(tmp_path / path), "targets")
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_a_broken_plugin_from_the_environment_says_where_it_came_from(
    tmp_path, capsys, monkeypatch
):
    plugin = tmp_path / "env_plugin.py"
    plugin.write_text("raise RuntimeError('boom')\n")
    monkeypatch.setenv(ENV, os.pathsep.join(["", str(plugin)]))
    code, _, err = run_cli(capsys, "targets")
    assert code == 2
    assert f"plugin {plugin} (from {ENV}): importing it raised RuntimeError: boom (line 1)" in err
