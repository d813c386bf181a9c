"""The names the command line offers for its torch-backed registries — the defenses, the
attacks and the attack targets — known without loading torch, so that ``privaudit --help``,
each command's ``--help`` and ``privaudit targets`` answer at once.

:data:`BUILT_IN` copies the built-in names in registry order (a test keeps the copy equal to
the registries; the membership attacks are :mod:`privaudit.eval.membership_attacks`'s; the
targets' and attacks' lines are :mod:`privaudit.cli.builtin_targets`);
:func:`registered` reads the registries themselves, plugins' names included,
for a process that loaded plugins before its parser (:func:`privaudit.cli.app.run`). The threat
models and accountants need no copy: their registries (:mod:`privaudit.core.threat`,
:mod:`privaudit.core.accountants`) load no torch, and their help is read from them directly.
Names are only listed here: an unknown one is refused by its registry when the command runs,
with the one-line error that names the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from privaudit.cli import builtin_targets


@dataclass(frozen=True)
class Vocabulary:
    """The defense and attack names a parser lists, in registry order, and the attack a
    command runs when none is named."""

    defenses: tuple[str, ...]
    attacks: tuple[str, ...]
    default_attack: str
    membership_attacks: tuple[str, ...]  # mia's model-level attacks (--attack NAME)
    # (name, its one line) of every target and attack, as ``privaudit targets`` lists them
    targets: tuple[tuple[str, str], ...] = builtin_targets.TARGETS
    attack_lines: tuple[tuple[str, str], ...] = builtin_targets.ATTACKS

    def defense_help(self) -> str:
        """``a | b | …``: every defense, as ``--defense``'s help lists them."""
        return " | ".join(self.defenses)

    def attack_help(self) -> str:
        """``ig (default) | fi | …``: every attack, the default marked."""
        return " | ".join(f"{n} (default)" if n == self.default_attack else n for n in self.attacks)


BUILT_IN = Vocabulary(
    defenses=(
        "adad2p",
        "constd2p",
        "clipd2p",
        "dp-cga",
        "dp-dpsgd",
        "dpdl",
        "nd",
        "dsgd",
        "muffliato",
        "pdsl",
        "dsgt",
        "lppa",
        "dp-dsgt",
    ),
    attacks=("analytic", "ig", "fi", "spear", "cpa", "rgap", "auto", "dlg", "idlg", "hybrid"),
    default_attack="ig",
    membership_attacks=("loss", "lira", "rmia"),
)

# installed packages' entry-point groups that hold plugins (privaudit.plugins.GROUPS, copied:
# finding whether any plugin is installed must not load the registries)
PLUGIN_GROUPS = (
    "privaudit.defenses",
    "privaudit.attacks",
    "privaudit.threats",
    "privaudit.accountants",
)


def registered() -> Vocabulary:
    """The registries' names, plugins' included (loads torch and every defense and attack)."""
    from privaudit.attacks import ATTACKS, DEFAULT_ATTACK
    from privaudit.attacks.registry import SUMMARIES
    from privaudit.defenses import DEFENSES
    from privaudit.eval.membership_attacks import MEMBERSHIP_ATTACKS
    from privaudit.sim.targets import all_targets

    return Vocabulary(
        tuple(DEFENSES),
        tuple(ATTACKS),
        DEFAULT_ATTACK,
        tuple(MEMBERSHIP_ATTACKS),
        tuple((name, text) for name, (_, _, text) in all_targets().items()),
        tuple(SUMMARIES.items()),
    )
