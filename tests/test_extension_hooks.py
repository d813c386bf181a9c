"""What a registered extension answers is checked at every call (issue 44), not only at the
plugin loader's probe point: an accountant's ε (a number ≥ 0, and no less than one round
alone proves), a calibrated σ (sound), a threat model's ``sees`` (True or False, no
exception), an attack's answer (one Reconstruction per Observation), a defense's state (one
row per agent, the shapes it was handed). A plugin's failure is one line naming it, the hook
and the exception; the same failure of a built-in stays a privaudit bug. Also: the memory
the pre-flight compares with is what the process can still allocate, and the run lock
writes a command line the locale cannot spell."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import run_cli

from privaudit.cli import main
from privaudit.core import limits
from privaudit.core.accountants import (
    RDP,
    Accountant,
    AccountantLimit,
    register_accountant,
)
from privaudit.core.accounting import (
    epsilon_for_sigma,
    gdp_delta,
    kind_epsilon,
    one_round_delta,
    sigma_for_epsilon,
)
from privaudit.core.errors import PrivauditError
from privaudit.core.extensions import ExtensionFailed
from privaudit.core.privacy import Privacy
from privaudit.core.threat import THREATS, Threat, build_threat, register_threat
from privaudit.plugins import load_plugins
from privaudit.sim import runlock

pytestmark = pytest.mark.usefixtures("registries")

SMALL = ["--agents", "3", "--batch-size", "2", "--no-progress"]


def failed(capsys, *argv: str) -> str:
    """Run the CLI: exit code 2, one ``privaudit: error:`` line and no traceback; the line."""
    code, out, err = run_cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("privaudit: error:"), err
    assert "Traceback" not in err + out and "internal error" not in err, err
    return lines[0]


def accountant(name: str, answer, cost=None) -> type[Accountant]:
    """Register (from this test module: not a built-in) an accountant answering
    ``answer(z, delta, q, rounds)``, and costing ``cost`` when given."""

    class Acc(Accountant):
        def epsilon(self, z, delta, sample_rate, rounds):
            return answer(z, delta, sample_rate, rounds)

    Acc.name = name
    if cost is not None:
        Acc.cost = lambda self, *a: cost
    return register_accountant(Acc)


def formal(z: float) -> Privacy:
    return Privacy(mechanism="gaussian", formal=True, noise_multiplier=z, releases=1)


# -- accountants -----------------------------------------------------------------------------
@pytest.mark.parametrize("answer", [-3.0, math.nan, "1.0", True])
def test_an_accountants_answer_that_is_no_epsilon_is_one_line_naming_it(answer):
    accountant("weird", lambda *a: answer)
    with pytest.raises(ExtensionFailed) as e:
        epsilon_for_sigma(1.0, 1e-5, 0.01, 100, accountant="weird")
    line = str(e.value)
    assert line.startswith("accountant 'weird' (module test_extension_hooks): its epsilon()")
    assert f"answered ε = {answer!r} at σ = 1, δ = 1e-05, q = 0.01, 100 rounds" in line
    assert "fix: return a float ε ≥ 0" in line


def test_infinity_is_no_bound_and_stands():
    accountant("nobound", lambda *a: math.inf)
    assert epsilon_for_sigma(1.0, 1e-5, 0.01, 100, accountant="nobound") == math.inf


def test_an_epsilon_below_what_one_round_proves_is_refused_at_the_call():
    """ε = 0 at σ = 1, q = 0.01: one round alone has δ(0) ≈ 0.0038 > 1e-5. An accountant
    that says so would report any run as perfectly private."""
    accountant("zero", lambda *a: 0.0)
    with pytest.raises(ExtensionFailed, match=r"answers ε = 0 at σ = 1, .* one round alone"):
        epsilon_for_sigma(1.0, 1e-5, 0.01, 100, accountant="zero")


def test_a_calibration_an_unsound_accountant_drives_to_too_little_noise_is_refused(
    monkeypatch,
):
    """An accountant answering a tenth of RDP's ε is caught during the σ search (a plugin's
    every answer is checked); a built-in one — whose answers are not checked call by call —
    by the σ it calibrates (a bug: not the user's line)."""
    rdp = RDP.epsilon
    accountant("tenth", lambda z, d, q, t: 0.1 * rdp(RDP(), z, d, q, t))
    with pytest.raises(ExtensionFailed, match=r"its epsilon\(\) answers ε = .* one round alone"):
        sigma_for_epsilon(1.0, 1e-5, 1.0, 1, accountant="tenth")
    monkeypatch.setattr(RDP, "epsilon", lambda self, *a: 0.1 * rdp(self, *a))
    with pytest.raises(RuntimeError, match=r"answers calibrate σ = .* one round alone") as e:
        sigma_for_epsilon(1.0, 1e-5, 1.0, 1)
    assert not isinstance(e.value, PrivauditError)


def test_a_plugins_exception_without_fallback_names_it_its_limit_stays_its_own():
    accountant("raiser", lambda *a: {}["k"])
    with pytest.raises(ExtensionFailed, match=r"its epsilon\(\) raised KeyError: 'k'"):
        kind_epsilon(formal(1.0), 1e-5, 0.01, 10, "raiser")
    accountant("valueerror", lambda *a: float("x"))  # a ValueError: "cannot answer" class
    with pytest.raises(ExtensionFailed, match="raised ValueError"):
        kind_epsilon(formal(1.0), 1e-5, 0.01, 10, "valueerror")

    def limited(*a):
        raise AccountantLimit("too far from my grid; use --accountant rdp")

    accountant("limited", limited)
    with pytest.raises(AccountantLimit, match="too far from my grid"):
        kind_epsilon(formal(1.0), 1e-5, 0.01, 10, "limited")


def test_a_cost_that_is_no_number_is_refused():
    accountant("nancost", lambda z, d, q, t: RDP().epsilon(z, d, q, t), cost=math.nan)
    with pytest.raises(ExtensionFailed, match=r"its cost\(\) answered nan"):
        sigma_for_epsilon(1.0, 1e-5, 0.01, 10, accountant="nancost")


def test_a_built_in_answering_garbage_is_a_bug_not_a_users_line(monkeypatch):
    monkeypatch.setattr(RDP, "epsilon", lambda self, *a: -1.0)
    with pytest.raises(RuntimeError, match="the built-in accountant") as e:
        epsilon_for_sigma(1.0, 1e-5, 0.01, 10)
    assert not isinstance(e.value, PrivauditError)


def test_the_one_round_bound_is_the_gaussian_at_rate_one_and_below_the_built_ins():
    """At q = 1 it is the Gaussian mechanism's exact δ(ε); and every σ the built-in
    accountants calibrate passes it (they are sound), RDP over a grid, PRV where it is
    tightest (one round: within 5 % of the bound)."""
    assert one_round_delta(2.0, 1.5, 1.0) == pytest.approx(gdp_delta(1.5, 0.5))
    assert one_round_delta(1.0, math.inf, 0.3) == 0.0
    for eps in (0.1, 8.0, 100.0):  # (RDP at q = 0.5 takes seconds a σ: left out)
        for delta in (1e-12, 0.5):
            for q, rounds in ((0.01, 100), (1.0, 1)):
                try:
                    sigma_for_epsilon(eps, delta, q, rounds)  # raises if unsound
                except PrivauditError as e:
                    assert "out of reach" in str(e) or "cannot reach" in str(e), e
    for eps, delta in ((1.0, 1e-5), (8.0, 0.5)):
        z = sigma_for_epsilon(eps, delta, 1.0, 1, accountant="prv")
        assert one_round_delta(z, eps, 1.0) <= delta * 1.05


# -- threat models -----------------------------------------------------------------------------
def test_a_sees_that_answers_no_bool_or_raises_is_one_line_naming_the_threat():
    @register_threat
    class Odd(Threat):
        name = "odd"

        def sees(self, src: int, dst: int) -> bool:
            if dst == 2:
                raise IndexError("no agent 2 here")
            return "yes" if dst == 1 else False  # type: ignore[return-value]

    th = build_threat("odd", attackers=[0])
    assert th.sees(0, 3) is False
    with pytest.raises(ExtensionFailed, match=r"answered 'yes' for the link 0→1, not True"):
        th.links([(0, 1)])
    with pytest.raises(ExtensionFailed) as e:
        th.links([(0, 2)])
    assert "threat 'odd' (module test_extension_hooks): its sees() raised IndexError" in str(
        e.value
    )
    assert isinstance(e.value.__cause__, IndexError)  # --debug prints its traceback
    assert build_threat("global").links([(0, 1), (1, 0)]) == {(0, 1), (1, 0)}


def test_the_loader_still_refuses_a_sees_that_answers_no_bool(tmp_path):
    plugin = tmp_path / "yes.py"
    plugin.write_text(
        "from privaudit.core.threat import Threat, register_threat\n\n"
        "@register_threat\nclass Yes(Threat):\n    name = 'yes'\n\n"
        "    def sees(self, src, dst):\n        return 'yes'\n"
    )
    with pytest.raises(PrivauditError) as e:
        load_plugins([plugin], environment=False)
    line = str(e.value)
    assert line.startswith(f"plugin {plugin}: threat model 'yes''s sees() answered 'yes'"), line
    assert "fix: return True or False" in line and "yes" not in THREATS


# -- attacks and defenses through the command line ------------------------------------------
@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("runs") / "nd"
    argv = ["train", "--defense", "nd", "--rounds", "2", *SMALL, "--out", str(path)]
    assert main(argv) == 0
    return path


GARBAGE = {  # what the attack returns → what the line says
    "[]": "returned 0 reconstruction(s) for 1 observation(s)",
    "None": "returned a NoneType, not a list of Reconstruction",
    "[Reconstruction(torch.zeros(b, 1, 2, 2), torch.zeros(b, dtype=torch.long), 0.0)]": (
        "returned images of shape"
    ),
}


@pytest.mark.parametrize("returns", list(GARBAGE))
def test_an_attack_returning_garbage_is_one_line_naming_its_plugin(
    tmp_path, capsys, small_run, returns
):
    plugin = tmp_path / "garbage.py"
    plugin.write_text(
        textwrap.dedent(
            f"""
            import torch
            from privaudit.attacks import register_attack
            from privaudit.core.observation import Reconstruction


            def garbage(observations, *, iterations=None, restarts=None, seed=0, device=None,
                        progress=False):
                b = int(observations[0].batch_size)
                return {returns}


            register_attack("garbage", garbage)
            """
        )
    )
    out = tmp_path / "a"
    argv = ["attack", "--target", "nd-cg", "--round", "1", "--run", str(small_run)]
    line = failed(capsys, "--plugin", str(plugin), *argv, "--attack", "garbage", "--out", str(out))
    assert f"attack 'garbage' (plugin {plugin}): its attack function" in line, line
    assert GARBAGE[returns] in line and "fix: return a list of Reconstruction" in line, line
    assert not (out / "result.json").exists()


def test_a_defense_whose_init_returns_other_rows_is_one_line_and_leaves_nothing(tmp_path, capsys):
    plugin = tmp_path / "rows.py"
    plugin.write_text(
        textwrap.dedent(
            """
            from privaudit.defenses import register
            from privaudit.defenses.dsgd import DSGD


            @register
            class Rows(DSGD):
                name = "rows"

                def init(self, ctx, p):
                    state = super().init(ctx, p)
                    return {"x": state["x"][:1]}  # one agent's row for three agents
            """
        )
    )
    out = tmp_path / "r"
    argv = ["--plugin", str(plugin), "train", "--defense", "rows", "--rounds", "2", *SMALL]
    line = failed(capsys, *argv, "--out", str(out))
    assert f"defense 'rows' (plugin {plugin}) failed before round 1: its init()" in line, line
    assert "'x' has 1 rows" in line and "not one per agent (3)" in line, line
    assert "fix the plugin" in line and not out.exists()


# -- memory available to this process -----------------------------------------------------------
def test_the_state_preflight_compares_with_what_the_process_can_allocate(monkeypatch):
    """64 ResNet-18 agents (11.2 M parameters) need 11 GB of state: refused at once where
    the process can allocate 1 GB, whatever the machine's RAM."""
    monkeypatch.setattr(limits, "available_memory", lambda: 2**30)
    with pytest.raises(PrivauditError, match=r"more than the 1 GB available on cpu; lower"):
        limits.check_memory(64, 64, 11_200_000, "cpu")
    limits.check_memory(2, 2, 1000, "cpu")


def _cgroup(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def test_cgroup_limits_v1_and_v2_and_their_ancestors_count(tmp_path):
    v1 = tmp_path / "v1"
    job = v1 / "memory" / "jobs" / "7"
    _cgroup(job, {"memory.limit_in_bytes": "9223372036854771712", "memory.usage_in_bytes": "5"})
    _cgroup(job.parent, {"memory.limit_in_bytes": "3000", "memory.usage_in_bytes": "1000"})
    membership = "4:memory:/jobs/7\n3:cpu:/\n0::/\n"
    assert limits.cgroup_headroom(v1, membership) == 2000  # the parent's limit binds
    v2 = tmp_path / "v2"
    _cgroup(v2 / "user" / "app", {"memory.max": "10000", "memory.current": "2500"})
    _cgroup(v2 / "user", {"memory.max": "max", "memory.current": "2500"})
    assert limits.cgroup_headroom(v2, "0::/user/app\n") == 7500
    assert limits.cgroup_headroom(tmp_path / "none", "0::/\n") is None


def test_rlimit_as_bounds_what_is_available(tmp_path):
    """A process under ``ulimit -v`` can allocate at most its limit less what it has mapped."""
    code = textwrap.dedent(
        """
        import resource
        from privaudit.core import limits
        used = limits.address_space_headroom()
        assert used is None, used
        pages = int(open("/proc/self/statm").read().split()[0])
        size = pages * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (size + 2**28, resource.RLIM_INFINITY))
        room = limits.available_memory()
        assert 0 < room <= 2**28, room
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip() == "ok", proc.stderr


# -- the run lock under a locale that cannot spell the command line -----------------------------
def test_the_lock_notes_a_command_line_of_undecodable_bytes(tmp_path, monkeypatch):
    """Under LC_ALL=C a UTF-8 --out reaches sys.argv as surrogate escapes: the lock writes
    the argument's own bytes back, instead of failing the command (an internal error that
    left the folder holding only .lock)."""
    out = tmp_path / "r\udcc3\udca9sultat"
    monkeypatch.setattr(sys, "argv", ["privaudit", "train", "--out", str(out)])
    with runlock.writer(tmp_path):
        pass
    note = (tmp_path / runlock.WRITER).read_bytes()
    assert note.endswith(b"train --out " + str(tmp_path).encode() + b"/r\xc3\xa9sultat\n")
    assert "résultat" in runlock.holder(tmp_path)
