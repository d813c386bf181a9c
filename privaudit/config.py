"""A run's configuration: every choice that determines its messages, validated up front."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from .errors import PrivauditError

# Fields that do not change the messages: a run may be resumed with different values.
NON_IDENTITY = ("device", "checkpoint_every", "data_root", "download")


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
    dirichlet_alpha: float = 0.5  # label skew of the partition (not DPDL's α)
    epsilon: float | None = 1.0  # target ε per agent over the run; None: use ``sigma``
    delta: float = 1e-5
    sigma: float | None = None  # noise multiplier; overrides ``epsilon`` when set
    accountant: str = "rdp"
    params: dict[str, Any] = field(default_factory=dict)  # defense parameters (lr, clip, …)
    seed: int = 0
    device: str = "cpu"
    checkpoint_every: int = 50

    def validate(self) -> RunConfig:
        if self.agents < 2:
            raise PrivauditError(f"--agents must be at least 2, got {self.agents}")
        if self.rounds < 1:
            raise PrivauditError(f"--rounds must be at least 1, got {self.rounds}")
        if self.batch_size < 1:
            raise PrivauditError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.epsilon is not None and not self.epsilon > 0:
            raise PrivauditError(f"--epsilon must be > 0, got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise PrivauditError(f"--delta must be in (0, 1), got {self.delta}")
        if self.sigma is not None and self.sigma < 0:
            raise PrivauditError(f"--sigma must be ≥ 0, got {self.sigma}")
        if not self.dirichlet_alpha > 0:
            raise PrivauditError(f"--dirichlet-alpha must be > 0, got {self.dirichlet_alpha}")
        if self.checkpoint_every < 1:
            raise PrivauditError("--checkpoint-every must be at least 1")
        if self.accountant not in ("rdp", "prv"):
            raise PrivauditError(f"--accountant must be rdp or prv, got {self.accountant!r}")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise PrivauditError(f"--device must be cpu or cuda, got {self.device!r}")
        return self

    def identity(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in NON_IDENTITY:
            d.pop(k)
        return d

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(d) - names)
        if bad:
            raise PrivauditError(f"config has unknown field(s) {', '.join(bad)}")
        try:
            return cls(**d).validate()
        except TypeError as e:
            raise PrivauditError(f"malformed config: {e}") from None
