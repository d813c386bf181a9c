"""The memory-lean round (issue 34) sends exactly what the straightforward one sent, and its
peak memory grows less with the agents.

The simulator's broadcasts (``model``, ``half-model``, ``mm``) are recorded once per sender
and mixed link by link (:class:`~privaudit.core.network.SimNetwork`), the cross-gradient
defenses noise the out-edge pairs in place with one data owner's draws at a time and DPDL
aggregates in-edge by in-edge. The reference here is the round as it was written before:
:class:`PlainNetwork` (the base :class:`~privaudit.core.network.Network`'s broadcast, gossip
and exchange: one (links, D) copy per broadcast) and :func:`plain_dpdl_round`, the DPDL round
over whole tensors (``ctx.gaussian`` draws all pairs' noise at once). Every message of a few
rounds must agree (bit for bit where the float operations are the same; the per-row
calibration's reductions may round differently, well under 1e-6).
"""

from __future__ import annotations

import json
import subprocess
import sys

import conftest
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from privaudit.core.context import Consumed
from privaudit.core.messages import CaptureSpec, Tap
from privaudit.core.network import Network, SimNetwork
from privaudit.defenses.base import CrossGradientDefense
from privaudit.scenario.topology import build_topology, metropolis_hastings
from privaudit.sim.run import Run

ROUNDS = 3


class PlainNetwork(Network):
    """The simulator's network as it was: every broadcast materialised per link."""

    def __init__(self, adj: Tensor, W: Tensor, tap: Tap):
        super().__init__(adj, W, None, tap, device=W.device)

    def _transfer(self, kind: str, per_out_edge: Tensor, links) -> Tensor:
        self.tap.record(self.round, kind, list(links.edges), per_out_edge)
        return per_out_edge


def plain_dpdl_round(ctx, p, state, net: Network, batch) -> dict[str, Tensor]:
    """DPDL's round (defenses/dpdl.py, eqs. 8–22) over whole tensors, as first written."""
    x, v = state["x"], state["v"]
    n, k = ctx.n, x.shape[0]
    xs, ys = batch
    received = net.broadcast("model", x)
    models = torch.cat([x, net.on_reverse(received)])
    owner = torch.cat([torch.arange(k), net.links.out_src])
    clean = ctx.grads.clipped_mean(models, xs, ys, p.clip, owner)
    noisy = clean
    if p.sigma > 0:
        noise = ctx.gaussian(owner, clean.shape[1])
        noisy = torch.add(clean, noise, alpha=p.sigma * p.clip / ctx.batch_size)
    cg = net.send("cg", noisy[k:])
    self_clean, self_noisy = clean[:k], noisy[:k]
    w_in, w_self = net.w_in.to(x.dtype), net.w_self.to(x.dtype)
    deg = net.in_degree.to(x.dtype) + 1

    def cal(a: Tensor, b: Tensor) -> Tensor:
        return torch.sigmoid(-F.cosine_similarity(a, b, dim=-1))

    def coef(w: Tensor, d: Tensor) -> Tensor:
        assert p.cross_coef == "sqrt"
        return 1.0 / (torch.sqrt(w) * n)

    c_in = cal(cg, net.at_receiver(self_clean))
    c_self = cal(self_noisy, self_clean)
    coef_in, coef_self = coef(w_in, net.at_receiver(deg)), coef(w_self, deg)
    g = coef_self[:, None] * self_noisy + net.sum_incoming(coef_in[:, None] * cg)
    calib = w_self * c_self + net.sum_incoming(w_in * c_in)
    g = g + p.calib_alpha * calib[:, None] * self_clean
    v_half = p.momentum * v + g
    x_half = x - p.lr * v_half
    return {"x": net.gossip("half-model", x_half), "v": net.gossip("mm", v_half)}


def plain_dpdpsgd_round(ctx, p, state, net: Network, batch) -> dict[str, Tensor]:
    """D-PSGD with per-example clipping and noise (defenses/dp_dpsgd.py), as first written."""
    x = state["x"]
    g = ctx.grads.clipped_mean(x, *batch, p.clip)
    if p.sigma > 0:
        g = g + ctx.gaussian(None, g.shape[1]) * (p.sigma * p.clip / ctx.batch_size)
    return {"x": net.gossip("half-model", x - p.lr * g)}


def reference_messages(run: Run, round_fn) -> dict:
    """Every message of rounds 1..ROUNDS of ``run``'s configuration, by ``round_fn`` over a
    :class:`PlainNetwork`, from the same seeds (the run's own loop restores and samples)."""
    loop, ctx = run.loop, run.ctx
    tap = Tap(CaptureSpec.of(rounds=range(1, ROUNDS + 1)))
    net = PlainNetwork(ctx.adj, ctx.W, tap)
    state = loop.restore(0)
    for t in range(1, ROUNDS + 1):
        net.round = t
        _, batch = loop.sample()
        state = round_fn(ctx, run.params, state, net, batch)
    return {key: m.payload for key, m in tap.messages.items()}


@pytest.mark.parametrize(
    ("defense", "round_fn", "kinds"),
    [
        ("dpdl", plain_dpdl_round, {"model", "cg", "mm", "half-model"}),
        ("nd", plain_dpdl_round, {"model", "cg", "mm", "half-model"}),
        ("dp-dpsgd", plain_dpdpsgd_round, {"half-model"}),
    ],
)
def test_every_message_equals_the_plain_round(tmp_path, one_thread, defense, round_fn, kinds):
    cfg = conftest.tiny(defense, rounds=ROUNDS, agents=5, batch_size=4, sigma=0.7)
    if defense == "nd":
        cfg = conftest.tiny(defense, rounds=ROUNDS, agents=5, batch_size=4, epsilon=None)
    run = Run.create(cfg, tmp_path / "run")
    got = run.messages(CaptureSpec.of(rounds=range(1, ROUNDS + 1)), progress=False)
    want = reference_messages(run, round_fn)
    assert set(got) == set(want)
    assert {k[3] for k in got} == kinds
    assert len(got) == ROUNDS * len(run.edges()) * len(kinds)
    differ = 0
    for key, w in want.items():
        g = got[key]
        assert g.dtype == w.dtype and g.shape == w.shape, key
        if not torch.equal(g, w):
            differ += 1
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7, msg=str(key))
    # round 1's models and cross-gradients come before any reordered reduction: bit for bit
    for key, w in want.items():
        if key[0] == 1 and key[3] in ("model", "cg"):
            assert torch.equal(got[key], w), key


@pytest.mark.parametrize("receivers", [1, 2])
@pytest.mark.parametrize(("defense", "kinds"), [("dpdl", 4), ("dp-cga", 3), ("pdsl", 4)])
def test_messages_do_not_depend_on_the_receiver_chunks(
    tmp_path, one_thread, monkeypatch, receivers, defense, kinds
):
    """The cross-gradient rounds in chunks of receivers (what a small --max-memory gives)
    send the messages of the round in one chunk: the same pairs and the same noise (each
    owner's draws are one call whenever its first pair comes, and PDSL's permutations come
    after them from the same agent's generator), up to the float rounding of the gradient
    engine's grouping of pairs; round 1's models, before any gradient, bit for bit."""
    cfg = conftest.tiny(defense, rounds=ROUNDS, agents=5, batch_size=4, sigma=0.7)
    spec = CaptureSpec.of(rounds=range(1, ROUNDS + 1))
    whole = Run.create(cfg, tmp_path / "whole").messages(spec, progress=False)
    monkeypatch.setattr(CrossGradientDefense, "receivers_per_chunk", lambda *a: receivers)
    chunked = Run.create(cfg, tmp_path / "chunked").messages(spec, progress=False)
    assert set(chunked) == set(whole) and len(whole) == ROUNDS * 10 * kinds
    for key, w in whole.items():
        if key[0] == 1 and key[3] == "model":
            assert torch.equal(chunked[key], w), key
        torch.testing.assert_close(chunked[key], w, rtol=1e-5, atol=1e-6, msg=str(key))


def test_a_small_budget_chunks_the_receivers(tmp_path):
    """The chunk follows the budget: all receivers without one, one per chunk at a budget of
    one receiver's rows (2(d + 1) + 3 of them, d = 2 on a ring)."""
    cfg = conftest.tiny("dpdl", rounds=1, agents=6, batch_size=4, sigma=0.7)
    run = Run.create(cfg, tmp_path / "run")
    x = run.ctx.x0.expand(6, -1)
    net = SimNetwork(run.ctx.adj, run.ctx.W)
    run.ctx.grads.max_memory = 10**12
    assert run.defense.receivers_per_chunk(run.ctx, net, x) == 6
    run.ctx.grads.max_memory = 2 * 9 * x.shape[1] * 4
    assert run.defense.receivers_per_chunk(run.ctx, net, x) == 1
    # DP-CGA's QP holds 4d + 4 more rows per receiver (float64 copies): 21 on a ring
    cga = Run.create(conftest.tiny("dp-cga", rounds=1, agents=6), tmp_path / "cga")
    cga.ctx.grads.max_memory = 2 * 21 * 3 * x.shape[1] * 4
    assert cga.defense.receivers_per_chunk(cga.ctx, net, x) == 3
    assert run.defense.receivers_per_chunk(cga.ctx, net, x) == 6


@pytest.mark.parametrize(
    ("defense", "receivers"),
    [
        ("dpdl", None),
        ("dpdl", 1),
        ("dpdl", 2),
        ("dp-cga", None),
        ("dp-cga", 1),
        ("pdsl", None),
        ("pdsl", 2),
    ],
)
def test_a_consumed_state_is_overwritten_with_the_same_next_state(
    tmp_path, monkeypatch, defense, receivers
):
    """Handed its state Consumed (as the simulator does), a cross-gradient round writes the
    next state into the state's own tensors — no second copy — and that state is the one the
    round returns for an untouched state, bit for bit; the untouched state is left as it was.
    Every row is read (as a receiver's model) before it is overwritten, in any chunking."""
    if receivers is not None:  # the round in chunks of receivers
        monkeypatch.setattr(CrossGradientDefense, "receivers_per_chunk", lambda *a: receivers)
    run = Run.create(conftest.tiny(defense, rounds=2, agents=5, sigma=0.7), tmp_path / "run")
    loop, ctx = run.loop, run.ctx

    def second_round(state_of):
        state = loop.restore(0)
        _, batch = loop.sample()
        state = run.defense.round(ctx, run.params, state, SimNetwork(ctx.adj, ctx.W), batch)
        _, batch = loop.sample()
        handed = state_of({k: v.clone() for k, v in state.items()})
        kept = {k: v.clone() for k, v in handed.items()}
        out = run.defense.round(ctx, run.params, handed, SimNetwork(ctx.adj, ctx.W), batch)
        return handed, kept, out

    handed, kept, want = second_round(dict)
    assert all(torch.equal(handed[k], v) for k, v in kept.items())  # read only
    handed, kept, got = second_round(Consumed)
    assert set(got) == set(want)
    for k, v in want.items():
        assert torch.equal(got[k], v), k
    momentum = run.defense.momentum_key
    for k in ("x", momentum):
        assert got[k].data_ptr() == handed[k].data_ptr(), k  # written into
        assert not torch.equal(got[k], kept[k]), k


@pytest.mark.parametrize("topology", ["ring", "torus", "complete", "erdos-renyi", "star"])
def test_gossip_in_place_is_the_gossip(topology):
    """:meth:`SimNetwork.gossip_` overwrites the rows with exactly :meth:`Network.gossip`'s
    result (the same products and sums in the same order), and records the same messages."""
    adj = build_topology(topology, 9)
    W = metropolis_hastings(adj)
    rows = torch.randn(9, 33)
    plain = PlainNetwork(adj, W, Tap(CaptureSpec.of(rounds=[1])))
    lean = SimNetwork(adj, W, Tap(CaptureSpec.of(rounds=[1])))
    plain.round = lean.round = 1
    want = plain.gossip("mm", rows)
    got = lean.gossip_("mm", rows.clone())
    assert torch.equal(got, want)
    assert plain.tap.messages.keys() == lean.tap.messages.keys()
    for key, m in plain.tap.messages.items():
        assert torch.equal(lean.tap.messages[key].payload, m.payload)


def test_broadcast_is_recorded_once_per_sender():
    """A captured broadcast's links share their sender's one copy (equal to the row it
    sent); a ``send`` of per-link rows keeps one copy per link."""
    adj = build_topology("ring", 5)
    W = metropolis_hastings(adj)
    net = SimNetwork(adj, W, Tap(CaptureSpec.of(rounds=[1])))
    net.round = 1
    rows = torch.randn(5, 7)
    mixed = net.gossip("half-model", rows)
    want = PlainNetwork(adj, W, Tap()).gossip("half-model", rows)
    assert torch.equal(mixed, want)
    net.send("cg", torch.randn(len(net.edges), 7))
    got = net.tap.messages
    for src in range(5):
        sent = [m.payload for (t, s, d, k), m in got.items() if s == src and k == "half-model"]
        assert len(sent) == 2 and torch.equal(sent[0], rows[src])
        assert sent[0].untyped_storage().data_ptr() == sent[1].untyped_storage().data_ptr()
        cg = [m.payload for (t, s, d, k), m in got.items() if s == src and k == "cg"]
        assert cg[0].untyped_storage().data_ptr() != cg[1].untyped_storage().data_ptr()


CHILD = r"""
import json, sys, torch
from privaudit.core.config import RunConfig
from privaudit.sim.run import Run


def status(field):
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith(field + ":"))


torch.set_num_threads(1)
agents, out = int(sys.argv[1]), sys.argv[2]
budget = sys.argv[4] if sys.argv[4] != "-" else None
cfg = RunConfig(defense="dpdl", rounds=1, agents=agents, batch_size=2, topology="ring",
                model=sys.argv[3], sigma=0.7, checkpoint_every=1, dirichlet_alpha=1000.0,
                max_memory=budget)
run = Run.create(cfg, out)
run.restore(0)
with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM) to the RSS now
    f.write("5")
before = status("VmRSS")
run.train(progress=False)
print(json.dumps({"before": before, "peak": status("VmHWM"), "row": run.ctx.x0.numel() * 4}))
"""


def round_memory(tmp_path, agents: int, model: str, budget: str = "-") -> dict:
    """The peak RSS of one DPDL round of ``agents`` on a ring in a fresh process (``budget``:
    its --max-memory, "-" for none), and its RSS before the round (the kernel's high-water
    mark reset there)."""
    out = tmp_path / f"run{agents}-{budget}"
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(agents), str(out), model, budget],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rows_per_agent(tmp_path, budget: str) -> float:
    """What one DPDL round adds to the process, in model rows (D floats) per agent, from the
    difference between 8 and 40 agents on a ring (the CNN: 95k parameters, 379 kB a row)."""
    small = round_memory(tmp_path, 8, "cnn", budget)
    large = round_memory(tmp_path, 40, "cnn", budget)
    extra = (large["peak"] - large["before"]) - (small["peak"] - small["before"])
    return extra / large["row"] / 32


def test_round_memory_per_agent_is_bounded(tmp_path):
    """Without a budget the whole round is one chunk: the plain round measured 26 rows per
    agent (the pairs' models, gradients, noise and its per-owner parts, a noised copy, the
    per-link broadcasts, and this small model's stacked per-example gradients, 2 per pair),
    the lean one 14–17 — the pairs' 3 models and 3 gradients per agent beside x̃ and ṽ, and
    the engine's per-example rows. At a budget of a few receivers' rows (8 MB) the pairs come
    a chunk of receivers at a time and what grows with the agents is x̃ and ṽ, mixed in place,
    the checkpoint's serialised x and v, and freed rows the allocator keeps (measured 11, of
    which the round alone 5–6)."""
    whole = rows_per_agent(tmp_path, "-")
    assert whole < 19, f"{whole:.1f} rows per agent"
    chunked = rows_per_agent(tmp_path, "8M")
    assert chunked < min(13, whole - 3), f"{chunked:.1f} rows per agent at an 8 MB budget"
