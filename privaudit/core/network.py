"""The communication layer a defense talks to, the same under both engines.

A defense never moves tensors between agents itself, and never indexes a global edge list.
It computes over the agents *this process holds* (rows of its stacked state: all N in the
simulator, one per rank under torch.distributed) and talks through this vocabulary:

- per-agent rows ``(k, ...)``: one row per held agent, in ascending agent order;
- per-out-edge rows: one per link whose *sender* is held (the messages this process sends);
- per-in-edge rows: one per link whose *receiver* is held (the messages it receives).

Both edge lists follow the run's global link order (sorted by (src, dst)), so a receiver
sums its incoming rows in the same order in every engine. In the simulator the out- and
in-edges are the same list, every link.

``send`` moves per-out-edge rows to per-in-edge rows, ``broadcast`` sends each held agent's
row to its neighbours, ``gossip`` broadcasts then mixes with W. ``from_sender`` /
``at_receiver`` lift per-agent rows onto edges, ``on_reverse`` reads, for each out-edge
i→j, what i received on j→i, ``sum_incoming`` / ``sum_outgoing`` reduce edges to agents,
``w_in`` / ``w_self`` are the mixing weights. Time-varying graphs pass ``edges=`` (the full
global list of this call's links, identical in every process). The tap sits in ``send``:
every message is recorded where it crosses a link, never by the algorithm.
:class:`SimNetwork` holds all N agents stacked; :class:`privaudit.sim.distributed.DistNetwork`
implements the same transfer with torch.distributed point-to-point operations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from privaudit.core.messages import Tap

Edges = Sequence[tuple[int, int]]


@dataclass(frozen=True)
class Links:
    """A list of directed links ``edges`` seen from a process holding some agents."""

    edges: tuple[tuple[int, int], ...]  # all links of the call, global order
    out_edges: tuple[tuple[int, int], ...]  # those whose sender is held, in ``edges`` order
    in_edges: tuple[tuple[int, int], ...]  # those whose receiver is held, in ``edges`` order
    out_src: Tensor  # per out-edge: local row of the sender
    out_dst: Tensor  # per out-edge: global id of the receiver
    in_src: Tensor  # per in-edge: global id of the sender
    in_dst: Tensor  # per in-edge: local row of the receiver
    in_dst_global: Tensor  # per in-edge: global id of the receiver
    reverse: Tensor | None  # per out-edge i→j: index of in-edge j→i (None if one is missing)


def make_links(edges: Edges, agents: Sequence[int], device: torch.device | str) -> Links:
    """The :class:`Links` of ``edges`` for a process holding ``agents`` (ascending)."""
    edges = tuple((int(s), int(d)) for s, d in edges)
    row = {a: r for r, a in enumerate(agents)}
    out = tuple(e for e in edges if e[0] in row)
    inn = tuple(e for e in edges if e[1] in row)
    where = {e: k for k, e in enumerate(inn)}
    rev = [where.get((d, s)) for s, d in out]

    def t(xs: list[int]) -> Tensor:
        return torch.tensor(xs, dtype=torch.long, device=device)

    return Links(
        edges=edges,
        out_edges=out,
        in_edges=inn,
        out_src=t([row[s] for s, _ in out]),
        out_dst=t([d for _, d in out]),
        in_src=t([s for s, _ in inn]),
        in_dst=t([row[d] for _, d in inn]),
        in_dst_global=t([d for _, d in inn]),
        reverse=None if any(r is None for r in rev) else t(rev),  # type: ignore[misc]
    )


class Network:
    """The shared vocabulary over the agents a process holds; subclasses move the rows."""

    def __init__(
        self,
        adj: Tensor,
        W: Tensor,
        agents: Sequence[int] | None = None,
        tap: Tap | None = None,
        device: torch.device | str = "cpu",
    ):
        self.n = int(adj.shape[0])
        self.agents = list(range(self.n)) if agents is None else sorted(int(a) for a in agents)
        self.device = torch.device(device)
        self.W = W.to(self.device)
        adj = adj.to("cpu")
        self.edges: list[tuple[int, int]] = [
            (i, j) for i in range(self.n) for j in range(self.n) if i != j and bool(adj[i, j])
        ]
        self.tap = tap if tap is not None else Tap()
        self.round = 0
        # called after every send (the round loop's early end of a round, privaudit.sim.loop)
        self.after_send: Callable[[], None] | None = None
        self._links: dict[tuple[tuple[int, int], ...], Links] = {}
        self.links = self.links_of(None)
        self.held = torch.tensor(self.agents, dtype=torch.long, device=self.device)

    def to(self, device: torch.device | str) -> Network:
        """The same network with its index tensors and W on ``device``."""
        self.device = torch.device(device)
        self.W = self.W.to(self.device)
        self.held = self.held.to(self.device)
        self._links.clear()
        del self.links
        self.links = self.links_of(None)
        return self

    def links_of(self, edges: Edges | None) -> Links:
        """The (cached) :class:`Links` of ``edges``, the run's graph when None."""
        if edges is None and hasattr(self, "links"):
            return self.links
        key = tuple(self.edges if edges is None else ((int(s), int(d)) for s, d in edges))
        if key not in self._links:
            self._links[key] = make_links(key, self.agents, self.device)
        return self._links[key]

    def tapped(self, link: tuple[int, int]) -> bool:
        """Whether this process's tap sees ``link`` (its receiver is held)."""
        return link[1] in self.agents

    # -- moving rows: the one engine-specific operation ----------------------------------
    def _transfer(self, kind: str, per_out_edge: Tensor, links: Links) -> Tensor:
        raise NotImplementedError

    def agree(self, stop: bool) -> bool:
        """Whether any process asks to stop (here: this one): called by every process at
        the same round boundary, so that all stop after the same round."""
        return stop

    def send(self, kind: str, per_out_edge: Tensor, edges: Edges | None = None) -> Tensor:
        """Row ``e`` goes from out-edge ``e``'s sender to its receiver; returns the rows
        received on the in-edges. ``edges`` overrides the graph's links for this call
        (time-varying or directed graphs, e.g. one push-sum peer per round)."""
        out = self._transfer(kind, per_out_edge, self.links_of(edges))
        if self.after_send is not None:
            self.after_send()
        return out

    def broadcast(self, kind: str, per_agent: Tensor) -> Tensor:
        """Held agent ``i`` sends ``per_agent[i]`` to each neighbour; returns per-in-edge rows."""
        return self.send(kind, self.from_sender(per_agent))

    def gossip(self, kind: str, per_agent: Tensor) -> Tensor:
        """Broadcast, then ``x_i ← w_ii x_i + Σ_j w_ij x_j`` (the self term needs no link)."""
        received = self.broadcast(kind, per_agent)
        w = self.w_in.to(per_agent.dtype).unsqueeze(-1)
        out = self.w_self.to(per_agent.dtype).unsqueeze(-1) * per_agent
        return out.index_add(0, self.links.in_dst, w * received)

    def gossip_(self, kind: str, per_agent: Tensor) -> Tensor:
        """:meth:`gossip` written into ``per_agent`` (returned)."""
        return per_agent.copy_(self.gossip(kind, per_agent))

    def exchange(self, kind: str, per_agent: Tensor) -> Tensor:
        """Broadcast ``per_agent`` (``kind`` messages), then the rows of the cross-gradient
        pairs: the held agents' own rows first, then per out-edge i→j the row i received on
        j→i (graph links only), ``(k + out-edges, ...)``."""
        return torch.cat([per_agent, self.on_reverse(self.broadcast(kind, per_agent))])

    def pair_models(self, kind: str, per_agent: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`exchange` as ``(rows, index)``: pair ``p``'s row is ``rows[index[p]]``, so a
        caller can gather the rows of a few pairs at a time."""
        rows = self.exchange(kind, per_agent)
        return rows, torch.arange(rows.shape[0], device=rows.device)

    @property
    def holds_all(self) -> bool:
        """Whether this process holds every agent (then out- and in-edges are every link, and
        a subset of links can be sent on its own without the other processes)."""
        return len(self.agents) == self.n

    # -- lifting and reducing -------------------------------------------------------------
    def from_sender(self, per_agent: Tensor, edges: Edges | None = None) -> Tensor:
        """Per-out-edge rows: each out-edge carries its sender's row of ``per_agent``."""
        return per_agent[self.links_of(edges).out_src]

    def at_receiver(self, per_agent: Tensor, edges: Edges | None = None) -> Tensor:
        """Per-in-edge rows: each in-edge gets its receiver's row of ``per_agent``."""
        return per_agent[self.links_of(edges).in_dst]

    def on_reverse(self, per_in_edge: Tensor) -> Tensor:
        """Per-out-edge rows: for out-edge i→j, what i received on j→i (graph links only)."""
        rev = self.links.reverse
        if rev is None:
            raise ValueError("on_reverse needs every link's reverse link in the graph")
        return per_in_edge[rev]

    def sum_incoming(self, per_in_edge: Tensor, edges: Edges | None = None) -> Tensor:
        """``out[i] = Σ_{in-edges e into i} per_in_edge[e]``, summed in global link order."""
        out = per_in_edge.new_zeros((len(self.agents), *per_in_edge.shape[1:]))
        return out.index_add(0, self.links_of(edges).in_dst, per_in_edge)

    def sum_outgoing(self, per_out_edge: Tensor, edges: Edges | None = None) -> Tensor:
        """``out[i] = Σ_{out-edges e of i} per_out_edge[e]``, summed in global link order."""
        out = per_out_edge.new_zeros((len(self.agents), *per_out_edge.shape[1:]))
        return out.index_add(0, self.links_of(edges).out_src, per_out_edge)

    # -- public facts about the graph, for the held agents ---------------------------------
    @property
    def w_in(self) -> Tensor:
        """Per in-edge j→i: the mixing weight w_ij (W's dtype)."""
        return self.W[self.links.in_dst_global, self.links.in_src]

    @property
    def w_self(self) -> Tensor:
        """Per held agent: w_ii (W's dtype)."""
        return torch.diagonal(self.W)[self.held]

    @property
    def in_degree(self) -> Tensor:
        """Per held agent: its number of in-edges (neighbours on an undirected graph)."""
        return torch.bincount(self.links.in_dst, minlength=len(self.agents))


class SimNetwork(Network):
    """In-process network over all N agents stacked: a send is the identity on the rows
    (out-edges and in-edges are the same list), recorded by the tap on the way."""

    def __init__(self, adj: Tensor, W: Tensor, tap: Tap | None = None):
        super().__init__(adj, W, None, tap, device=W.device)

    def _transfer(self, kind: str, per_out_edge: Tensor, links: Links) -> Tensor:
        self.tap.record(self.round, kind, list(links.edges), per_out_edge)
        return per_out_edge

    # a broadcast's payload is one row per sender: the overrides below record it as such and
    # never build its (links, D) copy, which would grow with the links (ResNet-18: 45 MB a row)
    def _broadcast_sent(self, kind: str, per_agent: Tensor) -> None:
        """Record ``per_agent``'s rows as the ``kind`` messages of every link (no per-link
        copy), then call the after-send hook as :meth:`send` does."""
        self.tap.record(self.round, kind, list(self.links.edges), per_agent, self._senders())
        if self.after_send is not None:
            self.after_send()

    def _senders(self) -> list[int]:
        return self.links.out_src.tolist()

    def exchange(self, kind: str, per_agent: Tensor) -> Tensor:
        """As :meth:`Network.exchange`, with one gather from ``per_agent`` (every agent is
        held: what i received on j→i is j's row)."""
        rows, index = self.pair_models(kind, per_agent)
        return rows.index_select(0, index)

    def pair_models(self, kind: str, per_agent: Tensor) -> tuple[Tensor, Tensor]:
        """As :meth:`Network.pair_models`, without gathering: ``rows`` is ``per_agent`` itself
        and ``index`` each pair's agent (no (pairs, D) copy of the models)."""
        if self.links.reverse is None:
            raise ValueError("on_reverse needs every link's reverse link in the graph")
        self._broadcast_sent(kind, per_agent)
        return per_agent, torch.cat([self.held, self.links.out_dst])

    def gossip(self, kind: str, per_agent: Tensor) -> Tensor:
        """As :meth:`Network.gossip`, link by link: the same products and sums in the same
        order (``index_add`` adds its rows one after another in link order), without the
        (links, D) received rows and their weighted copy."""
        self._broadcast_sent(kind, per_agent)
        w = self.w_in.to(per_agent.dtype)
        out = self.w_self.to(per_agent.dtype).unsqueeze(-1) * per_agent
        senders, receivers = self.links.out_src.tolist(), self.links.in_dst.tolist()
        for e, (s, d) in enumerate(zip(senders, receivers, strict=True)):
            out[d].add_(per_agent[s] * w[e])
        return out

    def gossip_(self, kind: str, per_agent: Tensor) -> Tensor:
        """:meth:`gossip` in place, receiver by receiver in ascending order, with the same
        products and sums in the same order (bit for bit). A row is overwritten once its
        receiver is mixed; its original is kept aside only while a later receiver still
        reads it: on a ring two rows besides ``per_agent`` (agent 0's, read by agent N − 1,
        and the previous one) instead of a (k, D) result; on a dense graph, where every row
        is read by later receivers, up to k."""
        self._broadcast_sent(kind, per_agent)
        w, w_self = self.w_in.to(per_agent.dtype), self.w_self.to(per_agent.dtype)
        incoming: list[list[tuple[int, int]]] = [[] for _ in self.agents]
        last = list(range(len(self.agents)))  # the last receiver that reads each row
        senders, receivers = self.links.out_src.tolist(), self.links.in_dst.tolist()
        for e, (s, d) in enumerate(zip(senders, receivers, strict=True)):
            incoming[d].append((e, s))
            last[s] = max(last[s], d)
        kept: dict[int, Tensor] = {}  # originals of overwritten rows still to be read
        for d, links in enumerate(incoming):
            row = per_agent[d] * w_self[d]
            for e, s in links:
                row.add_(kept.get(s, per_agent[s]) * w[e])
            if last[d] > d:
                kept[d] = per_agent[d].clone()
            per_agent[d].copy_(row)
            del row
            for s in [s for s in kept if last[s] <= d]:
                del kept[s]
        return per_agent
