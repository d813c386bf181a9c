"""Inputs that cannot crash it: every bad value ends in one line and exit code 2, quickly.

Each case runs the real CLI in process (``privaudit.cli.main``) and asserts the promise of
the CLI's docstring: exit code 2, exactly one stderr line ``privaudit: error: …`` naming
the option, an answer within seconds, and nothing written to ``--out``. A property test
drives arbitrary floats and ints through the config's validation and the accountant.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privaudit.cli import main
from privaudit.cli.options import checked_params
from privaudit.core import limits
from privaudit.core.accounting import calibrate, epsilon_for_sigma, sigma_for_epsilon
from privaudit.core.config import RunConfig
from privaudit.core.context import params_of
from privaudit.core.errors import PrivauditError
from privaudit.core.schema import coerce
from privaudit.defenses import get_defense
from privaudit.scenario.topology import build_topology, metropolis_hastings

SECONDS = 10  # every bad input is answered within this


def run_cli(capsys, *argv: str) -> tuple[int, str, str, float]:
    t0 = time.perf_counter()
    code = main(list(argv))
    wall = time.perf_counter() - t0
    out, err = capsys.readouterr()
    return code, out, err, wall


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "nd"
    argv = ["train", "--defense", "nd", "--rounds", "2", "--agents", "3", "--out", str(path)]
    assert main([*argv, "--no-progress"]) == 0
    return path


TRAIN = ["train", "--defense", "dpdl", "--rounds", "2", "--agents", "3", "--out", "{tmp}/x"]
ND = ["train", "--defense", "nd", "--rounds", "2", "--agents", "3", "--out", "{tmp}/x"]
ATTACK = ["attack", "--target", "nd-cg", "--round", "1", "--run", "{run}", "--out", "{tmp}/x"]
AUDIT = ["audit", "--target", "nd-cg", "--run", "{run}", "--out", "{tmp}/x", "--trials", "64"]
COMPARE = ["compare", "--targets", "nd-cg", "--out", "{tmp}/x"]
CLAIMS = ["claims", "--target", "nd-cg", "--out", "{tmp}/x"]
REPRODUCE = ["reproduce", "dpdl-table3", "--out", "{tmp}/x"]

BAD = {
    # privacy parameters: finite and in range, and an ε the accountant can reach
    "sigma nan": ([*TRAIN, "--sigma", "nan"], "--sigma"),
    "sigma inf": ([*TRAIN, "--sigma", "inf"], "--sigma"),
    "sigma huge": ([*TRAIN, "--sigma", "1e300"], "--sigma"),
    "sigma negative": ([*TRAIN, "--sigma", "-1"], "--sigma"),
    "epsilon inf": ([*TRAIN, "--epsilon", "inf"], "--epsilon"),
    "epsilon nan": ([*TRAIN, "--epsilon", "nan"], "--epsilon"),
    "epsilon huge": ([*TRAIN, "--epsilon", "1e300"], "--epsilon"),
    "epsilon tiny": ([*TRAIN, "--epsilon", "1e-300"], "--epsilon"),
    "epsilon out of the accountant's reach": ([*TRAIN, "--epsilon", "0.01"], "out of reach"),
    "delta tiny": ([*TRAIN, "--delta", "1e-300"], "--delta"),
    "delta nan": ([*TRAIN, "--delta", "nan"], "--delta"),
    "delta too small for prv": ([*TRAIN, "--accountant", "prv", "--delta", "1e-20"], "prv"),
    "seed negative": ([*ND, "--seed", "-1"], "--seed"),
    "seed beyond 64 bits": ([*ND, "--seed", str(2**70)], "--seed"),
    "rounds huge": ([*ND, "--rounds", str(10**8)], "--rounds"),
    "dirichlet alpha nan": ([*ND, "--dirichlet-alpha", "nan"], "--dirichlet-alpha"),
    "threads zero": ([*ND, "--threads", "0"], "--threads"),
    "threads beyond the cores": ([*ND, "--threads", "100000"], "--threads"),
    "checkpoint every zero": ([*ND, "--checkpoint-every", "0"], "--checkpoint-every"),
    "batch size zero": ([*ND, "--batch-size", "0"], "--batch-size"),
    "dist timeout inf": ([*ND, "--dist-timeout", "inf"], "--dist-timeout"),
    "nproc zero": ([*ND, "--nproc", "0"], "--nproc"),
    # resources before work
    "agents beyond the dense-graph cap": ([*ND, "--agents", "100000"], "--agents"),
    "batch larger than a shard": ([*ND, "--batch-size", "5000"], "--batch-size"),
    # the data split is checked before the graph: a prime N on a torus fails on the data
    "data split before the graph": (
        [*ND, "--agents", "9973", "--topology", "torus"],
        "examples cannot give 9973 agents",
    ),
    # typed defense parameters
    "param not a number": ([*ND, "-p", "momentum=abc"], "momentum must be a number (float)"),
    "param a list": ([*ND, "-p", "momentum=[1,2]"], "momentum"),
    "param a bool for a float": ([*ND, "-p", "lr=true"], "lr must be a number"),
    "param nan": ([*ND, "-p", "lr=NaN"], "finite"),
    "param int field given a float": (
        ["train", "--defense", "pdsl", "-p", "permutations=2.5", "--out", "{tmp}/x"],
        "permutations must be an integer",
    ),
    "param negative calib alpha": ([*ND, "-p", "calib_alpha=-1"], "calib_alpha"),
    "param sigma that --sigma/--epsilon set": (
        [*TRAIN, "-p", "sigma=3"],
        "use --sigma S (or --epsilon E) to set the noise multiplier",
    ),
    "audit param sigma that --sigma/--epsilon set": (
        ["audit", "--target", "pdsl-cg", "--agents", "3", "--out", "{tmp}/x", "-p", "sigma=3"],
        "use --sigma S (or --epsilon E)",
    ),
    # attack options and flags
    "attack option not a number": ([*ATTACK, "-a", "tv=abc"], "tv must be a number"),
    "attack lr negative": ([*ATTACK, "-a", "lr=-1"], "lr must be a finite number > 0"),
    "attack option of a flag": ([*ATTACK, "-a", "seed=3"], "--attack-seed"),
    "attack label method unknown": ([*ATTACK, "-a", "label_method=x"], "label_method"),
    "iterations zero": ([*ATTACK, "--iterations", "0"], "--iterations"),
    "iterations negative": ([*ATTACK, "--iterations", "-5"], "--iterations"),
    "restarts zero": ([*ATTACK, "--restarts", "0"], "--restarts"),
    "attack seed negative": ([*ATTACK, "--attack-seed", "-1"], "--attack-seed"),
    "attack round huge": ([*ATTACK, "--round", str(10**9)], "--round"),
    "iterations zero before training": (
        ["attack", "--target", "nd-cg", "--round", "1", "--out", "{tmp}/x", "--iterations", "0"],
        "--iterations",
    ),
    # audit
    "audit trials zero": ([*AUDIT, "--trials", "0"], "--trials"),
    "audit victim beyond the run": ([*AUDIT, "--victim", "9"], "--victim must be an agent"),
    "audit victim negative": ([*AUDIT, "--victim", "-1"], "--victim must be an agent"),
    "audit victim beyond --agents": (
        ["audit", "--target", "nd-cg", "--agents", "3", "--out", "{tmp}/x", "--victim", "7"],
        "--victim must be an agent",
    ),
    "audit confidence nan": ([*AUDIT, "--confidence", "nan"], "--confidence"),
    "audit canary norm inf": ([*AUDIT, "--canary-norm", "inf"], "--canary-norm"),
    "audit seed negative": ([*AUDIT, "--audit-seed", "-1"], "--audit-seed"),
    # compare, claims, reproduce
    "compare epsilon nan": ([*COMPARE, "--epsilons", "1,nan"], "--epsilons"),  # inf: no noise
    "compare seed negative": ([*COMPARE, "--seeds", "-1"], "--seeds"),
    "compare round zero": ([*COMPARE, "--rounds", "0"], "--rounds must be ≥ 1"),
    "compare round huge": ([*COMPARE, "--rounds", str(10**8)], "--rounds"),
    "compare victims zero": ([*COMPARE, "--victims", "0"], "--victims"),
    "compare iterations zero": ([*COMPARE, "--iterations", "0"], "--iterations"),
    "compare audit trials zero": ([*COMPARE, "--audit-trials", "0"], "--audit-trials"),
    "claims trials zero": ([*CLAIMS, "--trials", "0"], "--trials"),
    "claims confidence one": ([*CLAIMS, "--confidence", "1"], "--confidence"),
    "claims row seconds removed": ([*CLAIMS, "--row-seconds", "10"], "--row-seconds was removed"),
    "reproduce one agent": ([*REPRODUCE, "--agents", "1"], "--agents"),
    "reproduce seed negative": ([*REPRODUCE, "--seeds", "-3"], "--seeds"),
    # flags that would be ignored or silently lose to another
    "attack --run with training flags": (
        [*ATTACK, "--agents", "6", "--dataset", "mnist", "--epsilon", "8"],
        "--agents, --dataset, --epsilon do nothing with --run",
    ),
    "audit --run with a seed": ([*AUDIT, "--seed", "3"], "--seed does nothing with --run"),
    "sigma for a defense whose noise is a paper constant": (
        ["train", "--defense", "adad2p", "--sigma", "1", "--out", "{tmp}/x"],
        "--sigma 1 would be ignored: adad2p's noise",
    ),
    "sigma for a defense without noise": ([*ND, "--sigma", "1"], "--sigma 1 would be ignored"),
    "epsilon and sigma": ([*TRAIN, "--epsilon", "2", "--sigma", "1"], "both set the noise"),
    "-p lr and --lr": ([*ND, "-p", "lr=0.5", "--lr", "0.01"], "-p lr=0.5 and --lr 0.01"),
    "global threat with an attacker": (
        [*ATTACK, "--threat", "global", "--attacker", "1"],
        "--attacker 1 would be ignored",
    ),
    "audit link threat with an attacker": (
        [*AUDIT, "--threat", "link", "--attacker", "1"],
        "--attacker 1 would be ignored",
    ),
    "a link named twice": (
        [*ATTACK, "--link", "0,1", "--link", "1,0", "--link", "0,1"],
        "--link 0,1 is given more than once",
    ),
    # paths
    "out is a file": (["train", "--defense", "nd", "--out", "{file}"], "--out"),
    "attack out is a file": (
        ["attack", "--target", "nd-cg", "--round", "1", "--run", "{run}", "--out", "{file}"],
        "--out",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_and_exit_2_within_seconds(case, tmp_path, small_run, capsys):
    argv, needle = BAD[case]
    (tmp_path / "a-file").write_text("not a folder")
    fill = {"tmp": tmp_path, "run": small_run, "file": tmp_path / "a-file"}
    argv = [a.format(**fill) for a in argv]
    code, _, err, wall = run_cli(capsys, *argv, "--no-progress")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("privaudit: error:") and needle in lines[0], lines[0]
    assert wall < SECONDS, f"{case}: answered in {wall:.1f} s"
    assert not (tmp_path / "x").exists()  # nothing half-written
    assert (tmp_path / "a-file").read_text() == "not a folder"


def test_an_unwritable_out_is_one_line_naming_the_path(tmp_path, small_run, capsys):
    """An --out below a file cannot be created: the OSError becomes one line with the path."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "sub"
    argv = ["attack", "--target", "nd-cg", "--round", "1", "--run", str(small_run)]
    argv += ["--out", str(out), "--iterations", "2", "--no-lpips", "--no-progress"]
    code, _, err, _ = run_cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("privaudit: error:") and str(blocker) in lines[0], lines[0]


def test_ctrl_c_is_one_line_and_exit_2(tmp_path):
    """SIGINT to a real process in the middle of its setup (2,000 agents: seconds of Dirichlet
    draws before the data split is refused) is answered at once: one ``interrupted`` line,
    exit 2. (The round loop adds how to resume; a signal there can land inside torch.)"""
    argv = ["train", "--defense", "nd", "--rounds", "2", "--agents", "2000"]
    argv += ["--batch-size", "1", "--out", str(tmp_path / "run"), "--no-progress"]
    code = (
        "import sys; from privaudit.cli import main; print('ready', flush=True); "
        f"sys.exit(main({argv!r}))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        t0 = time.perf_counter()
        _, err = proc.communicate(timeout=60)
        wall = time.perf_counter() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 2, err
    assert lines == ["privaudit: error: interrupted"], err
    assert wall < SECONDS
    assert not (tmp_path / "run").exists()


def test_memory_is_checked_before_allocation() -> None:
    """A state that cannot fit in this machine's memory is one clear error, not an OOM."""
    with pytest.raises(PrivauditError, match="need at least .* GB .* lower --agents"):
        limits.check_memory(agents=10, held=10, params=10**17, device="cpu")
    limits.check_memory(agents=10, held=10, params=62_006, device="cpu")  # LeNet fits


# -- valid values still work -------------------------------------------------------------
def test_typed_params_keep_valid_values() -> None:
    dpdl = get_defense("dpdl").Params
    p = params_of(dpdl, {"momentum": 0.9, "lr": 1})
    assert p.momentum == 0.9 and isinstance(p.lr, float) and p.lr == 1.0
    assert params_of(get_defense("nd").Params, {"clip": None}).clip is None
    assert (
        params_of(get_defense("pdsl").Params, {"val_size": None, "permutations": 3}).permutations
        == 3
    )
    assert coerce("x", 3, float | None) == 3.0 and coerce("x", None, float | None) is None
    with pytest.raises(PrivauditError, match="x must be true or false, got 1"):
        coerce("x", 1, bool)


def test_cli_params_reach_the_run_typed(tmp_path, capsys) -> None:
    """``-p lr=1`` is stored as the float 1.0, ``-p momentum=0.9`` as 0.9 and ``-p clip=null``
    keeps ND without a clip norm; the run trains."""
    out = tmp_path / "run"
    argv = ["train", "--defense", "nd", "--rounds", "2", "--agents", "3", "--out", str(out)]
    argv += ["-p", "lr=1", "-p", "momentum=0.9", "-p", "clip=null", "--no-progress"]
    code, _, err, _ = run_cli(capsys, *argv)
    assert code == 0, err
    params = json.loads((out / "config.json").read_text())["resolved"]["params"]
    assert params["lr"] == 1.0 and isinstance(params["lr"], float)
    assert params["momentum"] == 0.9 and params["clip"] is None


@pytest.mark.parametrize(
    "defense, param, value",
    [("adad2p", "sigma", 0.05), ("lppa", "beta", 0.1), ("dp-dsgt", "beta", 0.1)],
)
def test_noise_params_no_accountant_sets_are_kept(defense, param, value) -> None:
    """AdaD²P's σ (a paper constant, never set from ε) and the Laplace β of LPPA and DP-DSGT
    stay ``-p`` parameters: refused only where --sigma/--epsilon set σ."""
    topology = "exponential" if get_defense(defense).topology == "exponential" else "ring"
    cfg = RunConfig(defense=defense, agents=4, topology=topology, params={param: value})
    assert checked_params(cfg) is cfg
    assert getattr(params_of(get_defense(defense).Params, cfg.params), param) == value


def test_a_config_read_back_is_typed_as_the_cli() -> None:
    good = json.loads(RunConfig().to_json())
    assert RunConfig.from_dict(good) == RunConfig()
    assert RunConfig.from_dict({**good, "dirichlet_alpha": 1}).dirichlet_alpha == 1.0
    for field, value in [("agents", "10"), ("agents", 10.5), ("agents", True)]:
        with pytest.raises(PrivauditError, match=f"config field {field} must be an integer"):
            RunConfig.from_dict({**good, field: value})
    with pytest.raises(PrivauditError, match="config field sigma must be a finite number"):
        RunConfig.from_dict({**good, "sigma": math.nan})


@pytest.mark.filterwarnings("ignore:Optimal order is the")  # opacus' own search, called here
def test_valid_privacy_values_keep_their_sigma() -> None:
    """The bounded search is opacus' own: σ for ε = 1 over 200 rounds at q = 0.01 is the
    value ``get_noise_multiplier`` finds, and its ε is within the search's tolerance."""
    from opacus.accountants.utils import get_noise_multiplier

    ours = sigma_for_epsilon(1.0, 1e-5, 0.01, 200)
    theirs = get_noise_multiplier(
        target_epsilon=1.0, target_delta=1e-5, sample_rate=0.01, steps=200, epsilon_tolerance=0.005
    )
    assert ours == theirs
    assert 1.0 - 0.005 <= epsilon_for_sigma(ours, 1e-5, 0.01, 200) <= 1.0


# -- arbitrary numbers through validation and accounting -------------------------------------
ANY_FLOAT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.sampled_from([0.0, -0.0, 5e-324, 1e-300, 1e300, 1e-30, 0.999999, 1.0, math.inf]),
)
EPSILONS = st.one_of(ANY_FLOAT, st.floats(min_value=1e-3, max_value=1e3))
DELTAS = st.one_of(ANY_FLOAT, st.floats(min_value=1e-30, max_value=0.5))
SIGMAS = st.one_of(ANY_FLOAT, st.floats(min_value=0.0, max_value=1e6))
COUNTS = st.one_of(st.integers(), st.integers(min_value=1, max_value=10**7))
AGENTS = st.one_of(st.integers(), st.integers(min_value=2, max_value=64))
Q = 0.01  # a fixed sample rate
W3 = metropolis_hastings(build_topology("ring", 3)).to(torch.float64)


def _sigma_or_error(fn, *args) -> float | None:
    """``fn(*args)``: a finite σ ≥ 0, or None where it raised the CLI's one error."""
    try:
        s = fn(*args)
    except PrivauditError:
        return None
    assert s is not None and math.isfinite(s) and s >= 0, s
    return s


@settings(
    max_examples=40,
    deadline=timedelta(seconds=5),
    suppress_health_check=[HealthCheck.too_slow],
)
@given(eps=EPSILONS, delta=DELTAS, sigma=SIGMAS, seed=COUNTS, rounds=COUNTS, n=AGENTS)
def test_any_numbers_raise_one_error_or_give_a_finite_sigma(eps, delta, sigma, seed, rounds, n):
    """Validation, then the accounting path (also with values validation refused: the
    accountant guards itself): one PrivauditError, or a finite σ ≥ 0 and an ε ≥ 0."""
    try:
        cfg = RunConfig(epsilon=eps, delta=delta, sigma=sigma, seed=seed, rounds=rounds, agents=n)
        cfg.validate()
    except PrivauditError:
        pass
    else:
        assert limits.EPSILON[0] <= cfg.epsilon <= limits.EPSILON[1]
        assert limits.DELTA_MIN <= cfg.delta < 1 and 0 <= cfg.sigma <= limits.SIGMA_MAX
        assert 0 <= cfg.seed < 2**63 and 1 <= cfg.rounds <= limits.MAX_ROUNDS
        assert 2 <= cfg.agents <= limits.MAX_AGENTS
    _sigma_or_error(sigma_for_epsilon, eps, delta, Q, rounds)
    dpdl = get_defense("dpdl")
    _sigma_or_error(calibrate, dpdl, params_of(dpdl.Params, {}), W3, [Q] * 3, eps, delta, rounds)
    try:
        e = epsilon_for_sigma(sigma, delta, Q, rounds)
    except PrivauditError:
        return
    assert e >= 0 and not math.isnan(e)


@settings(max_examples=30, deadline=timedelta(seconds=5))
@given(sigma=SIGMAS, delta=DELTAS, rounds=COUNTS)
def test_any_numbers_through_the_prv_accountant_answer_quickly(sigma, delta, rounds):
    """PRV's grid grows with √T and as σ shrinks: past its limit the answer is one error."""
    try:
        e = epsilon_for_sigma(sigma, delta, Q, rounds, accountant="prv")
    except PrivauditError:
        return
    assert e >= 0 and not math.isnan(e)


# -- nothing the user had is overwritten ------------------------------------------------------
USER_FILES = {  # what each command would write, planted by the user beforehand
    "result.json": '{"mine": 1}',
    "grid.png": "my picture",
    "summary.md": "my notes",
    "cells.csv": "a,b",
    "claims.md": "my claims",
    "ledger.json": "{}",
    "audit.json": "{}",
    "table3.md": "my table",
}
WRITERS = {
    "attack": [*ATTACK, "--iterations", "2", "--no-lpips"],
    "audit": [*AUDIT],
    "compare": [*COMPARE, "--rounds", "1", "--agents", "3", "--iterations", "2"],
    "claims": [*CLAIMS, "--agents", "3", "--rounds", "2", "--trials", "16"],
    "reproduce": [*REPRODUCE, "--agents", "3", "--topologies", "ring", "--dataset", "photos"],
}


@pytest.mark.parametrize("command", sorted(WRITERS))
def test_an_out_folder_of_the_users_files_is_refused(command, tmp_path, small_run, capsys):
    """Every command that writes refuses a non-empty --out it did not make: one line naming
    --overwrite, exit 2, every file of the user's byte for byte as it was."""
    out = tmp_path / "x"
    out.mkdir()
    for name, text in USER_FILES.items():
        (out / name).write_text(text)
    argv = [a.format(tmp=tmp_path, run=small_run) for a in WRITERS[command]]
    code, _, err, wall = run_cli(capsys, *argv, "--no-progress")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("privaudit: error: --out") and "--overwrite" in lines[0], err
    assert wall < SECONDS
    assert {p.name: p.read_text() for p in out.iterdir()} == USER_FILES


def test_another_commands_output_is_refused_and_its_own_is_reused(tmp_path, small_run, capsys):
    """attack writes again into the folder it made (a rerun), refuses one made by audit, and
    --overwrite lets it write among the user's files."""
    attack = [a.format(tmp=tmp_path, run=small_run) for a in WRITERS["attack"]]
    for _ in range(2):  # the second run writes into its own folder
        code, out, err, _ = run_cli(capsys, *attack, "--no-progress")
        assert code == 0, err
    audit = [a.format(tmp=tmp_path, run=small_run) for a in AUDIT]
    code, _, err, _ = run_cli(capsys, *audit, "--no-progress")
    assert code == 2 and "holds the output of privaudit attack" in err, err
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    attack[attack.index(str(tmp_path / "x"))] = str(mine)
    code, _, err, _ = run_cli(capsys, *attack, "--overwrite", "--no-progress")
    assert code == 0, err
    assert (mine / "notes.txt").read_text() == "keep me" and (mine / "result.json").exists()


# -- an interrupt is never taken for "this threat cannot observe it" --------------------------
def interrupt_at_round(monkeypatch, t: int) -> None:
    """Send this process a real SIGINT while round ``t`` runs, as a user's Ctrl-C would."""
    import os

    from privaudit.sim.loop import RoundLoop

    step = RoundLoop.step

    def step_and_interrupt(self, state, r, *args, **kw):
        if r == t:
            os.kill(os.getpid(), signal.SIGINT)
        return step(self, state, r, *args, **kw)

    monkeypatch.setattr(RoundLoop, "step", step_and_interrupt)


INTERRUPTED = {
    "attack": ["attack", "--target", "nd-cg", "--round", "3", "--agents", "3", "--no-lpips"],
    "compare": [
        "compare",
        "--targets",
        "nd-cg",
        "--rounds",
        "3",
        "--agents",
        "3",
        "--victims",
        "1",
    ],
}


@pytest.mark.parametrize("command", sorted(INTERRUPTED))
def test_an_interrupt_during_the_threat_search_stops_the_command(
    command, tmp_path, capsys, monkeypatch
):
    """Ctrl-C while the weakest adversary's rounds train: exit 2 with the resume line and no
    result (before the fix the search caught it, went on under another threat and exited 0).
    The same command again resumes and attacks under the threat an uninterrupted run picks."""
    out = tmp_path / "x"
    argv = [*INTERRUPTED[command], "--iterations", "2", "--out", str(out), "--no-progress"]
    interrupt_at_round(monkeypatch, 2)
    code, stdout, err, _ = run_cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert lines[-1].startswith("privaudit: error: interrupted after round"), err
    assert "run the same command again to resume" in lines[-1]
    assert not list(out.rglob("result.json")) and "no adversary" not in err
    monkeypatch.undo()
    code, stdout, err, _ = run_cli(capsys, *argv)
    assert code == 0, err
    (result,) = [json.loads(p.read_text()) for p in out.rglob("result.json")]
    assert result["threat"] == "link", result["adversaries"]


def test_a_second_writer_is_refused_before_data_is_loaded(tmp_path, capsys, monkeypatch):
    """A run folder another process is training is refused at once: the writer lock is
    probed before the data, the graph or the accountant are touched."""
    from privaudit.sim import run

    out = tmp_path / "x"
    out.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'w'); f.write('PID 1: train'); "
            "f.flush(); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
            str(out / ".lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    loads = []
    monkeypatch.setattr(run, "load_dataset", lambda *a, **k: loads.append(a))
    try:
        assert holder.stdout.readline().strip() == "held"
        code, _, err, wall = run_cli(capsys, *[a.format(tmp=tmp_path) for a in ND])
    finally:
        holder.kill()
        holder.wait()
    assert code == 2 and err.count("\n") == 1, err
    assert "being written by another privaudit process (PID 1: train)" in err
    assert not loads and wall < SECONDS


def test_an_attack_that_hands_over_says_what_ran(tmp_path, small_run, capsys):
    """R-GAP inverts one example: on a batch of several, Inverting Gradients runs, and
    result.json and stdout say so (``attack_used`` ig, the reason in ``fallback``)."""
    out = tmp_path / "x"
    argv = ["attack", "--target", "nd-cg", "--round", "1", "--run", str(small_run), "--victim"]
    argv += ["0", "--attack", "rgap", "--iterations", "2", "--no-lpips", "--no-progress"]
    code, stdout, err, _ = run_cli(capsys, *argv, "--out", str(out))
    assert code == 0, err
    result = json.loads((out / "result.json").read_text())
    assert result["batch_sizes"][0] > 1, "the test needs a batch of several examples"
    assert result["attack_used"] == ["ig"] and "one example" in result["fallback"][0]
    assert "rgap (ig)" in stdout and "Inverting Gradients produced the reconstruction" in stdout


def test_a_sigma_run_records_what_was_asked(tmp_path, capsys):
    """--sigma: config.json records σ and no ε (nothing was asked of ε); --epsilon: the ε."""
    for flag, value in (("--sigma", "1.5"), ("--epsilon", "3")):
        out = tmp_path / flag.strip("-")
        argv = [*(a.format(tmp=tmp_path) for a in TRAIN[:-1]), str(out), flag, value]
        code, _, err, _ = run_cli(capsys, *argv, "--no-progress")
        assert code == 0, err
        cfg = json.loads((out / "config.json").read_text())
        want = (1.5, None) if flag == "--sigma" else (None, 3.0)
        assert (cfg["sigma"], cfg["epsilon"]) == want


def test_a_broken_run_is_named_as_such_not_as_an_unobservable_target(tmp_path, small_run, capsys):
    """A corrupt checkpoint met while the threat search re-simulates is the file's own error,
    not "no adversary observes …"; a --run that is a file, a folder with someone's own
    config.json, and a run folder that cannot be written each say what they are."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    ckpt = next((run / "checkpoints").iterdir())
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    argv = ["attack", "--target", "nd-cg", "--round", "2", "--run", str(run), "--no-progress"]
    code, _, err, _ = run_cli(capsys, *argv, "--out", str(tmp_path / "x"))
    assert code == 2 and err.count("\n") == 1, err
    assert "no adversary" not in err and ckpt.name in err, err

    (tmp_path / "a-file").write_text("")
    argv[argv.index(str(run))] = str(tmp_path / "a-file")
    code, _, err, _ = run_cli(capsys, *argv, "--out", str(tmp_path / "y"))
    assert code == 2 and "is a file, not a run directory" in err, err

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"my": "settings"}')
    code, _, err, _ = run_cli(capsys, *(a.format(tmp=tmp_path) for a in ND[:-1]), str(mine))
    assert code == 2 and "privaudit did not write it as a run" in err, err
    assert "older privaudit" not in err
    assert (mine / "config.json").read_text() == '{"my": "settings"}'

    from privaudit.sim import runlock

    with pytest.raises(PrivauditError, match="copy the run somewhere writable"):
        with runlock.writer(tmp_path / "a-file" / "run"):
            pass


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_a_negligible_noise_multiplier_is_infinite_at_once(accountant):
    """σ = 1.77e-157 (a case the property test below once drew): opacus' series would run
    for minutes; below 1e-100 the ε is beyond any float, so it is ∞ at once."""
    t0 = time.perf_counter()
    assert epsilon_for_sigma(1.77e-157, 0.999999, 0.01, 9574, accountant=accountant) == math.inf
    assert time.perf_counter() - t0 < SECONDS
