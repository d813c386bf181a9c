"""The command line's help and flags: ``--help`` answers without torch or the engine, lists
what plugins register, documents every flag, and the flags shared by several commands read
the same way (``--lpips``/``--no-lpips``, ``--victim``, the seeds)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import run_cli

from privaudit import plugins
from privaudit.attacks import ATTACKS, DEFAULT_ATTACK
from privaudit.cli import claims, main
from privaudit.cli.app import build_parser, commands, plugin_files
from privaudit.cli.vocabulary import BUILT_IN, PLUGIN_GROUPS, registered
from privaudit.core.errors import PLUGIN_ENV
from privaudit.defenses import DEFENSES
from privaudit.experiments import claims as ledger

pytestmark = pytest.mark.usefixtures("registries")

# the engine's packages: none of them may load for --help
HEAVY = ("torch", "privaudit.defenses", "privaudit.attacks", "privaudit.sim", "privaudit.api")
LIGHT = """
import json, sys
from privaudit.cli import main
from privaudit.cli.app import commands

names = [m.__name__.rsplit(".", 1)[1] for m in commands()]
lines = [["--help"], *([n, "--help"] for n in names)]
lines += [["targets"], *(["targets", "--list", w] for w in ("attacks", "threats", "accountants"))]
for argv in lines:
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    assert code in (0, None), (argv, code)
for command in ("attack", "audit", "mia"):  # an unknown target: its one line, at once
    assert main([command, "--target", "dpdl-nope", "--round", "1"]) == 2
heavy = sorted(m for m in sys.modules if m.split(".")[0] == "torch" or m.startswith(HEAVY))
print(json.dumps(heavy), file=sys.stderr)
"""


def test_help_and_the_light_lists_load_neither_torch_nor_the_engine():
    """``privaudit --help``, every command's ``--help``, ``targets`` (each of its lists) and
    a command given an unknown ``--target`` in a fresh process without plugins: no torch, no
    defense, attack, engine or API module is imported."""
    env = {k: v for k, v in os.environ.items() if k != PLUGIN_ENV}
    code = f"HEAVY = {HEAVY!r}\n{LIGHT}"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "usage: privaudit claims" in proc.stdout and "inbox" not in proc.stdout
    refused = [e for e in proc.stderr.splitlines() if "unknown target 'dpdl-nope'" in e]
    assert len(refused) == 3 and all(e.startswith("privaudit: error: ") for e in refused)
    assert json.loads(proc.stderr.strip().splitlines()[-1]) == []


def test_the_light_vocabulary_is_the_registries_built_ins():
    """The names the parser lists without loading torch are the registries' built-ins, in
    their order; the copied defaults and plugin groups are the originals'."""

    def built_in(what: str, registry: dict) -> tuple[str, ...]:
        return tuple(n for n in registry if plugins.origin(what, n) == f"the built-in {what}")

    assert BUILT_IN.defenses == built_in("defense", DEFENSES)
    assert BUILT_IN.attacks == built_in("attack", ATTACKS)
    assert BUILT_IN.default_attack == DEFAULT_ATTACK
    live = registered()  # no plugin registered here
    fresh = "\n".join(f"    {row!r}," for row in live.targets + live.attack_lines)
    assert (live.targets, live.attack_lines) == (BUILT_IN.targets, BUILT_IN.attack_lines), (
        "privaudit/cli/builtin_targets.py is out of date; its rows now (TARGETS, then ATTACKS):\n"
        + fresh
    )
    assert live == BUILT_IN
    assert PLUGIN_GROUPS == tuple(plugins.GROUPS.values())
    assert (claims.TRIALS, claims.CONFIDENCE) == (ledger.TRIALS, ledger.CONFIDENCE)


def parsers() -> dict[str, argparse.ArgumentParser]:
    """``privaudit`` and each command's parser, by name."""
    top = build_parser()
    found = {"privaudit": top}
    for action in top._actions:  # argparse keeps its subcommands among the actions
        if isinstance(action, argparse._SubParsersAction):
            found.update({f"privaudit {n}": p for n, p in action.choices.items()})
    return found


def test_every_flag_has_help():
    """Every option of every command says what it does in --help (a removed flag, hidden
    with SUPPRESS, aside: it only answers with the line saying it was removed)."""
    found = parsers()
    names = {c.__name__.rsplit(".", 1)[1] for c in commands()}
    assert set(found) == {"privaudit"} | {f"privaudit {n}" for n in names}
    missing, hidden = [], []
    for name, parser in found.items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            flag = f"{name} {'/'.join(action.option_strings) or action.dest}"
            if not (action.help or "").strip():
                missing.append(flag)
            elif action.help == argparse.SUPPRESS:
                hidden.append(flag)
    assert missing == []
    assert hidden == ["privaudit claims --row-seconds"]


def test_defense_and_attack_help_list_every_one(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # no name wrapped at its hyphen
    flat = {n: " ".join(p.format_help().split()) for n, p in parsers().items()}
    for defense in BUILT_IN.defenses:
        assert f" {defense} " in flat["privaudit train"], defense
        assert defense in flat["privaudit claims"]
    for attack in BUILT_IN.attacks:
        assert attack in flat["privaudit attack"] and attack in flat["privaudit compare"]
    assert "ig (default)" in flat["privaudit attack"]


# -- plugins are loaded before the parser ----------------------------------------------------
THREAT_PLUGIN = """
from dataclasses import dataclass

from privaudit.core.threat import Threat, register_threat


@register_threat
@dataclass(frozen=True)
class HelpProbe(Threat):
    name = "helpprobe-outbox"
    strength = 7
    summary = "what some agents send, not what they receive"

    def sees(self, src: int, dst: int) -> bool:
        return src in self.agents
"""


def helped(capsys, *argv: str) -> str:
    """The --help text ``privaudit *argv`` prints (it exits 0)."""
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", ["attack", "audit", "mia", "compare"])
def test_a_plugins_threat_model_is_in_help(tmp_path, capsys, command):
    plugin = tmp_path / "helpprobe_threat.py"
    plugin.write_text(textwrap.dedent(THREAT_PLUGIN))
    assert "helpprobe-outbox" not in helped(capsys, command, "--help")
    text = helped(capsys, "--plugin", str(plugin), command, "--help")
    assert "helpprobe-outbox" in text
    code, out, err = run_cli(capsys, "targets", "--list", "threats")  # loaded for the process
    assert code == 0 and "helpprobe-outbox  what some agents send" in out, err


def test_a_plugin_from_the_environment_is_in_help(tmp_path, capsys, monkeypatch):
    plugin = tmp_path / "helpprobe_env_threat.py"
    plugin.write_text(textwrap.dedent(THREAT_PLUGIN).replace("helpprobe-outbox", "helpprobe-env"))
    monkeypatch.setenv(PLUGIN_ENV, str(plugin))
    assert "helpprobe-env" in helped(capsys, "attack", "--help")


def test_a_plugins_defense_and_attack_are_in_help(capsys):
    example = Path(__file__).resolve().parents[1] / "examples" / "plugin" / "privaudit_example"
    argv = ["--plugin", str(example / "defense.py"), "--plugin", str(example / "attack.py")]
    train = " ".join(helped(capsys, *argv, "train", "--help").split())
    assert "dp-dsgt | cta-dpsgd | cta-dpsgd-halfnoise" in train
    assert "cta-dpsgd" in " ".join(helped(capsys, *argv, "claims", "--help").split())
    assert "hybrid | guess" in " ".join(helped(capsys, *argv, "attack", "--help").split())


@pytest.mark.parametrize(
    "argv, files",
    [
        (["--plugin", "a.py", "attack", "--plugin", "b.py"], ["a.py"]),  # b.py: attack's
        (["--plug=a.py", "--debug", "--plugin", "c.py", "targets"], ["a.py", "c.py"]),
        (["targets", "--list", "threats"], []),
        (["--plugin"], []),  # unreadable: the parser says what is wrong
        (["--help"], []),
    ],
)
def test_plugin_files_are_found_before_parsing_as_the_parser_reads_them(argv, files):
    assert plugin_files(argv) == files


# -- flags that read the same way in every command -------------------------------------------
def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_lpips_is_one_switch_in_both_spellings():
    """attack scores LPIPS unless --no-lpips, compare only with --lpips; both commands take
    both spellings (unset: None, the command's default)."""
    attack = ["attack", "--target", "nd-cg", "--round", "1"]
    compare = ["compare", "--out", "X"]
    assert parse(*attack).lpips is None and parse(*compare).lpips is None
    assert parse(*attack, "--no-lpips").lpips is False
    assert parse(*attack, "--lpips").lpips is True
    assert parse(*compare, "--lpips").lpips is True
    assert parse(*compare, "--no-lpips").lpips is False


def test_audit_takes_one_victim_named_as_attack_names_them(capsys):
    a = parse("audit", "--target", "nd-cg", "--victim", "2")
    assert a.victim == "2"
    argv = ["audit", "--target", "nd-cg", "--agents", "4", "--no-progress"]
    for victim, needle in (
        ("0,1", "--victim 0,1: an audit's canary goes into one agent's data; name one agent"),
        ("x", "--victim must name agents by id"),
        ("9", "--victim must be an agent 0..3"),
    ):
        code, out, err = run_cli(capsys, *argv, "--victim", victim)
        assert code == 2 and not out and err.count("\n") == 1 and needle in err, err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["attack", "--target", "nd-cg", "--round", "1"], "-a seed=… is set by --attack-seed"),
        (["compare", "--out", "{tmp}"], "-a seed=… is set by --seeds; use that flag"),
        (["reproduce", "dpdl-table3", "--out", "{tmp}"], "-a seed=… is set by --seeds"),
    ],
)
def test_an_attack_seed_given_as_an_option_names_the_commands_own_flag(
    argv, needle, tmp_path, capsys
):
    argv = [a.format(tmp=tmp_path / "out") for a in argv]
    code, _, err = run_cli(capsys, *argv, "-a", "seed=1", "--no-progress")
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "out").exists()


def test_restarts_in_a_sweep_are_refused_with_where_they_are_set(tmp_path, capsys):
    code, _, err = run_cli(capsys, "compare", "--out", str(tmp_path / "o"), "-a", "restarts=2")
    assert code == 2 and err.count("\n") == 1
    assert "-a restarts=… cannot be set in privaudit compare" in err
    assert "privaudit attack takes --restarts" in err
