"""The communication layer a defense talks to (DESIGN.md, "One defense, two engines").

A defense never moves tensors between agents itself: it calls ``send`` (a different tensor
per directed link), ``broadcast`` (one tensor per agent, to every neighbour) or ``gossip``
(broadcast, then mix with W). The tap sits here, so every message is recorded where it
crosses a link. :class:`SimNetwork` holds all N agents stacked; a distributed Network would
implement the same three calls with torch.distributed point-to-point operations.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .messages import Tap


class SimNetwork:
    """In-process network over stacked agent tensors.

    ``edges`` are the directed links ``(src, dst)``, ``src ≠ dst``, in a fixed order; a
    per-link tensor has one row per edge in that order.
    """

    def __init__(self, adj: Tensor, W: Tensor, tap: Tap | None = None):
        self.n = adj.shape[0]
        self.W = W
        self.edges: list[tuple[int, int]] = [
            (i, j) for i in range(self.n) for j in range(self.n) if i != j and bool(adj[i, j])
        ]
        self.src = torch.tensor([s for s, _ in self.edges], dtype=torch.long)
        self.dst = torch.tensor([d for _, d in self.edges], dtype=torch.long)
        index = {e: k for k, e in enumerate(self.edges)}
        self.reverse = torch.tensor([index[(d, s)] for s, d in self.edges], dtype=torch.long)
        self.tap = tap if tap is not None else Tap()
        self.round = 0

    def to(self, device: torch.device | str) -> SimNetwork:
        self.W = self.W.to(device)
        self.src, self.dst, self.reverse = (
            t.to(device) for t in (self.src, self.dst, self.reverse)
        )
        return self

    def send(
        self, kind: str, per_edge: Tensor, edges: list[tuple[int, int]] | None = None
    ) -> Tensor:
        """Row ``e`` goes from ``src[e]`` to ``dst[e]``; returns what each receiver gets.

        ``edges`` overrides the graph's links for this call (time-varying or directed
        graphs, e.g. one push-sum peer per round); rows then follow ``edges``."""
        self.tap.record(self.round, kind, self.edges if edges is None else edges, per_edge)
        return per_edge

    def broadcast(self, kind: str, per_agent: Tensor) -> Tensor:
        """Agent ``i`` sends ``per_agent[i]`` to each neighbour; returns the per-edge rows."""
        per_edge = per_agent[self.src]
        return self.send(kind, per_edge)

    def gossip(self, kind: str, per_agent: Tensor) -> Tensor:
        """Broadcast, then ``x_i ← Σ_j w_ij x_j`` (the self term needs no link)."""
        received = self.broadcast(kind, per_agent)
        w = self.W[self.dst, self.src].to(per_agent.dtype).unsqueeze(-1)
        out = torch.diagonal(self.W).to(per_agent.dtype).unsqueeze(-1) * per_agent
        return out.index_add(0, self.dst, w * received)

    def sum_incoming(self, per_edge: Tensor, dst: Tensor | None = None) -> Tensor:
        """``out[i] = Σ_{e: dst[e]=i} per_edge[e]`` (``dst`` for explicit ``edges``)."""
        out = per_edge.new_zeros((self.n, *per_edge.shape[1:]))
        return out.index_add(0, self.dst if dst is None else dst, per_edge)
