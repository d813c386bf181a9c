"""A run's configuration: every choice that determines its messages, validated up front."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from privaudit.core import limits, schema
from privaudit.core.accountants import check_delta, get_accountant
from privaudit.core.errors import PrivauditError, unknown
from privaudit.core.files import dumps_strict

# Fields that do not change the messages: a run may be resumed with different values.
NON_IDENTITY = ("device", "max_memory", "checkpoint_every", "data_root", "download", "preset")
# How far a run is trained: no message of an earlier round depends on it (each agent's
# generator is seeded and checkpointed per agent, no step size is scheduled over the run), so
# a longer run resumes a shorter one (:meth:`RunConfig.key`) — unless σ is calibrated from ε
# over these rounds, when a longer run has another σ and so other messages
LENGTH = "rounds"
# integral floats up to this size are written as ints in a key: 1.0 and 1 are one number
EXACT_INT = 2**53

AGENTS_HINT = "decentralized learning needs a neighbour; the simulator's graph is dense N×N"

EVAL_SPLITS = ("test", "validation")  # what a run's test accuracy is measured on
PRECISIONS = ("float32", "float64")  # --precision
# fields added after runs were made, left out of a run's identity at their default so those
# runs keep their folder names and cache keys
NEW_DEFAULTS = {"precision": "float32", "gossip": "mh"}


@dataclass
class RunConfig:
    """Defaults are the README's main command: DPDL, 10 agents on a ring, photos, LeNet."""

    defense: str = "dpdl"
    rounds: int = 200
    agents: int = 10
    topology: str = "ring"
    dataset: str = "photos"
    data_root: str | None = None
    download: bool = False
    model: str = "lenet"
    batch_size: int = 8
    # each agent trains on this many examples of its shard (a seeded draw; None: all of
    # it): --examples-per-agent 1 is El Mrini et al.'s one example per agent
    examples_per_agent: int | None = None
    # the float type of the models, data and messages: float64 is El Mrini et al.'s D-GD
    # (their attack reads differences of 1e-5 steps in the messages); float32 (the default)
    # is left out of the run's identity, so runs made before the field keep their keys
    precision: str = "float32"
    # the gossip matrix built from the graph (privaudit.scenario.topology.GOSSIP_MATRICES):
    # "mh" (Metropolis–Hastings, the default, left out of the identity like ``precision``)
    # or "laplacian" (El Mrini et al.'s W = I − L/d_max)
    gossip: str = "mh"
    dirichlet_alpha: float = 0.5  # label skew of the partition (not DPDL's α)
    epsilon: float | None = 1.0  # target ε per agent over the run; None: use ``sigma``
    delta: float = 1e-5
    sigma: float | None = None  # noise multiplier; overrides ``epsilon`` when set
    accountant: str = "rdp"
    params: dict[str, Any] = field(default_factory=dict)  # defense parameters (lr, clip, …)
    seed: int = 0
    device: str = "cpu"
    # budget of the per-example gradient engine ("4G", "512M"; None: half of what is free)
    max_memory: str | None = None
    checkpoint_every: int = 50
    # where accuracy is measured: "test", or "validation" (10 % of the training split held
    # out of training; what an operating-point search may look at)
    eval_split: str = "test"
    # the preset the unset training flags came from (privaudit/scenario/presets.py); informational
    preset: str | None = None

    def validate(self) -> RunConfig:
        """Every field in its documented range (:mod:`privaudit.core.limits`), or one clear error:
        a run never starts on a value the accountant or the engine cannot answer."""
        limits.check_int("--agents", self.agents, 2, limits.MAX_AGENTS, AGENTS_HINT)
        limits.check_int("--rounds", self.rounds, 1, limits.MAX_ROUNDS)
        limits.check_int("--batch-size", self.batch_size, 1)
        if self.examples_per_agent is not None:
            limits.check_int("--examples-per-agent", self.examples_per_agent, 1)
            if self.batch_size > self.examples_per_agent:
                raise PrivauditError(
                    f"--batch-size {self.batch_size} is more than --examples-per-agent "
                    f"{self.examples_per_agent}: a batch is drawn from the agent's examples; "
                    "use --sampling full (every step on all of them) or a smaller --batch-size"
                )
        if self.epsilon is not None:
            limits.check_float("--epsilon", self.epsilon, *limits.EPSILON, hint="ε per agent")
        limits.check_delta(self.delta)
        if self.sigma is not None:
            limits.check_sigma("--sigma", self.sigma)
        limits.check_float("--dirichlet-alpha", self.dirichlet_alpha, *limits.DIRICHLET_ALPHA)
        limits.check_int("--checkpoint-every", self.checkpoint_every, 1)
        limits.check_seed("--seed", self.seed)
        check_delta(get_accountant(self.accountant), self.delta)
        if self.precision not in PRECISIONS:
            raise PrivauditError(
                f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )
        if self.eval_split not in EVAL_SPLITS:
            raise unknown("evaluation split", self.eval_split, EVAL_SPLITS)
        if not isinstance(self.device, str) or not (
            self.device in ("cpu", "cuda") or self.device.startswith("cuda:")
        ):
            raise PrivauditError(f"--device must be cpu or cuda, got {self.device!r}")
        return self

    def identity(self) -> dict[str, Any]:
        """Every field that determines the run trained to its end (its messages and its last
        model), as given: what a run folder records (:func:`privaudit.sim.rundir.run_record`)
        and what a result of the whole run is keyed by."""
        d = dataclasses.asdict(self)
        for k in NON_IDENTITY:
            d.pop(k)
        for k, default in NEW_DEFAULTS.items():
            if d[k] == default:
                d.pop(k)  # the default: the keys of runs made before the field
        return d

    def key(self, params: dict[str, Any], calibrated: bool) -> dict[str, Any]:
        """What determines the run's messages up to any round, in one spelling, for folder
        names, cache keys and the check that a folder holds this run: :meth:`identity` with
        the defense's parameters ``params`` as resolved (every default filled in, so ``-p
        clip=1`` where 1 is the default is the same run), numbers canonical (:func:`canonical`)
        and :data:`LENGTH` (how far it is trained) only when ``calibrated``: σ is set from ε
        over those rounds (:func:`privaudit.sim.run.run_key` says which)."""
        d = self.identity()
        d["params"] = params
        if not calibrated:
            d.pop(LENGTH)
        return canonical(d)

    def to_json(self) -> str:
        """Every field as strict JSON (:func:`privaudit.core.files.dumps_strict`)."""
        return dumps_strict(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        """A config read back (a run directory's config.json): every field's type checked
        against its annotation (:mod:`privaudit.core.schema`, as the CLI's values), then
        :meth:`validate`."""
        if not isinstance(d, dict):
            raise PrivauditError(f"config must be a JSON object, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(d) - names)
        if bad:
            raise PrivauditError(f"config has unknown field(s) {', '.join(bad)}")
        values = schema.coerce_all(d, schema.hints(cls), what="config field")
        try:
            return cls(**values).validate()
        except TypeError as e:
            raise PrivauditError(f"malformed config: {e}") from None


def canonical(value: Any) -> Any:
    """``value`` with every number in one spelling, so that equal settings hash alike: a
    finite integral float as an int (``1.0`` and ``1`` are one value), through dicts, lists
    and tuples (as lists); anything else unchanged."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value) if abs(value) <= EXACT_INT else value
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    return value
