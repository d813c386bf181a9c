"""What the commands share: the parser class, the training and attack flags, and each check
that more than one command makes, in one place.

Importing this module (and building the parser) loads neither torch nor the engine: the
helpers that need them import them when a command runs, so ``privaudit --help`` and a bad
argument answer at once.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from privaudit.core import limits
from privaudit.core.accountants import accountant_help
from privaudit.core.config import RunConfig
from privaudit.core.errors import PrivauditError

DEFAULTS = RunConfig()


# the attribute of a command's parsed arguments that names the options given on the command
# line (their ``dest``s), as opposed to those left at their defaults
GIVEN = "options_given"


class _Given(argparse.Namespace):
    """A namespace that answers None for every option it was not given, so that argparse
    fills in no defaults: what it holds after a parse is what the command line set."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # argparse's own bookkeeping: absent unless set
            raise AttributeError(name)
        return None


class Parser(argparse.ArgumentParser):
    """Every error in one line (not usage + line), naming the command's ``--help``; a
    command's parsed arguments say which options were given (:data:`GIVEN`), so that an
    option given in a mode where it does nothing is refused (:mod:`privaudit.cli.rules`)
    even when its value equals its default."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.commands = False  # whether it dispatches to subcommands (their parsers record)

    def add_subparsers(self, **kw: Any) -> Any:
        self.commands = True
        return super().add_subparsers(**kw)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        ns, extra = super().parse_known_args(args, namespace)
        if not self.commands:  # a command: parse again, without defaults, to see what was given
            given, _ = super().parse_known_args(args, _Given())
            setattr(ns, GIVEN, frozenset(vars(given)))
        return ns, extra

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


def add_lpips_option(p: argparse.ArgumentParser, help: str) -> None:
    """``--lpips`` / ``--no-lpips``, one switch in both spellings wherever LPIPS is scored
    (``attack``: on unless ``--no-lpips``; ``compare``: off unless ``--lpips``); unset it is
    None and the command's own default applies."""
    p.add_argument("--lpips", action=argparse.BooleanOptionalAction, default=None, help=help)


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
    g.add_argument(
        "--agents", type=int, default=None, help=f"number of agents N (default {DEFAULTS.agents})"
    )
    g.add_argument(
        "--topology",
        default=None,
        help="ring (default) | complete | bipartite | torus | exponential | line | star | "
        "erdos-renyi (p = 2 ln N / N, seed 0) (default exponential for the push-sum defenses)",
    )
    g.add_argument(
        "--dataset",
        default=None,
        help="photos (embedded; the default) | mnist | fashion-mnist | cifar10",
    )
    g.add_argument("--data-root", default=None, help="folder holding the torchvision dataset")
    g.add_argument("--download", action="store_true", help="let torchvision download it")
    g.add_argument(
        "--model",
        default=None,
        help="lenet | cnn | tanh-cnn | resnet18 | fedavg-cnn | mlp | linear (default: the preset)",
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
        default=None,
        help=f"ε per agent over the run, turned into σ by the accountant (default "
        f"{DEFAULTS.epsilon:g} unless --sigma)",
    )
    g.add_argument("--delta", type=float, default=None, help=f"δ (default {DEFAULTS.delta:g})")
    g.add_argument(
        "--sigma", type=float, default=None, help="noise multiplier (instead of --epsilon)"
    )
    g.add_argument("--accountant", default=None, help=accountant_help())
    g.add_argument(
        "--param",
        "-p",
        action="append",
        default=[],
        type=parse_param,
        metavar="NAME=VALUE",
        help="a defense parameter, e.g. -p momentum=0.9",
    )
    g.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the run's seed: its data split, initial model, batches and noise (default "
        f"{DEFAULTS.seed}); what a command does on the run draws from its own --<step>-seed",
    )
    g.add_argument("--device", default=DEFAULTS.device, help="cpu | cuda")
    g.add_argument(
        "--max-memory",
        default=None,
        metavar="SIZE",
        help="memory the per-example gradients may use, e.g. 4G (default: half of what the "
        "device has free, or PRIVAUDIT_MAX_MEMORY); chunks are halved until they fit",
    )
    g.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads for torch (default 1: the default models' small kernels gain "
        "little from more, and OpenMP threads stall badly when cores are shared)",
    )
    g.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        help=f"rounds between checkpoints (default {DEFAULTS.checkpoint_every})",
    )
    g.add_argument("--no-progress", action="store_true", help="hide progress bars")


# the training flags a preset governs: flag attribute -> RunConfig field
PRESET_FLAGS = {
    "model": "model",
    "batch_size": "batch_size",
    "rounds": "rounds",
    "dirichlet_alpha": "dirichlet_alpha",
}

# the training flags that define a run's messages (attribute -> flag): an existing --run
# has its own, so giving one beside --run is refused rather than ignored
RUN_FLAGS = {
    "preset": "--preset",
    "rounds": "--rounds",
    "agents": "--agents",
    "topology": "--topology",
    "dataset": "--dataset",
    "model": "--model",
    "batch_size": "--batch-size",
    "dirichlet_alpha": "--dirichlet-alpha",
    "lr": "--lr",
    "clip": "--clip",
    "epsilon": "--epsilon",
    "delta": "--delta",
    "sigma": "--sigma",
    "accountant": "--accountant",
    "param": "-p",
    "seed": "--seed",
}


def option_value(a: argparse.Namespace, name: str) -> Any:
    """Training flag ``name`` as given, else the run default (:class:`RunConfig`)."""
    value = getattr(a, name, None)
    return getattr(DEFAULTS, name) if value is None else value


def explicit_settings(a: argparse.Namespace, rounds: int | None) -> dict[str, Any]:
    """The preset-governed settings the user gave (flags not None, ``-p``/``--lr``/
    ``--clip`` as ``params``); ``rounds`` is the command's own choice when not None. A
    parameter given both as ``-p`` and by its own flag is an error, not a silent choice."""
    given = {f: getattr(a, k, None) for k, f in PRESET_FLAGS.items()}
    given["rounds"] = rounds
    params = dict(a.param)
    for name in ("lr", "clip"):
        value = getattr(a, name, None)
        if value is None:
            continue
        if name in params and params[name] != value:
            raise PrivauditError(
                f"-p {name}={params[name]} and --{name} {value} both set {name}; give one"
            )
        params[name] = value
    return {**{k: v for k, v in given.items() if v is not None}, "params": params}


def noise_setting(a: argparse.Namespace) -> tuple[float | None, float | None]:
    """(ε, σ) as asked: ``--sigma`` or ``--epsilon`` (default ε without either), never both
    — σ would silently win and the run's ε differ from the one recorded."""
    if a.epsilon is not None and a.sigma is not None:
        raise PrivauditError(
            f"--epsilon {a.epsilon:g} and --sigma {a.sigma:g} both set the noise; give one "
            "(--epsilon: σ is calibrated to it; --sigma: ε is what σ gives)"
        )
    if a.sigma is not None:
        return None, a.sigma
    return option_value(a, "epsilon"), None


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

    epsilon, sigma = noise_setting(a)
    base = RunConfig(
        defense=defense,
        agents=option_value(a, "agents"),
        topology=get_defense(defense).topology_for(a.topology),
        dataset=option_value(a, "dataset"),
        data_root=a.data_root,
        download=a.download,
        epsilon=epsilon,
        delta=option_value(a, "delta"),
        sigma=sigma,
        accountant=option_value(a, "accountant"),
        seed=option_value(a, "seed"),
        device=a.device,
        max_memory=a.max_memory,
        checkpoint_every=option_value(a, "checkpoint_every"),
    )
    return presets.apply(base, a.preset or preset, explicit_settings(a, rounds))


def open_run(a: argparse.Namespace) -> Any:
    """The run of ``--run``, with the flags that do not change its messages applied
    (``--device``, and ``--data-root``/``--download`` where its dataset is found)."""
    from privaudit.sim.run import Run

    override = {"device": a.device, "max_memory": a.max_memory}
    if a.data_root is not None:
        override.update(data_root=a.data_root, download=a.download)
    return Run.open(a.run, **override)


def edges_of(cfg: RunConfig) -> list[tuple[int, int]]:
    """The directed links of ``cfg``'s graph in the order :meth:`Run.edges
    <privaudit.sim.run.Run.edges>` lists them once the run is built: known before anything is
    loaded or written, so a ``--link`` off the graph is refused before a run is created."""
    from privaudit.scenario.topology import build_topology

    adj = build_topology(cfg.topology, cfg.agents)
    return [(int(i), int(j)) for i, j in adj.nonzero().tolist()]


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
    check_sigma_flag(cfg)
    return cfg


def check_sigma_flag(cfg: RunConfig) -> None:
    """``--sigma`` for a defense whose noise no accountant reads (no noise at all, or a
    paper constant such as AdaD²P's σ) would be silently ignored: one error instead."""
    from privaudit.core.context import params_of
    from privaudit.defenses import get_defense
    from privaudit.sim.run import sigma_is_set

    if cfg.sigma is None or sigma_is_set(cfg):
        return
    defense = get_defense(cfg.defense)
    own = getattr(params_of(defense.Params, cfg.params), "sigma", None)
    fix = (
        f"its own noise is -p sigma=S (now {own:g}); drop --sigma or use -p sigma"
        if own
        else "it adds no Gaussian noise; drop --sigma"
    )
    raise PrivauditError(
        f"--sigma {cfg.sigma:g} would be ignored: {defense.name}'s noise is not a noise "
        f"multiplier set from --sigma/--epsilon; {fix}"
    )


def check_threat(name: str | None, attackers: str | None = None) -> None:
    """``--threat`` names one of the threat models (None: the command chooses), and
    ``--attacker`` is given only to a threat that has attackers; checked before any
    training."""
    from privaudit.core.threat import THREATS, threat_names

    if name is not None and name not in THREATS:
        raise PrivauditError(
            f"unknown threat model {name!r}: --threat must be one of {', '.join(threat_names())}"
        )
    if attackers is not None and name is not None and not THREATS[name].uses_attackers:
        raise PrivauditError(
            f"--attacker {attackers} would be ignored: the {name} adversary is "
            f"{THREATS[name].summary}, not an agent's links; drop --attacker, or use a --threat "
            f"with attackers ({', '.join(n for n in threat_names() if THREATS[n].uses_attackers)})"
        )


# attack options that have their own flags (-a would clash with them), as attack spells them
ATTACK_FLAGS = {
    "iterations": "--iterations",
    "restarts": "--restarts",
    "seed": "--attack-seed",
    "progress": "--no-progress",
}
# in the sweeping commands (compare, reproduce), which lack attack's --restarts and
# --attack-seed: the flag that sets the option there (each cell's attack takes its run's
# seed), or None where nothing does (the attack's own default applies)
SWEEP_ATTACK_FLAGS = {"restarts": None, "seed": "--seeds"}


# Where a command writes. privaudit writes only into folders it made or files it wrote: an
# --out that is new, empty or its own (marked by OUT_MARKER), and a destination the user
# names (claims --markdown, compare --figures) that is new or that it wrote there before
# (recorded, with its digest, in the marker of the command's --out); anything else is refused
# before any work, unless --overwrite. Nothing is ever written inside a run directory but by
# the run itself.

# the file that marks a folder as a command's own output (JSON: {"command": NAME, "files":
# {PATH: SHA-256}}, the files written outside it: the destinations the user named)
OUT_MARKER = ".privaudit-out"


def add_overwrite(
    p: argparse.ArgumentParser,
    what: str = "an --out folder that holds files privaudit did not write there",
) -> None:
    """``--overwrite``: the way past :func:`check_out`'s (and :func:`check_destination`'s)
    refusal; ``what`` says where the command's help."""
    p.add_argument(
        "--overwrite",
        action="store_true",
        help=f"write into {what} (files of the same names are replaced; a run's own files "
        "never are)",
    )


def run_folder(path: str | Path) -> Path | None:
    """The run directory ``path`` is or lies inside (a folder holding ``config.json`` and
    ``manifest.json``), or None: nothing but the run itself may write there."""
    from privaudit.sim.manifest import NAME
    from privaudit.sim.rundir import CONFIG

    p = Path(path).expanduser().absolute()
    for folder in (p, *p.parents):
        if (folder / CONFIG).is_file() and (folder / NAME).is_file():
            return folder
    return None


def check_not_in_run(flag: str, path: str | Path, itself: bool = False) -> None:
    """Refuse ``path`` (given as ``flag``) when it is or lies inside a run directory:
    writing there would replace or add to a run's own files, which ``--overwrite`` never
    allows. ``itself``: ``path`` may be a run (``train --out``: the run it resumes)."""
    run = run_folder(path)
    here = Path(path).expanduser().absolute()
    if run is not None and not (itself and run == here):
        where = "is" if run == here else "lies inside"
        raise PrivauditError(
            f"{flag} {path} {where} the run directory {run}, whose files only the run writes; "
            f"choose a {flag} outside it"
        )


def check_out(out: str | Path, command: str, overwrite: bool = False) -> Path:
    """``--out`` as a folder ``command`` may write into, checked before anything runs: a new
    or empty folder, or one this command made before (its :data:`OUT_MARKER`: rerunning
    resumes or refreshes its own output). A file, a folder of someone else's files, or
    another command's output is refused — never overwritten — unless ``overwrite``; a run
    directory (or a folder inside one) always."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise PrivauditError(f"--out {out} is a file, not a folder; choose another --out")
    check_not_in_run("--out", out)
    if overwrite or not out.is_dir():
        return out
    owner = _marker(out).get("command")
    if (out / OUT_MARKER).is_file():
        if owner == command:
            return out
        made = f"privaudit {owner}" if isinstance(owner, str) else "an unknown program"
        raise PrivauditError(
            f"--out {out} holds the output of {made}, not of privaudit {command}; choose "
            "another --out (or pass --overwrite to write into it anyway)"
        )
    files = sorted(p.name for p in out.iterdir())
    if files:
        shown = ", ".join(files[:4]) + (", …" if len(files) > 4 else "")
        raise PrivauditError(
            f"--out {out} already holds files privaudit did not write ({shown}); choose a new "
            "or empty --out (or pass --overwrite to replace files of the same names)"
        )
    return out


def _marker(out: Path) -> dict[str, Any]:
    """The marker of ``out`` as a dict ({} when absent or unreadable)."""
    try:
        doc = json.loads((out / OUT_MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def mark_out(out: Path, command: str) -> None:
    """Create ``out`` and mark it as ``command``'s output (:func:`check_out` passed): call
    it just before the command's first write into it."""
    from privaudit.core.files import write_json

    marker = out / OUT_MARKER
    if not marker.is_file():
        write_json(marker, {"command": command})


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def record_written(out: Path, paths: list[Path]) -> None:
    """Record in ``out``'s marker that the command wrote ``paths`` (outside ``out``, where
    the user asked), with their digests: a rerun may replace them while they are unchanged
    (:func:`check_destination`)."""
    from privaudit.core.files import write_json

    doc = _marker(out)
    files = doc.get("files") if isinstance(doc.get("files"), dict) else {}
    for p in paths:
        files[str(p.expanduser().absolute())] = _digest(p)
    write_json(out / OUT_MARKER, {**doc, "files": files})


def written_here(out: Path, path: Path) -> bool:
    """Whether ``path`` is a file the command whose output ``out`` is wrote, unchanged
    since (:func:`record_written`)."""
    files = _marker(out).get("files")
    key = str(path.expanduser().absolute())
    return isinstance(files, dict) and path.is_file() and files.get(key) == _digest(path)


def check_destination(flag: str, path: str | Path, out: Path, overwrite: bool) -> Path:
    """A file the user names as ``flag`` (e.g. ``claims --markdown PATH``), checked before
    any work: not a folder, not inside a run directory (ever), and — when it exists — one
    this command wrote there before and nobody changed since (recorded in ``out``'s marker),
    unless ``overwrite``."""
    path = Path(path)
    if path.is_dir():
        raise PrivauditError(f"{flag} takes a file path, got the folder {path}")
    check_not_in_run(flag, path)
    if path.exists() and not overwrite and not written_here(out, path):
        raise PrivauditError(
            f"{flag} {path} already exists and privaudit did not write it; choose another "
            f"{flag} (or pass --overwrite to replace it)"
        )
    return path


def check_destination_folder(
    flag: str, folder: str | Path, out: Path, overwrite: bool, suffixes: tuple[str, ...]
) -> Path:
    """A folder the user names as ``flag`` for files of ``suffixes`` (e.g. ``compare
    --figures DIR``: PNGs and markdown), checked before any work: not a file, not inside a
    run directory (ever), and holding no file of those suffixes that this command did not
    write there (recorded in ``out``'s marker) — it could be replaced — unless
    ``overwrite``."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise PrivauditError(f"{flag} {folder} is a file, not a folder; choose a folder")
    check_not_in_run(flag, folder)
    if overwrite or not folder.is_dir():
        return folder
    theirs = sorted(
        p.name
        for p in folder.iterdir()
        if p.suffix in suffixes and p.is_file() and not written_here(out, p)
    )
    if theirs:
        shown = ", ".join(theirs[:4]) + (", …" if len(theirs) > 4 else "")
        raise PrivauditError(
            f"{flag} {folder} already holds {'/'.join(suffixes)} files privaudit did not "
            f"write ({shown}), which could be replaced; choose a new or empty {flag} (or pass "
            "--overwrite to replace files of the same names)"
        )
    return folder


@contextlib.contextmanager
def nothing_left_on_refusal(out: Path, run: Path | None = None) -> Iterator[None]:
    """Run the body; when it fails (a refusal, an interrupt) and ``out`` was new or empty
    before, take away what it wrote there — the new run ``run`` if it has no checkpoint yet
    (its recorded files), the marker when nothing else is left, and the folders it made that
    are left empty — so that a refused command leaves the user's folders as they were. A
    run with a checkpoint stays (it resumes)."""
    out = Path(out)
    new = [p for p in (out, *out.parents) if not p.exists()]  # innermost first
    fresh = not out.exists() or (out.is_dir() and not any(out.iterdir()))
    try:
        yield
    except BaseException:
        if fresh:
            _take_back(out, run, new)
        raise


@contextlib.contextmanager
def run_in_out(out: Path, command: str, run: Any, cfg: RunConfig | None) -> Iterator[Any]:
    """The run a command works on, inside :func:`nothing_left_on_refusal`: ``run`` (given
    with ``--run``) or a new one of ``cfg`` trained into ``OUT/run``, with ``out`` marked as
    ``command``'s output first — so that a refusal anywhere in the body leaves a new ``out``
    as it was."""
    with nothing_left_on_refusal(out, out / "run"):
        mark_out(out, command)
        if run is None:
            from privaudit.sim.run import Run

            run = Run.create(cfg, out / "run")
        yield run


def _take_back(out: Path, run: Path | None, new: list[Path]) -> None:
    """What :func:`nothing_left_on_refusal` removes; a file it cannot remove stays."""
    from privaudit.sim.rundir import RunDir

    with contextlib.suppress(OSError, PrivauditError):
        if run is not None and RunDir(run).exists() and not RunDir(run).checkpoint_rounds():
            rd = RunDir(run)
            with rd.writer():
                rd.discard(remove_folder=True)
    with contextlib.suppress(OSError):
        if out.is_dir() and [p.name for p in out.iterdir()] == [OUT_MARKER]:
            (out / OUT_MARKER).unlink()
    for folder in new:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty


def attack_options(a: argparse.Namespace, name: str | None) -> dict[str, Any]:
    """The ``-a`` options of attack ``name``, checked and coerced before any training with
    the attack flags (:func:`privaudit.attacks.check_options`); a bad flag's error names it."""
    from privaudit.attacks import DEFAULT_ATTACK, check_options

    name = name or DEFAULT_ATTACK
    given = dict(a.attack_option)
    for k, flag in ATTACK_FLAGS.items():
        if k not in given:
            continue
        if not hasattr(a, flag.lstrip("-").replace("-", "_")):  # a sweep's own spelling
            flag = SWEEP_ATTACK_FLAGS.get(k)
        if flag is None:
            raise PrivauditError(
                f"-a {k}=… cannot be set in privaudit {a.command}, whose attacks run with the "
                f"attack's own {k}; drop it (privaudit attack takes --{k})"
            )
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


# -- what the sweeping commands (compare, reproduce) share ---------------------------------
def comma_list(kind: type, what: str) -> Callable[[str], list]:
    """An argparse type: a comma-separated list of ``kind``, or one error naming ``what``."""

    def parse(text: str) -> list:
        try:
            return [kind(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise PrivauditError(f"{what} must be a comma-separated list, got {text!r}") from None

    return parse


def sweep_base(a: argparse.Namespace, agents: int | None = None) -> Any:
    """The shared RunConfig of a sweep from the training options (ε and seed set per run)."""
    return config_from_args(sweep_namespace(a, agents), "dpdl", 1)


def sweep_namespace(a: argparse.Namespace, agents: int | None = None) -> argparse.Namespace:
    eps = getattr(a, "epsilon", None) or 1.0  # compare: set per run from --epsilons
    ns = argparse.Namespace(**{"topology": None, **vars(a), "epsilon": eps, "seed": 0})
    if agents is not None:
        ns.agents = agents
    return ns


def check_sweep_attack(a: argparse.Namespace) -> None:
    """The attack, its flags and its ``-a`` options, before any training."""
    check_out(a.out, a.command, a.overwrite)
    attack_options(a, getattr(a, "attack", None))
    limits.check_int("--victims", a.victims, 1, limits.MAX_AGENTS)


# -- where a study's cells run (compare, claims) -------------------------------------------
def add_executor_options(c: argparse.ArgumentParser) -> None:
    """``--executor`` and its settings: where a study's runs and cells run."""
    g = c.add_argument_group("where the cells run (docs/running-at-scale.md)")
    g.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="local (default): here, one after the other; ray: each run and each cell (each "
        "row of claims) a Ray task, as many at once as the cluster holds "
        '(pip install "privaudit[ray]")',
    )
    g.add_argument(
        "--ray-address",
        default=None,
        metavar="auto|HOST:PORT",
        help="the Ray cluster to join: the head's HOST:PORT (default: RAY_ADDRESS or a "
        "cluster started on this machine by `ray start`, else a new one here; auto: any Ray "
        "running on this machine)",
    )
    g.add_argument(
        "--cell-cpus",
        type=float,
        default=1.0,
        metavar="N",
        help="CPUs each Ray task reserves (default 1)",
    )
    g.add_argument(
        "--cell-gpus",
        type=float,
        default=None,
        metavar="N",
        help="GPUs each Ray task reserves (default: 1 with --device cuda, else 0)",
    )


def worker_setup(plugins: list[str]) -> None:
    """Run in each Ray worker before a task: load the installed plugins and the plugin
    files this command loaded, so that their defenses and attacks exist there too."""
    from privaudit.plugins import load_plugins

    load_plugins(plugins, environment=False)


def executor_from_args(a: argparse.Namespace) -> Any:
    """The executor ``--executor`` names (None: the local default), refused at once
    when Ray is asked for but not installed or a setting is out of range."""
    if a.executor == "local":  # privaudit's commands refuse these earlier (cli.rules)
        for flag, value in (
            ("--ray-address", a.ray_address),
            ("--cell-gpus", a.cell_gpus),
            ("--cell-cpus", None if a.cell_cpus == 1.0 else a.cell_cpus),
        ):
            if value is not None:
                raise PrivauditError(f"{flag} is a setting of --executor ray; add --executor ray")
        return None
    from privaudit.api.executor import RayExecutor
    from privaudit.plugins import loaded_files

    absolute_paths(a)
    return RayExecutor(
        address=a.ray_address,
        cell_cpus=a.cell_cpus,
        cell_gpus=a.cell_gpus,
        setup=functools.partial(worker_setup, loaded_files()),
        threads=getattr(a, "threads", None),
        shared=getattr(a, "out", None),
    )


def absolute_paths(a: argparse.Namespace) -> None:
    """Make ``a.out`` and ``a.data_root`` absolute, in place: a Ray worker's working
    folder is where its node's ``ray start`` ran, not this one, so a relative path in a
    task would name another folder there. Call it before ``a`` is turned into configs."""
    for name in ("out", "data_root"):
        value = getattr(a, name, None)
        if value is not None:
            setattr(a, name, str(Path(value).expanduser().absolute()))
