"""Every option is valid in its command's mode or refused; agent lists name each agent once;
files land only where privaudit may write; a refusal leaves nothing behind.

The walk (:func:`test_every_option_in_every_mode`) goes over every command × mode of its
table (:data:`privaudit.cli.rules.TABLES`) × every option its ``--help`` lists, parsing and
validating only (no training). The probe cases then run the real CLI in process and assert
the CLI's promise for each: exit code 2, exactly one stderr line ``privaudit: error: …``
naming the flag, no traceback, the user's files (and the run's) byte for byte as they were,
and no folder left behind.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import run_cli

from privaudit.cli import main, rules
from privaudit.cli.app import build_parser, commands
from privaudit.cli.options import (
    GIVEN,
    OUT_MARKER,
    check_destination,
    check_destination_folder,
    check_out,
    mark_out,
    nothing_left_on_refusal,
    record_written,
)
from privaudit.core.errors import PrivauditError

# what each command needs to parse
BASE = {
    "targets": [],
    "train": ["--defense", "nd", "--out", "X"],
    "attack": ["--target", "nd-cg", "--round", "1"],
    "audit": ["--target", "nd-cg"],
    "mia": ["--target", "nd-cg"],
    "compare": ["--out", "X"],
    "claims": [],
    "reproduce": ["dpdl-table3"],
}
# a value each option parses with (None: a switch); (command, flag) first, then the flag
SAMPLES = {
    "--list": "targets",
    "--json": None,
    "--defense": "nd",
    "--out": "X",
    "--overwrite": None,
    "--capture": "1",
    "--backend": "sim",
    "--nproc": "2",
    "--dist-timeout": "30",
    "--preset": "attack",
    "--rounds": "2",
    "--agents": "4",
    "--topology": "ring",
    "--topologies": "ring",
    "--dataset": "photos",
    "--data-root": "D",
    "--download": None,
    "--model": "lenet",
    "--batch-size": "2",
    "--examples-per-agent": "1",
    "--sampling": "full",
    "--precision": "float64",
    "--gossip": "laplacian",
    "--dirichlet-alpha": "1",
    "--lr": "0.1",
    "--clip": "1",
    "--epsilon": "1",
    "--epsilons": "1",
    "--delta": "1e-5",
    "--sigma": "1",
    "--accountant": "rdp",
    "--param": "lr=0.1",
    "--seed": "1",
    "--seeds": "1",
    "--horizon": "9",
    "--device": "cpu",
    "--max-memory": "1G",
    "--threads": "1",
    "--checkpoint-every": "2",
    "--no-progress": None,
    "--target": "nd-cg",
    "--targets": "nd-cg",
    "--round": "1",
    "--attack": "ig",
    ("mia", "--attack"): "grad",
    "--threat": "neighbor",
    "--attacker": "1",
    "--victim": "0",
    "--victims": "1",
    "--link": "0,1",
    "--run": "R",
    "--iterations": "5",
    "--restarts": "1",
    "--attack-seed": "1",
    "--attack-option": "tv=0.1",
    "--no-lpips": None,
    "--lpips": None,
    "--mode": "white-box",
    "--trials": "64",
    "--confidence": "0.9",
    "--span": "0",
    "--canaries": "1",
    "--canary-norm": "1",
    "--canary-shape": "dirac",
    "--audit-seed": "1",
    "--final-model": None,
    "--final-model-trials": "64",
    "--messages": "2",
    "--scorer": "lr",
    "--references": "4",
    "--on": "message",
    "--candidates": "5",
    "--population": "16",
    "--mia-seed": "1",
    "--figures": "F",
    "--audit": None,
    "--no-audit": None,
    "--membership": None,
    "--no-membership": None,
    "--audit-trials": "64",
    "--executor": "local",
    "--ray-address": "auto",
    "--cell-cpus": "1",
    "--cell-gpus": "1",
    "--markdown": "M.md",
    "--fresh": None,
    "--scenarios": "ND-CG",
    "--observe": "messages",
    "--observer": "average",
    "--batches": "empty",
}
# argv that puts each command in each of its modes, and argv where the mode does not hold
ENTER = {
    "train": {"sim": [], "no data root": []},
    "attack": {"run": ["--run", "R"], "no data root": []},
    "audit": {
        "final models": ["--observe", "final"],
        "messages": [],
        "one-run": ["--mode", "one-run"],
        "run": ["--run", "R"],
        "no data root": [],
    },
    "mia": {
        "message level": [],
        "model level": ["--attack", "lira"],
        "no references": ["--attack", "loss"],
        "run": ["--run", "R"],
        "no data root": [],
    },
    "compare": {"sweep": [], "no audit": [], "local executor": [], "no data root": []},
    "claims": {"local executor": [], "no data root": []},
    "reproduce": {"sweep": [], "no data root": []},
}
LEAVE = {
    "sim": ["--backend", "torch.distributed"],
    "run": [],
    "no data root": ["--data-root", "D"],
    "one-run": ["--mode", "white-box"],
    "message level": ["--attack", "lira"],
    "model level": [],
    "no references": ["--attack", "rmia"],
    "final models": [],
    "messages": ["--observe", "final"],
    "no audit": ["--audit"],
    "local executor": ["--executor", "ray"],
}
# options that choose a mode: given in another mode, they may leave it
SELECTORS = {
    "--data-root",
    "--audit",
    "--no-audit",
    "--attack",
    "--backend",
    "--executor",
    "--run",
    "--mode",
    "--observe",
}


def usage_options(command: str, capsys) -> list[str]:
    """Every long option of ``command``: those its --help's usage line lists."""
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = capsys.readouterr().out
    usage = text.split("\n\n")[0]
    return sorted(set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", usage)) - {"--help"})


def with_option(command: str, argv: list[str], flag: str) -> list[str]:
    value = SAMPLES.get((command, flag), SAMPLES[flag])
    return [command, *BASE[command], *argv, flag, *([] if value is None else [value])]


def walk() -> list[tuple[str, str]]:
    return [(c, m.name) for c, modes in rules.TABLES.items() for m in modes] + [("targets", "")]


def test_every_command_has_a_table_and_every_mode_an_argv():
    names = {c.__name__.rsplit(".", 1)[1] for c in commands()}
    assert set(rules.TABLES) == names
    for command, modes in rules.TABLES.items():
        assert {m.name for m in modes} == set(ENTER.get(command, {})), command


@pytest.mark.parametrize("command, mode", walk())
def test_every_option_in_every_mode(command, mode, capsys):
    """Each option of the command, given in the mode: refused with one line naming it and
    the mode when a mode in force ignores it, accepted otherwise; outside the mode, the
    options it ignores are accepted (unless another mode in force ignores them)."""
    table = {m.name: m for m in rules.TABLES[command]}
    flags = usage_options(command, capsys)
    missing = [f for f in flags if (command, f) not in SAMPLES and f not in SAMPLES]
    assert not missing, f"give the new options a sample value: {missing}"
    if table:
        ignored = {rules.dest(f) for m in table.values() for f in m.ignores}
        real = {rules.dest(f) for f in flags}
        assert ignored <= real, ignored - real  # the tables name real options
    enter = ENTER.get(command, {}).get(mode, [])
    leave = LEAVE.get(mode)
    for argv, inside in ((enter, True), (leave, False)):
        if argv is None or (not inside and not table):
            continue
        for flag in flags:
            if flag in argv:
                continue
            a = build_parser().parse_args(with_option(command, argv, flag))
            holding = [m for m in table.values() if m.holds(a)]
            if mode and flag not in SELECTORS:
                assert (table[mode] in holding) == inside, (command, mode, flag)
            spelled = {rules.dest(f): f for m in table.values() for f in m.ignores}
            name = spelled.get(rules.dest(flag), flag)  # as the table (and the error) spell it
            refusing = [m for m in holding if name in m.ignores]
            if not refusing:
                rules.check_options(a)  # accepted
                continue
            with pytest.raises(PrivauditError) as e:
                rules.check_options(a)
            line = str(e.value)
            assert "\n" not in line and line.startswith(f"{name} does nothing "), line
            first = refusing[0].where.format(**vars(a))
            assert first in line and "drop it" in line, line


def test_an_option_given_at_its_default_counts_as_given():
    a = build_parser().parse_args(["mia", "--target", "nd-cg", "--references", "8"])
    assert a.references == 8 and "references" in getattr(a, GIVEN)
    with pytest.raises(PrivauditError, match="--references does nothing in the message-level"):
        rules.check_options(a)
    a = build_parser().parse_args(
        ["audit", "--target", "nd-cg", "--mode", "one-run", "--span", "0"]
    )
    with pytest.raises(PrivauditError, match="--span does nothing in --mode one-run"):
        rules.check_options(a)


@pytest.mark.parametrize(
    "flag, text, agents, needle",
    [
        ("--victim", "0,0", 4, "--victim 0,0 names agent 0 more than once"),
        ("--attacker", "1,2,1", 4, "--attacker 1,2,1 names agent 1 more than once"),
        ("--victim", "99", 4, "--victim must be an agent 0..3 (4 agents: S), got 99"),
        ("--victim", "-1", 4, "--victim must be an agent 0..3"),
        ("--victim", "4", 4, "--victim must be an agent 0..3"),
        ("--victim", "a", 4, "--victim must name agents by id"),
        ("--attacker", "", 4, "--attacker must name agents by id"),
    ],
)
def test_agent_lists_name_each_agent_once_and_within_the_run(flag, text, agents, needle):
    with pytest.raises(PrivauditError) as e:
        rules.agent_ids(flag, text, agents, "S")
    assert needle in str(e.value)
    assert rules.agent_ids("--victim", "3,0", 4, "S") == [3, 0]


# -- the probe's cases, through the real CLI ----------------------------------------------
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny nd run: 4 agents on a ring, 2 rounds."""
    path = tmp_path_factory.mktemp("runs") / "nd"
    argv = ["train", "--defense", "nd", "--rounds", "2", "--agents", "4", "--batch-size", "2"]
    assert main([*argv, "--out", str(path), "--no-progress"]) == 0
    return path


def snapshot(*folders: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under ``folders``."""
    return {
        str(p): (p.read_bytes() if p.is_file() else None)
        for f in folders
        for p in [f, *sorted(f.rglob("*"))]
    }


RUN = ["--run", "{run}"]
MIA, AUDIT = ["mia", "--target", "nd-cg"], ["audit", "--target", "nd-cg"]
ATTACK = ["attack", "--target", "nd-cg", "--round", "1"]
PROBES = {
    # a repeated agent is refused, not counted twice
    "mia victim twice": ([*MIA, *RUN, "--victim", "0,0"], "--victim 0,0 names agent 0"),
    "attack victim twice": ([*ATTACK, *RUN, "--victim", "0,0"], "--victim 0,0 names agent 0"),
    "audit attacker twice": ([*AUDIT, *RUN, "--attacker", "1,1"], "--attacker 1,1 names"),
    "mia model level two victims": (
        [*MIA, *RUN, "--attack", "lira", "--victim", "0,1"],
        "--victim 0,1: a model-level attack has one victim",
    ),
    # a link's victim is its sender
    "attack link and another victim": (
        [*ATTACK, *RUN, "--link", "0,1", "--victim", "2"],
        "--victim 2 and --link 0,1 disagree",
    ),
    "audit link and another victim": (
        [*AUDIT, *RUN, "--link", "0,1", "--victim", "2"],
        "--victim 2 and --link 0,1 disagree",
    ),
    "attack link with an attacker": (
        [*ATTACK, *RUN, "--link", "0,1", "--attacker", "2"],
        "--attacker 2 would be ignored: the link adversary",
    ),
    # options that do nothing in their mode
    "mia message level candidates": ([*MIA, *RUN, "--candidates", "5"], "--candidates does"),
    "mia message level on": ([*MIA, *RUN, "--on", "final"], "--on does nothing"),
    "mia message level references": ([*MIA, *RUN, "--references", "4"], "--references does"),
    "mia loss references": (
        [*MIA, *RUN, "--attack", "loss", "--references", "4"],
        "--references does nothing in --attack loss",
    ),
    "audit one-run round": (
        [*AUDIT, *RUN, "--mode", "one-run", "--round", "3"],
        "--round does nothing in --mode one-run",
    ),
    "attack run checkpoint every": (
        [*ATTACK, *RUN, "--checkpoint-every", "2"],
        "--checkpoint-every does nothing with --run",
    ),
    "attack run download": ([*ATTACK, *RUN, "--download"], "--download does nothing without"),
    "mia messages past the run": (
        [*MIA, *RUN, "--round", "1", "--messages", "99"],
        "--round 1 --messages 99 needs nd-cg's messages up to round 99",
    ),
    "train nproc on sim": (["train", "--defense", "nd", "--nproc", "2"], "--nproc does nothing"),
    "compare ray setting without ray": (
        ["compare", "--ray-address", "auto"],
        "--ray-address does nothing with --executor local",
    ),
    "compare audit trials without the audit": (
        ["compare", "--audit-trials", "64"],
        "--audit-trials does nothing without the audit",
    ),
    # agent ids name their flag
    "mia victim 99": ([*MIA, *RUN, "--victim", "99"], "--victim must be an agent 0..3"),
    "mia victim -1": ([*MIA, *RUN, "--victim", "-1"], "--victim must be an agent 0..3"),
    "mia victim 4": ([*MIA, *RUN, "--victim", "4"], "--victim must be an agent 0..3"),
    "mia victim a": ([*MIA, *RUN, "--victim", "a"], "--victim must name agents by id"),
    "audit attacker 99": ([*AUDIT, *RUN, "--attacker", "99"], "--attacker must be an agent"),
    "attack link off the run": ([*ATTACK, *RUN, "--link", "0,9"], "--link 0,9 is not a link"),
    "attack link off the graph": ([*ATTACK, *RUN, "--link", "0,2"], "--link 0,2 is not a link"),
    # refused before a run is created
    "attack round past --rounds": (
        [*ATTACK[:-1], "10", "--rounds", "5", "--agents", "4"],
        "--round 10 needs nd-cg's messages up to round 10, but --rounds is 5",
    ),
    "attack link off the graph of a new run": (
        [*ATTACK, "--agents", "4", "--link", "0,2"],
        "--link 0,2 is not a link",
    ),
    "train memory too small": (
        ["train", "--defense", "nd", "--agents", "4", "--rounds", "2", "--batch-size", "2"]
        + ["--max-memory", "1K"],
        "does not fit in memory",
    ),
    "attack memory too small": (
        [*ATTACK, "--agents", "4", "--batch-size", "2", "--max-memory", "1K"],
        "does not fit in memory",
    ),
    # files: a run's own, a user's, a file for a folder
    "claims markdown onto the run's config": (
        ["claims", "--target", "nd-cg", "--markdown", "{run}/config.json", "--overwrite"],
        "--markdown {run}/config.json lies inside the run directory",
    ),
    "claims markdown over a user's file": (
        ["claims", "--target", "nd-cg", "--markdown", "{user}/notes.md"],
        "--markdown {user}/notes.md already exists and privaudit did not write it",
    ),
    "compare figures over a user's summary": (
        ["compare", "--targets", "nd-cg", "--figures", "{user}"],
        "--figures {user} already holds .png/.md files privaudit did not write (notes.md",
    ),
    "compare figures a file": (
        ["compare", "--targets", "nd-cg", "--figures", "{user}/notes.md"],
        "--figures {user}/notes.md is a file, not a folder",
    ),
    "compare figures into a run": (
        ["compare", "--targets", "nd-cg", "--figures", "{run}/figures", "--overwrite"],
        "--figures {run}/figures lies inside the run directory",
    ),
    "attack out onto a run": (
        [*ATTACK, *RUN, "--out", "{run}", "--overwrite"],
        "--out {run} is the run directory",
    ),
    "train out inside a run": (
        ["train", "--defense", "nd", "--out", "{run}/messages/new"],
        "--out {run}/messages/new lies inside the run directory",
    ),
}
# the commands that take --out, and where a probe's goes (a new folder: it must stay absent)
OUT_FLAG = {"train", "attack", "audit", "mia", "compare", "claims"}


@pytest.mark.parametrize("case", sorted(PROBES))
def test_a_refusal_is_one_line_and_leaves_everything_as_it_was(case, tmp_path, run_dir, capsys):
    argv, needle = PROBES[case]
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.md").write_text("# my notes\n")
    fill = {"run": run_dir, "user": user}
    argv = [a.format(**fill) for a in argv]
    if argv[0] in OUT_FLAG and "--out" not in argv:
        argv += ["--out", str(tmp_path / "new" / "out")]
    before = snapshot(tmp_path, run_dir)
    code, _, err = run_cli(capsys, *argv, "--no-progress")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("privaudit: error: "), err
    assert needle.format(**fill) in lines[0], lines[0]
    assert snapshot(tmp_path, run_dir) == before  # the user's files, the run's, no new folder


# -- where privaudit writes ----------------------------------------------------------------
def test_a_destination_privaudit_wrote_may_be_replaced_until_someone_edits_it(tmp_path):
    out = tmp_path / "out"
    mark_out(out, "claims")
    dest = tmp_path / "figures" / "claims.md"
    dest.parent.mkdir()
    dest.write_text("table v1")
    with pytest.raises(PrivauditError, match="already exists and privaudit did not write it"):
        check_destination("--markdown", dest, out, overwrite=False)
    record_written(out, [dest])
    assert check_destination("--markdown", dest, out, overwrite=False) == dest  # a rerun
    check_destination_folder("--figures", dest.parent, out, False, (".md",))
    dest.write_text("table v1, edited by hand")
    with pytest.raises(PrivauditError, match="--overwrite"):
        check_destination("--markdown", dest, out, overwrite=False)
    with pytest.raises(PrivauditError, match=r"\(claims.md\)"):
        check_destination_folder("--figures", dest.parent, out, False, (".md",))
    assert check_destination("--markdown", dest, out, overwrite=True) == dest
    assert check_destination("--markdown", tmp_path / "new.md", out, overwrite=False)
    with pytest.raises(PrivauditError, match="takes a file path, got the folder"):
        check_destination("--markdown", dest.parent, out, overwrite=True)


def test_an_out_folder_is_never_a_runs(tmp_path, run_dir):
    for out in (run_dir, run_dir / "checkpoints", run_dir / "new"):
        with pytest.raises(PrivauditError, match="run directory"):
            check_out(out, "attack", overwrite=True)
    assert check_out(tmp_path / "elsewhere", "attack") == tmp_path / "elsewhere"


def test_a_refused_command_takes_back_only_what_it_wrote(tmp_path):
    """A new --out (and its new parents) is removed; an empty one the user made is kept, and
    so is one that held anything before."""
    new = tmp_path / "a" / "b"
    with pytest.raises(PrivauditError), nothing_left_on_refusal(new):
        mark_out(new, "attack")
        raise PrivauditError("refused")
    assert list(tmp_path.iterdir()) == []
    mine = tmp_path / "mine"
    mine.mkdir()
    with pytest.raises(KeyboardInterrupt), nothing_left_on_refusal(mine):
        mark_out(mine, "attack")
        raise KeyboardInterrupt
    assert mine.is_dir() and list(mine.iterdir()) == []
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(PrivauditError), nothing_left_on_refusal(mine):
        mark_out(mine, "attack")
        raise PrivauditError("refused")
    assert sorted(p.name for p in mine.iterdir()) == [OUT_MARKER, "notes.txt"]
