"""Copies of a run (privaudit.sim.copies): the one way the audits and the reference runs
simulate a run again. A copy on the run's own seeds is the run, message for message; it
records the rounds, links and kinds asked for and no others; the same seeds give the same
messages and other seeds other ones; a round ended early returns no state."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import tiny

from privaudit.core.messages import CaptureSpec
from privaudit.sim.copies import Copy
from privaudit.sim.run import Run

ROUNDS = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    cfg = tiny("dpdl", rounds=ROUNDS, sigma=1.0, epsilon=None)
    return Run.create(cfg, tmp_path_factory.mktemp("copies") / "run")


def _simulate(copy: Copy) -> dict:
    """The copy from round 0 over every round: the state after the last, and the messages."""
    copy.tap.clear()
    state = copy.simulate(copy.restore(0), range(1, ROUNDS + 1))
    return {"state": state, "messages": copy.messages()}


def test_a_copy_on_the_runs_own_seeds_is_the_run(run):
    """Its final state is the trained run's, bit for bit, and it records exactly what it was
    asked: round 2's half-model messages of one link, which are the run's own."""
    trained = run.train(progress=False)
    asked = CaptureSpec.of(rounds=[2], links=[(0, 1)], kinds=["half-model"])
    got = _simulate(Copy.of(run.loop, asked))
    for k, v in trained.items():
        assert torch.equal(got["state"][k], v), k
    assert set(got["messages"]) == {(2, 0, 1, "half-model")}
    seen = run.messages(asked, progress=False)
    assert torch.equal(got["messages"][(2, 0, 1, "half-model")], seen[(2, 0, 1, "half-model")])


def test_the_same_seed_gives_the_same_messages_and_another_seed_others(run):
    everything = CaptureSpec.of()
    first = _simulate(Copy.of(run.loop, everything))
    again = _simulate(Copy.of(run.loop, everything))
    other = _simulate(Copy.of(dataclasses.replace(run.loop, seed=run.cfg.seed + 1), everything))
    assert {t for t, *_ in first["messages"]} == set(range(1, ROUNDS + 1))
    assert first["messages"].keys() == again["messages"].keys() == other["messages"].keys()
    for key, payload in first["messages"].items():
        assert torch.equal(payload, again["messages"][key]), key
    assert any(not torch.equal(p, other["messages"][k]) for k, p in first["messages"].items())


def test_fixed_batches_and_hooks_run_round_by_round_and_a_round_can_end_early(run):
    """``batches`` gives each round's batch and ``before``/``after`` run around each round in
    order; with ``stop_after`` the last round ends once those messages crossed: no state,
    and none of its other messages."""
    copy = Copy.of(run.loop, CaptureSpec.of(rounds=[2]))
    state = copy.restore(0)
    fixed = {t: copy.loop.sample()[1] for t in (1, 2)}
    calls = []
    copy.simulate(
        dict(state),
        [1, 2],
        batches=fixed.__getitem__,
        before=lambda t, batch: calls.append(("before", t, batch is fixed[t])),
        after=lambda t, step: calls.append(("after", t, step.ended_early)),
    )
    assert calls == [
        ("before", 1, True),
        ("after", 1, False),
        ("before", 2, True),
        ("after", 2, False),
    ]
    whole = {(s, d, k) for (_, s, d, k) in copy.messages()}
    watched = {m for m in whole if m[2] == min(k for *_, k in whole)}
    copy.tap.clear()
    end = copy.simulate(dict(state), [1, 2], batches=fixed.__getitem__, stop_after=watched)
    cut = {(s, d, k) for (_, s, d, k) in copy.messages()}
    assert end is None and watched <= cut < whole
