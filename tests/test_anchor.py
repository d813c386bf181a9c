"""El Mrini, Cyffers & Bellet's D-GD attack (ICML 2024, §5): with one fixed example per agent
and full-batch steps, tying each non-member's gradient over the rounds
(``knowledge(..., tied=…)``, :func:`privaudit.attacks.gossip.tie`) lets one attacker at the
end of a line recover agents it never hears — to an error first order in the step size —
while the exact system never reaches past the neighbours; the approximation is refused where
batches are fresh Poisson draws."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny

from privaudit.api.gossip import observe_beyond
from privaudit.attacks import gossip
from privaudit.core.errors import PrivauditError
from privaudit.scenario.topology import build_topology, metropolis_hastings
from privaudit.sim.run import Run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from anchor import attack, dgd, linear_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def line() -> tuple[torch.Tensor, np.ndarray, torch.Tensor, torch.Tensor]:
    """A line 0 – 1 – 2 – 3 – 4 (Metropolis–Hastings W) and one 2×2×2 example per agent."""
    adj = build_topology("line", 5)
    g = torch.Generator().manual_seed(0)
    images = torch.rand(5, 2, 2, 2, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 0, 1])
    return adj, metropolis_hastings(adj).numpy(), images, labels


def tied_error(line, lr: float, victim: int = 3) -> float:
    """Relative error of the victim's recovered round-1 gradient, attacker 0, T = 5."""
    adj, W, images, labels = line
    model = linear_model((2, 2, 2), 3, seed=0)
    sent, grads = dgd(model, images, labels, W, lr, rounds=5)
    got = attack(sent, adj, W, lr, [0], "ours")
    g1 = grads[0, victim]
    return float(np.linalg.norm(got[victim] - g1) / np.linalg.norm(g1))


def test_tied_dgd_recovers_a_non_neighbour_and_its_error_grows_with_the_step(line):
    adj, W, _, _ = line
    errs = [tied_error(line, lr) for lr in (1e-6, 1e-4, 1e-2)]
    assert errs[0] < 1e-3  # agent 3 is three hops from the attacker
    assert errs[0] < errs[1] < errs[2]  # first order in η: the drift of the gradients
    assert errs[1] / errs[0] == pytest.approx(100, rel=0.5)
    # without the approximation the same messages never reach past the neighbour
    rec = gossip.dpsgd(W, 1e-6)
    rows = gossip.gossip_messages(adj, [0], range(1, 6), own=("x",))
    exact = gossip.knowledge(rec, [0], rows, rounds=5, known=lambda k: k[0] in rec.public)
    assert gossip.identifiability(exact).status(("g", 3, 1)) == "hidden"


def test_tied_system_aliases_every_round_and_agrees_with_the_exact_analysis(line):
    adj, W, _, _ = line
    rec = gossip.dpsgd(W, 0.1)
    rows = gossip.gossip_messages(adj, [0], range(1, 6), own=("x",))
    s = gossip.knowledge(
        rec, [0], rows, rounds=5, known=lambda k: k[0] in rec.public, tied=[1, 2, 3, 4]
    )
    assert s.index(("g", 4, 5)) == s.index(("g", 4, 1)) and s.role(("g", 0, 2)) == "unknown"
    assert s.index(("g", 0, 2)) != s.index(("g", 0, 1))  # the coalition's own stay per round
    fl, ex = gossip.identifiability(s), gossip.identifiability(s, method="exact")
    assert fl.rank == ex.rank == len(s.unknowns)
    assert fl.keys() == ex.keys()
    # a functional over several rounds' keys adds into the one tied column
    cu = s.functional({("g", 2, 1): 1.0, ("g", 2, 4): 2.0})[0]
    assert cu[s.index(("g", 2, 1))] == 3.0 and cu.sum() == 3.0


def test_tie_is_refused_under_fresh_poisson_batches(tmp_path):
    run = Run.create(tiny("dsgd", agents=5, topology="line", rounds=3), tmp_path / "run")
    with pytest.raises(PrivauditError, match=r"q = .* < 1.*--batch-size \d+ or more"):
        observe_beyond(run, "dsgd-half-model", 1, [0], [3], tie=True, progress=False)
