"""What the test files share: a tiny run's configuration, an agent's secret batch and its
gradient, checkpoints compared, a fixture for one torch thread, and the test tiers (the
``slow`` mark on the tests :data:`tiers.SLOW` names: ``pytest -m "not slow"`` runs the rest).

The functions are imported as ``from conftest import tiny``: pytest puts this folder (no
``__init__.py``) on ``sys.path`` when it collects the tests."""

from __future__ import annotations

import pytest
import torch
from tiers import SLOW

from privaudit.attacks import ATTACKS
from privaudit.cli import main
from privaudit.core.accountants import ACCOUNTANTS
from privaudit.core.config import RunConfig
from privaudit.core.errors import PLUGIN_ENV
from privaudit.core.threat import THREATS
from privaudit.defenses import DEFENSES
from privaudit.eval.membership_attacks import DECLARED, MEMBERSHIP_ATTACKS
from privaudit.sim.run import Run


def tiny(defense: str, **kw) -> RunConfig:
    """A tiny run of ``defense``: 4 agents, 3 rounds, batches of 2, a checkpoint every 2
    rounds, on the graph the defense requires (the ring where it requires none); ``kw``
    overrides any RunConfig field."""
    required = DEFENSES[defense].topology if defense in DEFENSES else None
    base = dict(
        defense=defense,
        rounds=3,
        agents=4,
        batch_size=2,
        topology=required or "ring",
        checkpoint_every=2,
    )
    return RunConfig(**{**base, **kw})


def secret_batch(run: Run, agent: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``agent``'s realised round-t batch as a stack of one: x (1, b, …), y (1, b)."""
    idx = run.secret_index(t, agent)
    return run.ctx.train_x[idx][None], run.ctx.train_y[idx][None]


def batch_grad(
    run: Run, at: torch.Tensor, agent: int, t: int, clip: float | None = None
) -> torch.Tensor:
    """Batch-mean gradient of ``agent``'s round-t batch at the flat model ``at`` (taken in
    float32), each example's gradient clipped to norm ``clip`` first when one is given."""
    x, y = secret_batch(run, agent, t)
    return run.ctx.grads.clipped_mean(at[None].float(), x, y, clip)[0]


def assert_states_match(got: dict, want: dict, rtol: float, atol: float) -> None:
    """Every tensor of the checkpoint ``want`` in ``got``: generator states (``rng.*``) bit for
    bit, the rest to ``rtol``/``atol``."""
    for k in want:
        if k.startswith("rng."):
            assert torch.equal(got[k], want[k]), k
        else:
            torch.testing.assert_close(got[k], want[k], rtol=rtol, atol=atol)


@pytest.fixture
def one_thread():
    """Torch on one thread for the test (small problems: threads cost more than they give)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """The CLI in this process: its exit code, standard output and standard error."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def registries(monkeypatch):
    """Every registry as it was before the test, and after it (what its plugins registered
    is gone, so a file loads afresh); no PRIVAUDIT_PLUGINS of the environment running the
    tests leaks in. Yields the reset, for a test that reloads a plugin midway."""
    monkeypatch.delenv(PLUGIN_ENV, raising=False)
    held = (DEFENSES, ATTACKS, THREATS, ACCOUNTANTS, MEMBERSHIP_ATTACKS, DECLARED)
    saved = [(r, dict(r)) for r in held]

    def reset() -> None:
        for registry, items in saved:
            registry.clear()
            registry.update(items)

    yield reset
    reset()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test :data:`tiers.SLOW` names, by file or by file and function."""
    for item in items:
        name = getattr(item, "originalname", item.name)
        if item.path.name in SLOW or f"{item.path.name}::{name}" in SLOW:
            item.add_marker(pytest.mark.slow)
