"""Poisson sampling (privaudit.core.sampling): what a run draws is what the accountant assumes
(each example of agent i's shard independently at q_i = B/n_i), every engine's batch means
ignore padded slots and divide by the expected size B, and the secrets hold exactly the
realised batches."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import tiny
from scipy import stats
from torch import nn

from privaudit.core import sampling
from privaudit.core.messages import CaptureSpec
from privaudit.core.params import ParamSpec, flat_params
from privaudit.experiments.audit import CanaryGrads, audit_batch
from privaudit.experiments.canary_grads import Diracs
from privaudit.grads import PairGrads
from privaudit.scenario.models import build_model
from privaudit.sim.run import Run


def test_poisson_batch_sizes_are_binomial_and_every_example_has_rate_q():
    n, B, draws = 60, 8, 4000
    q = sampling.rate(B, n)
    part = torch.arange(1000, 1000 + n)
    gen = torch.Generator().manual_seed(0)
    sizes, hits = np.zeros(draws, dtype=int), torch.zeros(n)
    for k in range(draws):
        b = sampling.poisson(part, q, gen)
        assert torch.equal(b, b.unique())  # distinct, in shard order
        sizes[k] = len(b)
        hits[b - 1000] += 1
    mean, var = n * q, n * q * (1 - q)
    assert abs(sizes.mean() - mean) < 4 * math.sqrt(var / draws)
    assert abs(sizes.var(ddof=1) / var - 1) < 4 * math.sqrt(2 / (draws - 1))
    # χ² goodness of fit to Binomial(n, q), the tails merged so every bin expects ≥ 5
    ks = np.arange(n + 1)
    expected = stats.binom.pmf(ks, n, q) * draws
    lo = int(ks[np.cumsum(expected) >= 5][0])
    hi = int(ks[np.cumsum(expected[::-1])[::-1] >= 5][-1])
    obs = [(sizes <= lo).sum(), *[(sizes == k).sum() for k in range(lo + 1, hi)]]
    obs.append((sizes >= hi).sum())
    tails = stats.binom.cdf(lo, n, q) * draws, stats.binom.sf(hi - 1, n, q) * draws
    exp = np.asarray([tails[0], *expected[lo + 1 : hi], tails[1]])
    exp *= draws / exp.sum()  # sums to draws up to float rounding
    assert hi - lo >= 8
    assert stats.chisquare(obs, exp).pvalue > 1e-3
    # each example on its own: Bernoulli(q) per draw
    se = math.sqrt(q * (1 - q) / draws)
    assert float((hits / draws - q).abs().max()) < 5 * se
    assert sampling.rate(B, 5) == 1.0  # a shard smaller than B: every example, every round


def _run(tmp_path, name: str = "r", **kw) -> Run:
    return Run.create(tiny("dsgd", checkpoint_every=10, **kw), tmp_path / name)


def test_context_sample_pads_each_agents_own_poisson_batch(tmp_path):
    ctx = _run(tmp_path).ctx
    seen = set()
    for _ in range(20):
        idx = ctx.sample()
        n = sampling.sizes(idx)
        seen.update(n.tolist())
        assert idx.shape == (4, max(1, int(n.max())))
        for r, part in enumerate(ctx.parts):
            assert (idx[r, n[r] :] == sampling.PAD).all()
            assert set(idx[r, : n[r]].tolist()) <= set(part.tolist())
        x, y = ctx.gather(idx)
        real = sampling.real(idx)
        assert (y[~real] == sampling.IGNORE).all() and (x[~real] == 0).all()
        assert torch.equal(y[real], ctx.train_y[idx[real]])
        assert torch.equal(x[real], ctx.train_x[idx[real]])
    assert len(seen) > 2  # realised sizes vary, not a fixed B


def test_secrets_hold_the_realised_batches_an_agent_alone_draws(tmp_path):
    """A dsgd run (no noise: the generators draw batches only) records in its secrets, per
    round and agent, exactly the batch a context holding that agent alone draws — so an
    agent's draws do not depend on which other agents share the process."""
    run = _run(tmp_path, batch_size=3)
    run.messages(CaptureSpec.of(rounds=[1, 2, 3]), progress=False)
    for agent in range(4):
        alone = Run.open(tmp_path / "r", agents=[agent]).ctx
        assert alone.n_held == 1
        for t in (1, 2, 3):
            idx = alone.sample()
            assert idx.shape[0] == 1
            mine = idx[0][sampling.real(idx[0])]
            assert torch.equal(run.secret_index(t, agent), mine)
            x, y = run.secret_batch(t, agent)
            assert len(x) == len(y) == len(mine) == run.batch_sizes(t)[agent]
            assert torch.equal(y, run.data.train_y[mine])
    assert any(run.batch_sizes(t) != [3] * 4 for t in (1, 2, 3))


def _example_grad(name: str, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    m = build_model(name, tuple(x.shape), 10)
    nn.utils.vector_to_parameters(flat, m.parameters())
    loss = nn.functional.cross_entropy(m(x[None]), y[None])
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(m.parameters()))])


@pytest.mark.parametrize("engine", ["stacked", "vmap"])
@pytest.mark.parametrize("name", ["lenet", "cnn"])
def test_padded_means_sum_the_real_examples_over_the_expected_size(name, engine):
    """Batches of 3, 0, 6 and 1 examples (W = 6, B = 4), with 2 pairs per batch (DPDL's
    shared batches): the clipped mean is (1/B) Σ over real examples of clip_C(g_b) — a loop
    over the real examples with autograd — on the stacked engine and on the vmap fallback;
    the plain mean likewise; the empty batch gives exactly 0."""
    shape, B, clip = (3, 32, 32), 4, 0.05
    model = build_model(name, shape, 10)
    grads = PairGrads(model, ParamSpec.of(model), batch_size=B)
    if engine == "vmap":
        grads._stacked = None
    gen = torch.Generator().manual_seed(0)
    data_x = torch.rand(20, *shape, generator=gen)
    data_y = torch.randint(0, 10, (20,), generator=gen)
    batches = [torch.arange(0, 3), torch.arange(3, 3), torch.arange(3, 9), torch.arange(9, 10)]
    index = sampling.pad(batches)
    assert index.shape == (4, 6)
    x, y = sampling.gather(index, data_x, data_y)
    owner = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    flat = flat_params(model).repeat(8, 1)
    flat = flat + 0.05 * torch.randn(flat.shape, generator=gen)
    got = grads.clipped_mean(flat, x, y, clip, owner)
    if engine == "stacked":
        assert grads._stacked.checked == {(*shape, 2): True}  # it did run
    plain = grads.mean(flat, x[owner], y[owner])
    for p, o in enumerate(owner.tolist()):
        gs = [_example_grad(name, flat[p], data_x[i], data_y[i]) for i in batches[o].tolist()]
        clipped = [g * min(1.0, clip / (float(g.norm()) + 1e-12)) for g in gs]
        want = sum(clipped, torch.zeros_like(flat[p])) / B
        want_plain = sum(gs, torch.zeros_like(flat[p])) / B
        scale = float(want_plain.abs().max()) + 1e-30
        torch.testing.assert_close(got[p], want, rtol=1e-4, atol=1e-5 * clip / B)
        torch.testing.assert_close(plain[p], want_plain, rtol=1e-4, atol=1e-5 * scale)
    assert torch.equal(got[owner == 1], torch.zeros_like(got[owner == 1]))
    assert torch.equal(plain[owner == 1], torch.zeros_like(plain[owner == 1]))
    per = grads.per_example(flat[:4], x, y)
    assert per.shape == (4, 6, flat.shape[1])
    assert not per[~sampling.real(index)].any()  # padded slots: exactly 0


def test_a_batch_without_slots_gives_zero():
    model = build_model("lenet", (3, 16, 16), 10)
    grads = PairGrads(model, ParamSpec.of(model), batch_size=4)
    flat = flat_params(model)[None]
    x, y = torch.zeros(1, 0, 3, 16, 16), torch.zeros(1, 0, dtype=torch.long)
    for out in (grads.mean(flat, x, y), grads.clipped_mean(flat, x, y, 1.0)):
        assert torch.equal(out, torch.zeros_like(flat))
    assert grads.per_example(flat, x, y).shape == (1, 0, flat.shape[1])


def test_the_audits_canary_reaches_the_victims_batch_alone_even_when_empty(tmp_path):
    """Two empty batches in one round: the audit's batches still tell them apart, so the
    canary (normalised by the expected B, not the padded width) joins the victim's only."""
    run = _run(tmp_path, batch_size=3)
    ctx = run.ctx
    index = sampling.pad([ctx.parts[0][:0], ctx.parts[1][:5], ctx.parts[2][:0], ctx.parts[3][:1]])
    x, y = audit_batch(ctx, index)
    same, _ = ctx.gather(index)
    assert torch.equal(x[sampling.real(index)], same[sampling.real(index)])
    flat = ctx.x0.expand(4, -1).contiguous()
    clean = ctx.grads.clipped_mean(flat, x, y, 1.0)
    torch.testing.assert_close(clean, ctx.grads.clipped_mean(flat, same, y, 1.0))
    canary = torch.zeros(1, flat.shape[1])
    canary[0, 7] = 5.0
    grads = CanaryGrads(ctx.grads, x[2])
    grads.start(canary)
    out = grads.clipped_mean(flat, x, y, 1.0)
    moved = (out - clean).abs().sum(1)
    assert moved.nonzero().flatten().tolist() == [2]
    assert float(out[2, 7] - clean[2, 7]) == pytest.approx(1.0 / 3)  # clip_C(c)/B, C = 1


@pytest.mark.parametrize("norm", [0.5, 4.0])
def test_sparse_dirac_canaries_add_exactly_what_their_dense_rows_add(tmp_path, norm):
    """The one-run audit's :class:`Diracs` (coordinates only) against the same canaries as
    dense (k, D) rows, through every path a defense takes: each clipped as one example
    (norm 4 > C = 1 is scaled down, 0.5 is not) and normalised by B, unclipped in ``mean``,
    summed into the first example in ``per_example`` — the victim's row only."""
    run = _run(tmp_path, batch_size=3)
    ctx = run.ctx
    x, y = audit_batch(ctx, sampling.pad([p[:3] for p in ctx.parts]))
    flat = ctx.x0.expand(len(x), -1).contiguous()
    D = flat.shape[1]
    coords = torch.tensor([3, 11, D - 1])
    dense = torch.zeros(len(coords), D)
    dense[torch.arange(len(coords)), coords] = norm
    sparse = CanaryGrads(ctx.grads, x[1], replay=False)
    rows = CanaryGrads(ctx.grads, x[1], replay=False)
    sparse.start(Diracs(coords, norm, D))
    rows.start(dense)
    for call in (
        lambda g: g.clipped_mean(flat, x, y, 1.0),
        lambda g: g.mean(flat, x, y),
        lambda g: g.per_example(flat, x, y),
    ):
        torch.testing.assert_close(call(sparse), call(rows), rtol=0, atol=1e-7)
    moved = sparse.clipped_mean(flat, x, y, 1.0) - ctx.grads.clipped_mean(flat, x, y, 1.0)
    assert moved.abs().sum(1).nonzero().flatten().tolist() == [1]
    assert float(moved[1, 11]) == pytest.approx(min(norm, 1.0) / 3, rel=1e-6)


@pytest.mark.parametrize("chunk_floats", [1 << 20, 1 << 14])
def test_stacked_engine_on_batches_of_many_sizes_matches_vmap(monkeypatch, chunk_floats):
    """12 batches of 0–11 examples, 3 pairs each: the stacked engine runs them in chunks of
    similar sizes (empty batches skipped, wide ones on their own; with a small
    ``CHUNK_FLOATS`` each run split further) and agrees with the padded vmap path."""
    from privaudit.grads import pairnet

    monkeypatch.setattr(pairnet, "CHUNK_FLOATS", chunk_floats)
    shape, B = (3, 16, 16), 4
    model = build_model("lenet", shape, 10)
    grads = PairGrads(model, ParamSpec.of(model), batch_size=B)
    gen = torch.Generator().manual_seed(1)
    sizes = [0, 11, 3, 0, 4, 0, 1, 9, 0, 2, 0, 5]
    starts = np.cumsum([0, *sizes])
    batches = [torch.arange(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    data_x = torch.rand(int(starts[-1]), *shape, generator=gen)
    data_y = torch.randint(0, 10, (int(starts[-1]),), generator=gen)
    x, y = sampling.gather(sampling.pad(batches), data_x, data_y)
    owner = torch.arange(12).repeat(3)
    flat = flat_params(model).repeat(36, 1)
    flat = flat + 0.05 * torch.randn(flat.shape, generator=gen)
    need = sorted(s for s in sizes for _ in range(3))
    got = grads.clipped_mean(flat, x, y, 0.05, owner)
    assert grads._stacked.checked == {(*shape, 3): True}
    chunks = pairnet.PairNet._chunks(need, 3, grads._stacked.example_floats[(*shape, 3)])
    assert len(chunks) > 2 and chunks[0][2] == 0  # the empty batches: a chunk of width 0
    assert [c[0] for c in chunks[1:]] == [c[1] for c in chunks[:-1]] and chunks[-1][1] == 36
    grads._stacked = None
    want = grads.clipped_mean(flat, x, y, 0.05, owner)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6 * 0.05)
    assert not got[owner.unsqueeze(1).eq(torch.tensor([0, 3, 5, 8, 10])).any(1)].any()
