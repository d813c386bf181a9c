"""The one round loop (privaudit.sim.loop): what the simulator, the ranks and the audits step."""

from __future__ import annotations

import torch
from conftest import tiny

from privaudit.core.messages import CaptureSpec, Tap
from privaudit.core.network import SimNetwork
from privaudit.experiments.audit import CanaryGrads
from privaudit.sim.run import Run


def _net(run: Run) -> SimNetwork:
    return SimNetwork(run.ctx.adj, run.ctx.W, Tap(CaptureSpec.of())).to(run.ctx.device)


def test_stepping_the_loop_by_hand_reproduces_training(tmp_path):
    """restore(0) + sample + step, round by round, gives the checkpoint Run.train writes."""
    run = Run.create(tiny("dpdl", rounds=2, checkpoint_every=1, sigma=1.0, epsilon=None), tmp_path)
    trained = run.train(progress=False)
    loop = run.loop
    state = loop.restore(0)
    net = _net(run)
    for t in (1, 2):
        _, batch = loop.sample()
        step = loop.step(state, t, net, batch)
        assert not step.ended_early
        state = step.state
    for k, v in trained.items():
        assert torch.equal(state[k], v), k
    # restore(1) then one step lands on the same state too (generators restored with it)
    state = loop.restore(1)
    state = loop.step(state, 2, net, loop.sample()[1]).state
    assert torch.equal(state["x"], trained["x"])


def test_a_round_ends_once_the_watched_messages_have_crossed(tmp_path):
    run = Run.create(tiny("dpdl", rounds=1, sigma=1.0, epsilon=None), tmp_path)
    loop, net = run.loop, _net(run)
    state = loop.restore(0)
    _, batch = loop.sample()
    full = loop.step(dict(state), 1, net, batch)
    sent = {(s, d, k) for (_, s, d, k) in net.tap.messages}
    kinds = {k for *_, k in sent}
    assert len(kinds) > 1  # the round sends more than one kind
    first = next(iter(sorted(sent)))
    watched = {m for m in sent if m[2] == first[2]}
    net.tap.clear()
    loop.restore(0)
    early = loop.step(dict(state), 1, net, loop.sample()[1], stop_after=watched)
    assert early.ended_early and early.state is None and full.state is not None
    got = {(s, d, k) for (_, s, d, k) in net.tap.messages}
    assert watched <= got and got < sent  # the rest of the round did not run
    assert net.after_send is None  # the hook is removed with the round


class _Counting:
    """A gradient engine that counts its evaluations."""

    def __init__(self) -> None:
        self.calls = 0

    def mean(self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return flat * 2

    def denominator(self, x: torch.Tensor) -> int:
        return 1


def test_canary_grads_replay_only_equal_inputs():
    """A trial's call is replayed only when its inputs equal the first trial's element for
    element: inputs that differ in one coordinate (which a sampled checksum of every 97th
    float would not see) are evaluated again."""
    inner = _Counting()
    x, y = torch.zeros(2, 1, 2, 2), torch.zeros(2, 1, dtype=torch.long)
    grads = CanaryGrads(inner, victim_x=torch.ones(1, 2, 2))
    flat = torch.zeros(2, 300)
    grads.start(None)
    first = grads.mean(flat, x, y)
    grads.start(None)
    assert torch.equal(grads.mean(flat.clone(), x.clone(), y), first)  # equal inputs: replay
    assert inner.calls == 1
    moved = flat.clone()
    moved[0, 1] = 1.0  # not on the every-97th grid
    grads.start(None)
    assert grads.mean(moved, x, y)[0, 1] == 2.0
    assert inner.calls == 2
