"""What the commands share: the parser class, the training and attack flags, and each check
that more than one command makes, in one place.

Importing this module (and building the parser) loads neither torch nor the engine: the
helpers that need them import them when a command runs, so ``privaudit --help`` and a bad
argument answer at once.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from privaudit.core.config import RunConfig
from privaudit.core.errors import PrivauditError

DEFAULTS = RunConfig()


class Parser(argparse.ArgumentParser):
    """Every error in one line (not usage + line), naming the command's ``--help``.

    ``arguments``: a function that adds the command's arguments when the command is parsed
    or its help shown, not when the whole parser is built, for a command whose defaults come
    from a module that loads the engine."""

    def __init__(
        self, *args: Any, arguments: Callable[[Parser], None] | None = None, **kw: Any
    ) -> None:
        super().__init__(*args, **kw)
        self.arguments = arguments

    def ready(self) -> None:
        if self.arguments is not None:
            add, self.arguments = self.arguments, None
            add(self)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self.ready()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self.ready()
        return super().format_help()

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        ns, extra = self.parse_known_args(args, namespace)
        if extra:  # found by the top parser: name the command they were given to
            command = getattr(ns, "command", None)
            prog = f"{self.prog} {command}" if command else self.prog
            raise PrivauditError(f"unrecognized arguments: {' '.join(extra)} (see {prog} --help)")
        return ns

    def error(self, message: str) -> None:
        raise PrivauditError(f"{message} (see {self.prog} --help)")


def parse_param(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` → (name, value): the value as JSON (1e-3, true, null, "text") or, when
    it is not JSON, the text itself; its type is checked against the parameter's declared
    one later (:mod:`privaudit.core.schema`, in :func:`~privaudit.core.context.params_of` and
    :func:`~privaudit.attacks.check_options`)."""
    if "=" not in text:
        raise PrivauditError(f"options must be NAME=VALUE, got {text!r}")
    name, value = text.split("=", 1)
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = value
    return name.strip().replace("-", "_"), parsed


def add_attack_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--attack-option",
        "-a",
        action="append",
        default=[],
        type=parse_param,
        metavar="NAME=VALUE",
        help="an attack option, e.g. -a tv=1e-3 -a lr=0.05",
    )


def training_options(p: argparse.ArgumentParser, rounds_default: int | None) -> None:
    """The training flags every command shares. Those a preset governs (README, Operating
    points) default to None: unset, they come from the command's preset."""
    g = p.add_argument_group("training")
    g.add_argument(
        "--preset",
        default=None,
        help="utility (the defense's operating point on the dataset; train's default) | "
        "attack (LeNet, B = 8: the inversion setting; the other commands' default)",
    )
    g.add_argument(
        "--rounds",
        type=int,
        default=rounds_default,
        help=f"rounds T (default: {rounds_default or 'the preset, or the attacked round'})",
    )
    g.add_argument("--agents", type=int, default=DEFAULTS.agents, help="number of agents N")
    g.add_argument(
        "--topology",
        default=None,
        help="ring (default) | complete | bipartite | torus | exponential "
        "(default exponential for the push-sum defenses)",
    )
    g.add_argument(
        "--dataset",
        default=DEFAULTS.dataset,
        help="photos (embedded) | mnist | fashion-mnist | cifar10",
    )
    g.add_argument("--data-root", default=None, help="folder holding the torchvision dataset")
    g.add_argument("--download", action="store_true", help="let torchvision download it")
    g.add_argument(
        "--model", default=None, help="lenet | cnn | tanh-cnn | resnet18 (default: the preset)"
    )
    g.add_argument("--batch-size", type=int, default=None, help="expected batch size B")
    g.add_argument(
        "--dirichlet-alpha",
        type=float,
        default=None,
        help="label skew of the partition (smaller: more skewed; default: the preset)",
    )
    g.add_argument("--lr", type=float, default=None, help="learning rate η (default: the preset)")
    g.add_argument("--clip", type=float, default=None, help="clip norm C (DP defenses)")
    g.add_argument(
        "--epsilon",
        type=float,
        default=DEFAULTS.epsilon,
        help="ε per agent over the run, turned into σ by the accountant",
    )
    g.add_argument("--delta", type=float, default=DEFAULTS.delta)
    g.add_argument("--sigma", type=float, default=None, help="noise multiplier (overrides ε)")
    g.add_argument("--accountant", default=DEFAULTS.accountant, help="rdp | prv")
    g.add_argument(
        "--param",
        "-p",
        action="append",
        default=[],
        type=parse_param,
        metavar="NAME=VALUE",
        help="a defense parameter, e.g. -p momentum=0.9",
    )
    g.add_argument("--seed", type=int, default=DEFAULTS.seed)
    g.add_argument("--device", default=DEFAULTS.device, help="cpu | cuda")
    g.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads for torch (default 1: the default models' small kernels gain "
        "little from more, and OpenMP threads stall badly when cores are shared)",
    )
    g.add_argument("--checkpoint-every", type=int, default=DEFAULTS.checkpoint_every)
    g.add_argument("--no-progress", action="store_true", help="hide progress bars")


# the training flags a preset governs: flag attribute -> RunConfig field
PRESET_FLAGS = {
    "model": "model",
    "batch_size": "batch_size",
    "rounds": "rounds",
    "dirichlet_alpha": "dirichlet_alpha",
}


def explicit_settings(a: argparse.Namespace, rounds: int | None) -> dict[str, Any]:
    """The preset-governed settings the user gave (flags not None, ``-p``/``--lr``/
    ``--clip`` as ``params``); ``rounds`` is the command's own choice when not None."""
    given = {f: getattr(a, k, None) for k, f in PRESET_FLAGS.items()}
    given["rounds"] = rounds
    params = dict(a.param)
    if a.lr is not None:
        params["lr"] = a.lr
    if a.clip is not None:
        params["clip"] = a.clip
    return {**{k: v for k, v in given.items() if v is not None}, "params": params}


def configured(
    a: argparse.Namespace, defense: str, rounds: int | None, preset: str = "attack"
) -> tuple[RunConfig, str]:
    """The run configuration the flags ask for: ``--preset`` (else the command's
    ``preset``) fills what they leave unset (:func:`privaudit.scenario.presets.apply`), and
    without ``--topology`` the defense's own graph applies (:meth:`Defense.topology_for
    <privaudit.defenses.base.Defense.topology_for>`). Returns it with the line saying where
    the settings came from."""
    from privaudit.defenses import get_defense
    from privaudit.scenario import presets

    base = RunConfig(
        defense=defense,
        agents=a.agents,
        topology=get_defense(defense).topology_for(a.topology),
        dataset=a.dataset,
        data_root=a.data_root,
        download=a.download,
        epsilon=a.epsilon,
        delta=a.delta,
        sigma=a.sigma,
        accountant=a.accountant,
        seed=a.seed,
        device=a.device,
        checkpoint_every=a.checkpoint_every,
    )
    return presets.apply(base, a.preset or preset, explicit_settings(a, rounds))


def config_from_args(a: argparse.Namespace, defense: str, rounds: int | None) -> RunConfig:
    """:func:`configured` without the line (the attack preset unless ``--preset``)."""
    return configured(a, defense, rounds)[0]


def checked_params(cfg: RunConfig) -> RunConfig:
    """``cfg`` after its defense parameters (``-p``, ``--lr``, ``--clip``) are checked against
    the defense's schema, and a calibrated σ refused as ``-p sigma``: before any data is
    loaded or anything is written."""
    from privaudit.core.context import params_of
    from privaudit.defenses import get_defense
    from privaudit.sim.run import check_sigma_param

    params_of(get_defense(cfg.defense).Params, cfg.params)
    check_sigma_param(cfg)
    return cfg


def check_threat(name: str | None) -> None:
    """``--threat`` names one of the threat models (None: the command chooses), checked
    before any training."""
    from privaudit.core.threat import ORDER

    if name is not None and name not in ORDER:
        raise PrivauditError(
            f"unknown threat model {name!r}: --threat must be one of {', '.join(ORDER)}"
        )


# attack options that have their own flags (-a would clash with them)
ATTACK_FLAGS = {
    "iterations": "--iterations",
    "restarts": "--restarts",
    "seed": "--attack-seed",
    "progress": "--no-progress",
}


def check_out(out: str | Path) -> Path:
    """``--out`` as a path that can become a folder: refused at once when it is a file."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise PrivauditError(f"--out {out} is a file, not a folder; choose another --out")
    return out


def attack_options(a: argparse.Namespace, name: str | None) -> dict[str, Any]:
    """The ``-a`` options of attack ``name``, checked and coerced before any training with
    the attack flags (:func:`privaudit.attacks.check_options`); a bad flag's error names it."""
    from privaudit.attacks import DEFAULT_ATTACK, check_options

    name = name or DEFAULT_ATTACK
    given = dict(a.attack_option)
    for k, flag in ATTACK_FLAGS.items():
        if k in given:
            raise PrivauditError(f"-a {k}=… is set by {flag}; use that flag")
    flags = {"iterations": a.iterations, "restarts": getattr(a, "restarts", None)}
    flags["seed"] = getattr(a, "attack_seed", 0)
    for k, v in flags.items():
        try:
            check_options(name, {k: v})
        except PrivauditError as e:
            text = str(e).replace(f"attack option {k} ", f"{ATTACK_FLAGS[k]} ")
            raise PrivauditError(text) from None
    return check_options(name, given)
