"""D-PSGD (Lian et al. 2017) in adapt-then-combine form — the undefended baseline.

Each round agent i takes a local step and gossips the half-step model:
    x̃^i_t = x^i_{t-1} − η ∇F_i(x^i_{t-1}; ξ^i_t),     x^i_t = Σ_j w_ij x̃^j_t.
Only ``half-model`` (x̃^i_t) crosses a link, in the clear.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from privaudit.core.context import Context, State
from privaudit.core.network import Network
from privaudit.core.observation import Observation
from privaudit.core.recursion import Recursion, dpsgd
from privaudit.core.threat import View
from privaudit.defenses.base import Defense, Params, register


@dataclass
class DSGDParams(Params):
    """D-PSGD takes the step size η (``lr``) only."""


@register
class DSGD(Defense):
    name = "dsgd"
    kinds = {"half-model": "x̃_i = x_i − η∇F_i(x_i): the half-step model, gossiped in the clear"}
    Params = DSGDParams
    union_exact = True  # checked copy by copy in tests/test_mia_models.py

    def round(
        self,
        ctx: Context,
        p: DSGDParams,
        state: State,
        net: Network,
        batch: tuple[Tensor, Tensor],
    ) -> State:
        x = state["x"]
        g = ctx.grads.mean(x, *batch)
        return {"x": net.gossip("half-model", x - p.lr * g)}

    def rounds_needed(self, kind: str, t: int, n: int) -> list[int]:
        return [t - 1, t] if t > 1 else [t]

    def observe(self, view: View, kind: str, t: int, src: int, dst: int) -> Observation:
        """(x^i_{t-1} − x̃^i_t)/η = ∇F_i(x^i_{t-1}) at x^i_{t-1} = Σ_j w_ij x̃^j_{t-1}: exact at
        t = 1 (x_0 is public) and whenever the View holds every neighbour's previous half-step
        (a neighbour on a complete graph, a covering coalition, global); under ``link`` the
        unseen ones are replaced by x̃^i_{t-1} (:meth:`Defense.observe_half_step`)."""
        return self.observe_half_step(view, t, src, dst)

    def recursion(self, p: Any, W: Tensor, batch_size: int) -> Recursion:
        """x̃_t = W x̃_{t-1} − η g_t, x̃_1 = x_0 − η g_1 on the ``half-model`` messages
        (:func:`~privaudit.core.recursion.dpsgd`); g_t = ∇F_i(x^i_{t-1}; ξ^i_t) at
        x^i_{t-1} = Σ_j w_ij x̃^j_{t-1}. Every message adds one fresh unknown per sender and
        round, so only a victim whose every neighbour the coalition hears is identifiable
        (the gossip algebra then agrees with :meth:`observe`, exactly)."""
        return dpsgd(W, p.lr)
