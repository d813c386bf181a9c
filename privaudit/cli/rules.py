"""Which options each command takes in each of its modes, and the agents and rounds its
options name: checked right after parsing, before anything is loaded or written.

Every command has one table (:data:`TABLES`): its modes — ``audit --mode one-run``, ``attack
--run R`` (a run given: training flags are meaningless), ``mia``'s message level and model
level, ``train --backend sim``, … — each with the options that do nothing in it. An option
given on the command line (:data:`~privaudit.cli.options.GIVEN`: given, not defaulted) in a
mode that ignores it is refused with one line naming it, the mode and the fix, rather than
silently ignored.

Agent lists (``--victim``, ``--attacker``, ``--link``) name each agent once, within the
run's 0..N-1, and a ``--victim`` beside ``--link`` must be the link's sender; the round a
command observes must lie within the run (``--run``'s, or the ``--rounds`` asked). Each is
refused with one line naming its flag (:func:`check`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from privaudit.cli.options import DEFAULTS, GIVEN, RUN_FLAGS
from privaudit.cli.vocabulary import registered
from privaudit.core import limits
from privaudit.core.errors import PrivauditError


@dataclass(frozen=True)
class Mode:
    """One mode of a command: when it ``holds`` (on the parsed arguments), the options it
    ``ignores`` (flags, as typed), how the refusal names it (``where``, formatted with the
    arguments, completes "--X does nothing …") and the way out (``fix``, after "drop it")."""

    name: str
    holds: Callable[[argparse.Namespace], bool]
    ignores: tuple[str, ...]
    where: str
    fix: str


# flags whose attribute is not the flag's own spelling (--data-root → data_root)
DESTS = {"-p": "param", "-a": "attack_option"}


def dest(flag: str) -> str:
    """The attribute argparse stores ``flag`` under."""
    return DESTS.get(flag, flag.lstrip("-").replace("-", "_"))


# -- the modes several commands share --------------------------------------------------------
RUN = Mode(
    "run",
    lambda a: a.run is not None,
    (*RUN_FLAGS.values(), "--checkpoint-every"),
    "with --run {run}, which trains with its own settings (its config.json)",
    ", or leave out --run to train a new run",
)
# attack's run mode: its own training flags too (train and attack take them:
# privaudit.cli.train.sampling_options), which a --run has in its config.json
ATTACK_RUN = dataclasses.replace(
    RUN, ignores=(*RUN.ignores, "--examples-per-agent", "--sampling", "--precision", "--gossip")
)
NO_DATA_ROOT = Mode(
    "no data root",
    lambda a: a.data_root is None,
    ("--download",),
    "without --data-root (the folder a dataset is downloaded into)",
    ", or add --data-root DIR",
)
LOCAL = Mode(
    "local executor",
    lambda a: a.executor == "local",
    ("--ray-address", "--cell-cpus", "--cell-gpus"),
    "with --executor local (the default; these are settings of --executor ray)",
    ", or add --executor ray",
)


def sweep(command: str, flag: str) -> Mode:
    """A sweeping command's one mode: it sets σ from ``flag``'s ε, so ``--sigma`` is idle."""
    return Mode(
        "sweep",
        lambda a: True,
        ("--sigma",),
        f"in {command}, which sets σ from ε ({flag})",
        f", and give {flag} instead",
    )


def _mia_level(a: argparse.Namespace) -> str | None:
    """``mia``'s level: "grad" (message level), "model", or None (an --attack mia refuses)."""
    if a.attack == "grad":
        return "grad"
    return "model" if a.attack in registered().membership_attacks else None


def _trains_no_references(a: argparse.Namespace) -> bool:
    """A model-level attack that declared it uses no reference runs (LOSS)."""
    from privaudit.eval.membership_attacks import declared  # torch: loaded by now

    return _mia_level(a) == "model" and declared(a.attack).references is None


TABLES: dict[str, tuple[Mode, ...]] = {
    "targets": (),
    "train": (
        Mode(
            "sim",
            lambda a: a.backend == "sim",
            ("--nproc", "--dist-timeout"),
            "with --backend sim (the default: every agent in this process)",
            ", or use --backend torch.distributed",
        ),
        NO_DATA_ROOT,
    ),
    "attack": (ATTACK_RUN, NO_DATA_ROOT),
    "audit": (
        Mode(
            "final models",
            lambda a: a.observe == "final",
            ("--round", "--span", "--link", "--threat", "--canary-shape", "--canaries"),
            "with --observe final (the canary joins every round; the adversary sees the final "
            "models only)",
            ", or use --observe messages",
        ),
        Mode(
            "messages",
            lambda a: a.observe != "final",
            ("--observer", "--batches"),
            "with --observe messages (the default)",
            ", or add --observe final",
        ),
        Mode(
            "one-run",
            lambda a: a.mode == "one-run",
            ("--round", "--span", "--canary-shape", "--canaries"),
            "in --mode one-run (it audits every round of the run with Dirac canaries; "
            "--trials is their number)",
            ", or use --mode white-box",
        ),
        RUN,
        NO_DATA_ROOT,
    ),
    "mia": (
        Mode(
            "message level",
            lambda a: _mia_level(a) == "grad",
            ("--references", "--on", "--candidates"),
            "in the message-level attack (--attack grad, the default)",
            ", or use a model-level --attack loss|lira|rmia",
        ),
        Mode(
            "model level",
            lambda a: _mia_level(a) == "model",
            ("--scorer", "--messages"),
            "in the model-level attack (--attack {attack})",
            ", or use the message-level --attack grad",
        ),
        Mode(
            "no references",
            _trains_no_references,
            ("--references",),
            "in --attack {attack}, which trains no reference runs",
            ", or use --attack lira|rmia",
        ),
        RUN,
        NO_DATA_ROOT,
    ),
    "compare": (
        sweep("compare", "--epsilons"),
        Mode(
            "no audit",
            lambda a: not (a.preset == "utility" if a.audit is None else a.audit),
            ("--audit-trials",),
            "without the audit (--no-audit, or the attack preset without --audit)",
            ", or add --audit",
        ),
        LOCAL,
        NO_DATA_ROOT,
    ),
    "claims": (LOCAL, NO_DATA_ROOT),
    "reproduce": (sweep("reproduce", "--epsilon"), NO_DATA_ROOT),
    "report": (),  # one mode: every option of it applies
}


def check_options(a: argparse.Namespace) -> None:
    """Refuse the options given in a mode of ``a.command`` that ignores them: one line
    naming them, the mode and the fix (the first mode with any, in table order)."""
    given = getattr(a, GIVEN, frozenset())
    for mode in TABLES.get(a.command, ()):
        idle = [flag for flag in mode.ignores if dest(flag) in given]
        if idle and mode.holds(a):
            where = mode.where.format(**vars(a))
            verb, it = ("do", "them") if len(idle) > 1 else ("does", "it")
            raise PrivauditError(f"{', '.join(idle)} {verb} nothing {where}; drop {it}{mode.fix}")


# -- agents and rounds -------------------------------------------------------------------------
class Shape:
    """The agents N and rounds T of the run a command works on, read when first asked: from
    ``--run``'s config.json (nothing else is loaded), else ``--agents`` (or the default) and
    ``--rounds`` (None when the command trains as long as it needs); with where they come
    from, in words."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a

    @functools.cached_property
    def of(self) -> tuple[int, int | None, str]:
        a = self.a
        if a.run is not None:
            from privaudit.sim.rundir import RunDir

            cfg, _ = RunDir(a.run).read_config()  # the error Run.open would give, earlier
            return cfg.agents, cfg.rounds, f"the run in {a.run}"
        if a.agents is None:
            return DEFAULTS.agents, a.rounds, "the default --agents"
        return a.agents, a.rounds, "--agents"


def agent_ids(flag: str, text: Any, agents: int | None, source: str = "") -> list[int]:
    """``flag``'s comma-separated agent ids (``"3"``, ``"1,4,7"``), each once and within
    0..N-1 (``agents`` N; None: unknown yet, only ≥ 0 is checked), or one line naming
    ``flag``."""
    try:
        ids = [int(s) for s in str(text).split(",") if s.strip()]
    except ValueError:
        ids = []
    if not ids:
        raise PrivauditError(
            f"{flag} must name agents by id, comma-separated (e.g. 0 or 0,5), got {text!r}"
        )
    top = "N-1" if agents is None else agents - 1
    bad = [i for i in ids if i < 0 or (agents is not None and i >= agents)]
    if bad:
        of = "" if agents is None else f" ({agents} agents: {source})"
        raise PrivauditError(f"{flag} must be an agent 0..{top}{of}, got {bad[0]}")
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise PrivauditError(
            f"{flag} {text} names agent {', '.join(map(str, twice))} more than once; name "
            "each agent once"
        )
    return ids


def adversary_of(
    a: argparse.Namespace,
    agents: int,
    links: list[tuple[int, int]] | None = None,
    victims: int | None = None,
) -> Any:
    """The :class:`~privaudit.sim.plan.Adversary` the command line names: ``--threat`` (or
    ``link`` where ``links`` are given and no threat is), ``links``, ``--attacker`` and
    ``--victim`` (at most its first ``victims`` agents), each agent within 0..``agents``-1.
    Built once per command and handed down."""
    from privaudit.sim.plan import Adversary  # the engine: loaded only once a command runs

    named = agent_ids("--victim", a.victim, agents) if a.victim else None
    return Adversary.of(
        threat=a.threat or ("link" if links else None),
        links=links,
        attackers=agent_ids("--attacker", a.attacker, agents) if a.attacker else None,
        victims=named if named is None or victims is None else named[:victims],
    )


def link_ids(text: str, agents: int, source: str) -> tuple[int, int]:
    """``--link SRC,DST`` as two agent ids of the run, or one line naming ``--link``."""
    parts = str(text).split(",")
    try:
        src, dst = (int(s) for s in parts)
    except ValueError:
        raise PrivauditError(f"--link must be SRC,DST (two agent ids), got {text!r}") from None
    for i in (src, dst):
        if not 0 <= i < agents:
            raise PrivauditError(
                f"--link {text} is not a link of the run: its agents are 0..{agents - 1} "
                f"({agents} agents: {source})"
            )
    return src, dst


def one_victim(a: argparse.Namespace) -> str | None:
    """Why ``a``'s command takes one ``--victim`` only, in words; None where it takes a list
    (``V[,W,...]``, as attack does)."""
    if a.command == "audit":
        return "an audit's canary goes into one agent's data"
    if a.command == "mia" and _mia_level(a) == "model":
        return "a model-level attack has one victim"
    return None


def check_agents(a: argparse.Namespace, shape: Shape) -> None:
    """``--victim``, ``--attacker`` and ``--link`` of ``a``: ids of the run, each once, one
    ``--victim`` where the command takes one (:func:`one_victim`), and a ``--victim`` beside
    ``--link`` the sender of the links (else it would be ignored)."""
    victim, attacker = getattr(a, "victim", None), getattr(a, "attacker", None)
    links = getattr(a, "link", None)
    links = [links] if isinstance(links, str) else links or []
    if victim is None and attacker is None and not links:
        return
    n, _, source = shape.of
    victims = None if victim is None else agent_ids("--victim", victim, n, source)
    single = one_victim(a)
    if victims is not None and len(victims) > 1 and single:
        raise PrivauditError(f"--victim {victim}: {single}; name one agent")
    if attacker is not None:
        agent_ids("--attacker", attacker, n, source)
    senders = sorted({link_ids(text, n, source)[0] for text in links})
    if victims is not None and links and sorted(set(victims)) != senders:
        named = " ".join(f"--link {text}" for text in links)
        raise PrivauditError(
            f"--victim {victim} and {named} disagree: the link's message is sent by agent "
            f"{', '.join(map(str, senders))}; drop --victim (--link names the attacked message)"
        )


def observed(a: argparse.Namespace) -> tuple[str, int, int] | None:
    """(flags, t, last): the rounds ``a``'s command observes — its flags in words, the first
    round t and the last round whose message it reads — or None when the command observes the
    whole run (``audit --mode one-run``) or its flags are out of range (its own checks say)."""
    t, span = getattr(a, "round", None), 0
    if a.command == "mia" and _mia_level(a) == "grad":
        t = 1 if t is None else t
        span = (8 if a.messages is None else a.messages) - 1
        what = f"--round {t} --messages {span + 1}"
    elif a.command == "audit":
        if a.mode != "white-box":
            return None
        span = a.span
        what = f"--round {t}" + (f" --span {span}" if span else "")
    else:  # attack; mia's model level
        what = f"--round {t}"
    if t is None or not 1 <= t <= limits.MAX_ROUNDS or not 0 <= span <= limits.MAX_ROUNDS:
        return None
    return what, t, t + span


def check_rounds(a: argparse.Namespace, shape: Shape) -> None:
    """The rounds ``a``'s command observes lie within the run: ``--run``'s rounds, or the
    ``--rounds`` asked of a new one (without, it trains as long as they need) — refused
    before a run is opened, created or trained, rather than after, or clipped quietly."""
    seen = observed(a)
    if seen is None or (a.run is None and a.rounds is None):
        return
    what, t, last = seen
    n, rounds, source = shape.of
    from privaudit.sim.targets import Target

    need = max(Target.parse(a.target).rounds_needed(last, n))
    if rounds is None or need <= rounds:
        return
    over = need - rounds
    if "--messages" in what:
        fewer = last - t + 1 - over
        fit = f"lower --messages to {fewer}" if fewer >= 1 else "pick an earlier --round"
    elif "--span" in what:
        fit = "lower --round or --span"
    else:
        fit = f"pick --round {t - over} or earlier" if t - over >= 1 else "pick another --round"
    more = "train longer" if a.run else f"raise --rounds to {need} (or leave it out)"
    has = f"{source} has {rounds} rounds" if a.run else f"--rounds is {rounds}"
    raise PrivauditError(
        f"{what} needs {a.target}'s messages up to round {need}, but {has}; {fit}, or {more}"
    )


def check(a: argparse.Namespace) -> None:
    """Every rule of this module on a command's parsed arguments ``a``: before the command
    loads, trains or writes anything."""
    check_options(a)
    shape = Shape(a)
    if a.command in ("attack", "audit", "mia"):
        check_agents(a, shape)
        check_rounds(a, shape)
