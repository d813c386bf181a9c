"""Poisson sampling of the agents' batches, and the padded layout the engines compute on.

Each round, every example of agent i's training shard (n_i examples) joins the agent's batch
independently with probability q_i = B/n_i, B the configured batch size: the sampling of
opacus' ``DPDataLoader``, which the privacy accountant assumes (add/remove adjacency). The
realised size b_i ~ Binomial(n_i, q_i) varies from round to round, with mean B.

Full batches (``--sampling full``: B = n_i, q_i = 1) are the same draw at q = 1: every
example of the shard in every round, the batch mean its full gradient (D-GD, El Mrini,
Cyffers & Bellet, ICML 2024), and the accountant charges each round the Gaussian mechanism
itself — no amplification by subsampling. The uniforms are drawn all the same, so an
agent's generator (and the noise it draws next) is the one a Poisson run at q = 1 has.

The held agents' batches of one round are one padded index tensor ``index`` (n_held, W),
W = max(max_r b_r, 1):

- ``index[r, :b_r]`` are held agent r's examples (indices into the training set, in shard
  order) and ``index[r, b_r:]`` are :data:`PAD`;
- :func:`gather` gives the inputs (zero in padded slots) and labels (:data:`IGNORE` in padded
  slots: cross-entropy's ``ignore_index``), so a padded slot's loss and every gradient of it
  are exactly 0 (:class:`privaudit.grads.PairGrads` sums losses, never averages them);
- every mean over a batch is normalised by the expected size B, not by W or b_r (opacus'
  fixed denominator of Poisson DP-SGD): a clipped mean is (1/B) Σ_{b real} clip_C(g_b), and a
  batch without examples gives 0 (the defense's noise alone).

A run's secrets record the realised batches (:func:`secrets`, :func:`secret_index`).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

PAD = -1  # the index of a padded slot
IGNORE = -100  # the label of a padded slot (``F.cross_entropy``'s default ignore_index)


def rate(batch_size: int, shard_size: int) -> float:
    """The sampling rate q = min(1, B/n) of an agent with ``shard_size`` training examples:
    exactly 1.0 for a full batch (B = n), which the accountant then charges unamplified."""
    return min(1.0, batch_size / max(shard_size, 1))


def poisson(part: Tensor, q: float, generator: torch.Generator) -> Tensor:
    """One Poisson batch of the shard ``part`` (indices): each kept with probability ``q``,
    by one uniform per example from ``generator`` (on the generator's device), so an agent's
    draw depends on its generator alone. Indices in shard order; at q ≥ 1 the whole shard
    (a full batch), its uniforms still drawn."""
    u = torch.rand(len(part), generator=generator, device=generator.device)
    if q >= 1:  # a full batch: the whole shard (u < 1 always; drawn to keep the stream)
        return part
    return part[(u < q).to(part.device)]


def pad(batches: list[Tensor]) -> Tensor:
    """Batches of different sizes as one ``(len(batches), W)`` index tensor, W the largest
    size (at least 1), :data:`PAD` after each batch's own indices."""
    if not batches:
        raise ValueError("pad needs at least one batch")
    out = pad_sequence(batches, batch_first=True, padding_value=PAD)
    return out if out.shape[1] else out.new_full((len(batches), 1), PAD)


def real(index: Tensor) -> Tensor:
    """Which slots of a padded ``index`` hold an example (bool, same shape)."""
    return index != PAD


def sizes(index: Tensor) -> Tensor:
    """The realised batch size of each row of a padded ``index`` (long)."""
    return real(index).sum(-1)


def gather(index: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Inputs and labels of a padded ``index`` (any shape) from the training set ``x``,
    ``y``: zero inputs and :data:`IGNORE` labels in padded slots."""
    mask = real(index)
    at = index.clamp(min=0)
    xs = x[at].masked_fill_(~mask.view(*mask.shape, *[1] * (x.dim() - 1)), 0)
    return xs, y[at].masked_fill_(~mask, IGNORE)


def secrets(index: Tensor, y: Tensor) -> dict[str, Tensor]:
    """What a run records of a round's batches (its secrets): every held agent's real
    indices and labels, concatenated in agent order (``index``, ``labels``), and each
    agent's realised size (``sizes``). Shards of several processes concatenate key by key."""
    mask = real(index)
    return {"index": index[mask], "labels": y[index[mask]], "sizes": mask.sum(1)}


def secret_index(recorded: dict[str, Tensor], row: int) -> tuple[Tensor, Tensor]:
    """Row ``row``'s real indices and labels from :func:`secrets`' record."""
    if "sizes" not in recorded:
        raise KeyError("no 'sizes' in the record: not written by privaudit.core.sampling.secrets")
    n = recorded["sizes"].long()
    start = int(n[:row].sum())
    part = slice(start, start + int(n[row]))
    return recorded["index"][part].long(), recorded["labels"][part].long()
