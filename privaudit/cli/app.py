"""``privaudit``: list targets, train a defense, attack a target's messages.

Every user error ends in one line ``privaudit: error: …`` naming the fix, and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path
from typing import Any

from privaudit.core import limits
from privaudit.core.config import RunConfig
from privaudit.core.errors import PrivauditError, unknown

DEFAULTS = RunConfig()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + line
        raise PrivauditError(f"{message} (see privaudit {self.prog.split()[-1]} --help)")


def _param(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` → (name, value): the value as JSON (1e-3, true, null, "text") or, when
    it is not JSON, the text itself; its type is checked against the parameter's declared
    one later (:mod:`privaudit.core.schema`, in :func:`~privaudit.defenses.base.params_of` and
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
        type=_param,
        metavar="NAME=VALUE",
        help="an attack option, e.g. -a tv=1e-3 -a lr=0.05",
    )


def _training_options(p: argparse.ArgumentParser, rounds_default: int | None) -> None:
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
        type=_param,
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
    ``preset``) fills what they leave unset (:func:`privaudit.scenario.presets.apply`). Returns it
    with the line saying where the settings came from."""
    from privaudit.defenses import get_defense
    from privaudit.scenario import presets

    base = RunConfig(
        defense=defense,
        agents=a.agents,
        topology=a.topology or get_defense(defense).topology or DEFAULTS.topology,
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


def cmd_targets(a: argparse.Namespace) -> int:
    from privaudit.sim.targets import all_targets

    rows = [(name, text) for name, (_, _, text) in all_targets().items()]
    if a.json:
        print(json.dumps([{"target": n, "message": t} for n, t in rows], indent=2))
    else:
        width = max(len(n) for n, _ in rows)
        for n, t in rows:
            print(f"{n:<{width}}  {t}")
    return 0


def _capture(text: str | None, rounds: int) -> Any:
    """``--capture``: "all", or rounds and ranges like "1,5,10-20" → a CaptureSpec."""
    from privaudit.core.messages import CaptureSpec

    if text is None:
        return None
    if text.strip() == "all":
        return CaptureSpec.of(rounds=range(1, rounds + 1))
    out: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise PrivauditError(
            f"--capture takes 'all' or rounds like 1,5,10-20, got {text!r}"
        ) from None
    bad = sorted(t for t in out if not 1 <= t <= rounds)
    if bad or not out:
        raise PrivauditError(f"--capture rounds must lie in 1..{rounds}, got {text!r}")
    return CaptureSpec.of(rounds=out)


def cmd_train(a: argparse.Namespace) -> int:
    from privaudit.defenses import get_defense
    from privaudit.sim.run import Run

    get_defense(a.defense)
    cfg, origin = configured(a, a.defense, a.rounds, preset="utility")
    cfg = checked_params(cfg)
    print(origin, file=sys.stderr if a.json else sys.stdout, flush=True)
    capture = _capture(a.capture, cfg.rounds)
    if a.nproc is not None:
        limits.check_int("--nproc", a.nproc, 1, limits.MAX_AGENTS)
    limits.check_float("--dist-timeout", a.dist_timeout, 0.0, limits.MAX_SECONDS, lo_open=True)
    if a.backend == "torch.distributed":
        from privaudit.sim import distributed

        if distributed.under_launcher():  # started by torchrun: this process is one rank
            distributed.train_rank(cfg, a.out, capture, a.dist_timeout, not a.no_progress)
            if distributed.rank() != 0:
                return 0
        else:
            distributed.launch(cfg, a.out, a.nproc, capture, a.dist_timeout, not a.no_progress)
        run = Run.open(a.out, device=cfg.device)
        state = run.train(progress=False)  # the merged last checkpoint
    elif a.backend == "sim":
        run = Run.create(cfg, a.out)
        state = run.train(capture=capture, progress=not a.no_progress)
    else:
        raise PrivauditError(f"--backend must be sim or torch.distributed, got {a.backend!r}")
    acc = run.test_accuracy(state)
    if a.json:
        from privaudit.core.files import to_jsonable

        out = {
            "defense": a.defense,
            "run": str(a.out),
            "test_accuracy": acc,  # the agents' average model
            "agent_test_accuracy": run.agent_accuracies(state),  # each agent's own model
            **run.resolved,
        }
        print(json.dumps(to_jsonable(out), indent=2))
        return 0
    print(
        f"{a.defense}: {run.cfg.rounds} rounds, {run.cfg.agents} agents on {run.cfg.topology}, "
        f"σ = {run.resolved['sigma']:.3g}; test accuracy of the average model {acc:.3f}; "
        f"run in {a.out}"
    )
    print(privacy_lines(run.resolved))
    return 0


def privacy_lines(resolved: dict[str, Any]) -> str:
    """The ε a run's messages have, kind by kind (worst agent), with the reason for each
    ∞ and the paper's claim where it differs; adjacency and sampling stated."""
    lines = [
        f"privacy (δ = {resolved['delta']:g}, {resolved['adjacency']}, "
        f"{resolved['sampling']}, worst agent):"
    ]
    for kind, k in resolved["kinds"].items():
        eps, claim = k["epsilon"], k["epsilon_claimed"]
        text = f"ε = {eps:.3g}" if math.isfinite(eps) else f"ε = ∞ ({k['reason']})"
        if math.isfinite(claim) and not math.isclose(claim, eps, rel_tol=1e-3):
            text += f"; the paper's accounting claims ε = {claim:.3g}"
        lines.append(f"  {kind}: {text}")
    return "\n".join(lines)


def cmd_attack(a: argparse.Namespace) -> int:
    from privaudit.api.pipeline import attack
    from privaudit.core.threat import ORDER, parse_agents, parse_link
    from privaudit.sim.run import Run
    from privaudit.sim.targets import parse_target

    if a.threat is not None and a.threat not in ORDER:
        raise unknown("threat model", a.threat, ORDER)  # before any training

    defense, kind = parse_target(a.target)
    # unknown attacks and bad options fail before any training
    options = attack_options(a, a.attack)
    limits.check_int("--round", a.round, 1, limits.MAX_ROUNDS)
    out = check_out(a.out or f"privaudit-out/{a.target}-r{a.round}")
    if a.run:
        run = Run.open(a.run, device=a.device)
    else:
        need = max(defense.rounds_needed(kind, a.round, a.agents))  # *-model: R+1
        rounds = need if a.rounds is None else a.rounds
        run = Run.create(checked_params(config_from_args(a, defense.name, rounds)), out / "run")
    links = [parse_link(s, run.edges()) for s in a.link] if a.link else None
    n = run.cfg.agents
    attackers = parse_agents(a.attacker, n) if a.attacker else None
    victims = parse_agents(a.victim, n) if a.victim else None
    result = attack(
        run,
        a.target,
        a.round,
        attack=a.attack,
        links=links,
        threat=a.threat or ("link" if links else None),
        attackers=attackers,
        victims=victims,
        out=out,
        iterations=a.iterations,
        restarts=a.restarts,
        seed=a.attack_seed,
        options=options,
        lpips=not a.no_lpips,
        progress=not a.no_progress,
    )
    if a.json:
        from privaudit.core.files import to_jsonable

        print(json.dumps(to_jsonable(result), indent=2))
        return 0
    if result["threat_chosen"]:
        print(
            f"threat: {result['adversaries'][0]} — the weakest adversary that observes "
            f"{a.target} (choose one with --threat link|neighbor|coalition|global)"
        )
    m = result["metrics"]
    eps = result["epsilon"]
    if m["mse"] is None:
        print(
            f"{a.target} round {a.round}: every victim's batch is empty (Poisson sampling, "
            f"realised sizes {result['batch_sizes']}): nothing to reconstruct; "
            f"wrote {out / 'result.json'}"
        )
        return 0
    lp = f"{m['lpips']:.3f}" if m["lpips"] is not None else "n/a"
    used = sorted({u for u in result["attack_used"] if u})
    name = result["attack"]
    if used and used != [name]:  # e.g. auto: the attack it picked
        name = f"{name} ({', '.join(used)})"
    print(
        f"{a.target} round {a.round}, {name} under "
        f"{'; '.join(sorted(set(result['adversaries'])))} (links {result['links']}), "
        f"ε = {eps if eps is not None else math.inf:.3g}: "
        f"PSNR {m['psnr']:.2f} dB, SSIM {m['ssim']:.3f}, MSE {m['mse']:.4f}, LPIPS {lp}, "
        f"label acc {m['label_acc']:.2f}, {result['wall_s']:.1f} s"
    )
    if result["lpips_note"]:
        print(result["lpips_note"])
    print(f"wrote {out / 'result.json'} and {result['figure']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="privaudit", description=__doc__.splitlines()[0])
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="FILE.py",
        help="load your own defense or attack from this file, before the command (repeatable; "
        "PRIVAUDIT_PLUGINS and installed packages' entry points load too; docs/extending.md)",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    t = sub.add_parser("targets", help="list attack targets (<defense>-<message>)")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_targets)

    tr = sub.add_parser("train", help="train a defense over N agents, with checkpoints")
    tr.add_argument("--defense", required=True, help="dsgd | nd | dpdl (privaudit targets)")
    tr.add_argument("--out", required=True, help="run directory (resumed if it exists)")
    tr.add_argument(
        "--json", action="store_true", help="print σ, ε per message kind and per agent as JSON"
    )
    _training_options(tr, None)
    sc = tr.add_argument_group("engine (README, Scale-out)")
    sc.add_argument(
        "--capture",
        default=None,
        metavar="ROUNDS",
        help="also record every message of these rounds, e.g. 1,5,10-20 or all (default: "
        "none; attacks re-simulate the rounds they need from a checkpoint)",
    )
    sc.add_argument(
        "--backend",
        default="sim",
        help="sim (default: all agents in this process) | torch.distributed (one process "
        "per agent, gloo on CPU, nccl on GPU)",
    )
    sc.add_argument(
        "--nproc", type=int, default=None, help="ranks to start (= --agents, the default)"
    )
    sc.add_argument(
        "--dist-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long a rank waits for a peer before the run stops (default 300)",
    )
    tr.set_defaults(func=cmd_train)

    at = sub.add_parser("attack", help="reconstruct a private batch from a target's messages")
    at.add_argument("--target", required=True, help="e.g. dpdl-cg (privaudit targets)")
    at.add_argument("--round", type=int, required=True, help="round whose message is attacked")
    at.add_argument(
        "--attack", default=None, help="ig (default) | dlg | idlg | analytic | rgap | auto"
    )
    at.add_argument(
        "--threat",
        default=None,
        help="link | neighbor | coalition | global (default: the weakest that observes it)",
    )
    at.add_argument(
        "--attacker",
        default=None,
        metavar="A[,B,...]",
        help="the curious agent (neighbor; default: the victim's first receiver) or the "
        "coalition's members (default: everyone the victim sends to)",
    )
    at.add_argument(
        "--victim",
        default=None,
        metavar="V[,W,...]",
        help="agent(s) whose message is attacked (default: the first non-attacker)",
    )
    at.add_argument(
        "--link",
        action="append",
        default=None,
        metavar="SRC,DST",
        help="the link whose SRC→DST message is attacked (repeatable)",
    )
    at.add_argument("--run", default=None, help="an existing run directory (else one is trained)")
    at.add_argument("--out", default=None, help="output folder (default privaudit-out/T-rR)")
    at.add_argument("--iterations", type=int, default=None)
    at.add_argument("--restarts", type=int, default=None)
    at.add_argument("--attack-seed", type=int, default=0)
    add_attack_option(at)
    at.add_argument("--no-lpips", action="store_true")
    at.add_argument("--json", action="store_true", help="print result.json on stdout")
    _training_options(at, None)
    at.set_defaults(func=cmd_attack)
    from privaudit.cli.audit import add_parser as add_audit

    add_audit(sub, _training_options)
    from privaudit.cli.compare import add_parser as add_compare

    add_compare(sub, _training_options)
    from privaudit.cli.claims import add_parser as add_claims

    add_claims(sub, _training_options)
    return p


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
    try:
        args = build_parser().parse_args(argv)
        from privaudit.plugins import load_plugins

        load_plugins(args.plugin)  # entry points, PRIVAUDIT_PLUGINS, then --plugin files
        if getattr(args, "threads", None) is not None:
            limits.check_threads("--threads", args.threads)
            import torch

            torch.set_num_threads(args.threads)
        return args.func(args)
    except PrivauditError as e:
        print(f"privaudit: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `privaudit targets | head`
        sys.stderr.close()
        return 0
    except OSError as e:  # a path that cannot be read or written
        print(f"privaudit: error: {os_error(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a round loop says itself how to resume (a PrivauditError)
        print("privaudit: error: interrupted", file=sys.stderr)
        return 2


def os_error(e: OSError) -> str:
    """One line for a failed file operation: the path, the system's reason and the fix."""
    import errno

    reason = e.strerror or str(e)
    path = e.filename
    if path is None:
        return f"{reason}; check the paths given (--out, --run, --data-root)"
    if e.errno == errno.EROFS:
        return f"cannot write {path}: {reason}; choose a writable --out"
    if e.errno in (errno.EACCES, errno.EPERM):
        return (
            f"cannot access {path}: {reason}; choose a --out you can write (and a --run or "
            "--data-root you can read)"
        )
    if e.errno == errno.ENOSPC:
        return f"cannot write {path}: {reason}; free some space or choose another --out"
    if e.errno in (errno.ENOTDIR, errno.EEXIST, errno.EISDIR):
        return f"cannot use {path}: {reason}; choose another --out (a folder path)"
    return f"cannot use {path}: {reason}; check the path"


if __name__ == "__main__":
    sys.exit(main())
