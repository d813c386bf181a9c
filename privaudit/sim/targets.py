"""The target registry: ``<defense>-<message kind>``, built from the defenses' own kinds, and
:class:`Target`, the one value every command passes around for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from privaudit.core.config import RunConfig
from privaudit.core.errors import MISSING, PrivauditError, unknown
from privaudit.core.privacy import Privacy
from privaudit.defenses import DEFENSES, Defense

if TYPE_CHECKING:
    from privaudit.sim.run import Run


def all_targets() -> dict[str, tuple[Defense, str, str]]:
    """``{target: (defense, kind, one-line description)}`` in registry order."""
    return {
        f"{d.name}-{kind}": (d, kind, text)
        for d in DEFENSES.values()
        for kind, text in d.kinds.items()
    }


@dataclass(frozen=True)
class Target:
    """One attackable message kind of one defense, e.g. ``dpdl-cg``: parsed once, then asked
    what it needs (rounds, the run to train, its mechanism facts)."""

    name: str
    defense: Defense
    kind: str

    @classmethod
    def parse(cls, name: str) -> Target:
        targets = all_targets()
        if name not in targets:
            raise PrivauditError(f"{unknown('target', name, targets)}; {MISSING}")
        defense, kind, _ = targets[name]
        return cls(name, defense, kind)

    def rounds_needed(self, t: int, agents: int, span: int = 0) -> list[int]:
        """Every round whose messages observing rounds ``t..t+span`` needs (sorted)."""
        return sorted(
            {
                r
                for o in range(t, t + span + 1)
                for r in self.defense.rounds_needed(self.kind, o, agents)
            }
        )

    def rounds_to_train(self, t: int, agents: int, span: int = 0) -> int:
        """How long the run a command trains for this target is, when ``--rounds`` is not
        given: the default run (``RunConfig().rounds``, over which σ is calibrated), longer
        where the observed rounds need it. The same for every command, so that an attack and
        an audit of one round look at the same run."""
        return max(max(self.rounds_needed(t, agents, span)), RunConfig().rounds)

    def check_run(self, run: Run, t: int, span: int = 0) -> None:
        """Refuse a run of another defense, or a round (with ``span`` later ones) outside
        what the run can show."""
        if self.defense.name != run.defense.name:
            raise PrivauditError(
                f"target {self.name} needs a {self.defense.name} run, but this run trains "
                f"{run.defense.name}; pick a {run.defense.name}-* target or another --run"
            )
        rounds = self.rounds_needed(t, run.cfg.agents, span)
        if t < 1 or max(rounds) > run.cfg.rounds:
            what = f"--round {t}" + (f" with --span {span}" if span else "")
            last = run.cfg.rounds - (max(rounds) - t - span)
            raise PrivauditError(
                f"{what} is outside what this run can show for {self.name} "
                f"(1..{last} of {run.cfg.rounds} rounds); pick a round in range"
                + (", --span" if span else "")
                + " or train longer"
            )

    @classmethod
    def of(cls, target: str | Target) -> Target:
        """``target`` as a Target: one already parsed as is (a command parses ``--target``
        once and hands the Target down), a name by :meth:`parse`."""
        return target if isinstance(target, Target) else cls.parse(target)

    def privacy(self, run: Run, agent: int | None = None) -> Privacy:
        """The mechanism facts of this kind for ``agent``'s data in ``run``."""
        return self.defense.privacy(run.params, self.kind, run.ctx.W.cpu(), agent)

    def __str__(self) -> str:
        return self.name
