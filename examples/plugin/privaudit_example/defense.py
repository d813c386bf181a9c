"""DP D-PSGD in combine-then-adapt order: a privaudit plugin defense (docs/extending.md).

privaudit ships D-PSGD in adapt-then-combine form (``dsgd``, ``dp-dpsgd``: an agent steps,
then gossips its half-step model). Lian et al. (2017) state D-PSGD the other way round:
every agent sends its current model and, while the models travel, takes a local step at its
*own* model; the update mixes what it received. Here the local step is DP-SGD's. Round t,
agent i, its Poisson batch ξ^i_t of expected size B (Σ_b over its realised examples):

    send x^i_{t-1} to every neighbour                                        (``model``)
    ĝ^i_t = (1/B) (Σ_b clip_C(∇F_i(x^i_{t-1}; ξ_b)) + z^i_t),      z^i_t ~ N(0, σ²C² I)
    x^i_t = Σ_j w_ij x^j_{t-1} − η ĝ^i_t                       (j over N_i ∪ {i}, W public)

Privacy. Every model is a function of x_0 and the noised ĝ's alone, so agent i's batch of
round t is released once, in ĝ^i_t (it reaches the wire inside x^i_t, sent in round t + 1,
the same value to every neighbour): one Gaussian mechanism per round, noise multiplier σ
w.r.t. adding or removing one example (the clipped sum moves by at most C; its noise std is
σC), composed over the rounds at the agent's Poisson rate q_i = B/n_i.

Observation. The ``model`` target of round t is attacked for round t's batch, from the
``model`` messages of rounds t and t + 1: (Σ_j w_ij x^j_{t-1} − x^i_t)/η = ĝ^i_t, at
x^i_{t-1}. Exact at t = 1 (every x^j_0 is the public x_0) and when the View holds every
neighbour's x^j_{t-1}; otherwise an unseen neighbour's model is replaced by x^i_{t-1}.

``cta-dpsgd-halfnoise`` is the same algorithm with a planted bug: its noise std is σC/2
while its ``privacy()`` still states σ; ``privaudit audit`` reports it ``violated``.

Parameters (``-p``): ``lr`` η = 0.05, ``clip`` C = 1.0; ``sigma`` is set by --epsilon/--sigma.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from privaudit.core.context import State
from privaudit.core.errors import PrivauditError
from privaudit.core.network import Network
from privaudit.core.observation import Observation
from privaudit.core.privacy import Privacy
from privaudit.core.threat import View
from privaudit.defenses import Context, Defense, register
from privaudit.defenses.base import mix


@dataclass
class CTAParams:
    lr: float = 0.05  # η
    clip: float = 1.0  # C, per example
    sigma: float = 0.0  # noise multiplier; set from --epsilon or --sigma by privaudit

    def validate(self) -> None:
        if not self.lr > 0:
            raise PrivauditError(f"lr must be > 0, got {self.lr}")
        if not self.clip > 0:
            raise PrivauditError(f"clip must be > 0, got {self.clip}")
        if self.sigma < 0:
            raise PrivauditError(f"sigma must be ≥ 0, got {self.sigma}")


@register
class CTADPSGD(Defense):
    name = "cta-dpsgd"
    kinds = {"model": "x_i, sent before its step with a per-example clipped, noised gradient"}
    Params = CTAParams
    noise_scale = 1.0  # the noise actually added, as a share of σC/B (the broken twin: ½)

    def round(
        self, ctx: Context, p: CTAParams, state: State, net: Network, batch: tuple[Tensor, Tensor]
    ) -> State:
        x = state["x"]
        mixed = net.gossip("model", x)  # Σ_j w_ij x^j_{t-1}; x^i_{t-1} crosses every link
        g = ctx.grads.clipped_mean(x, *batch, p.clip)  # (1/B) Σ_b clip_C(∇F_i), at own x
        if p.sigma > 0:  # one row per held agent, from that agent's generator
            std = self.noise_scale * p.sigma * p.clip / ctx.batch_size
            g = g + ctx.gaussian(None, g.shape[1]) * std
        return {"x": mixed - p.lr * g}

    def privacy(self, p: CTAParams, kind: str, W: Tensor, agent: int | None = None) -> Privacy:
        """One Gaussian release of the batch per round: per-example clip C, std σC on the sum."""
        if p.sigma <= 0:
            return Privacy(reason=f"{self.name} adds no noise (σ = 0)")
        return Privacy(
            mechanism="gaussian",
            noise_multiplier=p.sigma,
            releases=1,
            clip=p.clip,
            clip_unit="example",
            formal=True,
            reason="per-example clip C + N(0, σ²C²) on the sum, released once per round",
            claimed_multiplier=p.sigma,
            claimed_releases=1,
            paper="DP-SGD's local step in Lian et al.'s D-PSGD (an example plugin)",
        )

    def rounds_needed(self, kind: str, t: int, n: int) -> list[int]:
        return [t, t + 1]  # x^i_t, which carries ĝ^i_t, crosses in round t + 1

    def observe(self, view: View, kind: str, t: int, src: int, dst: int) -> Observation:
        """(Σ_j w_ij x^j_{t-1} − x^i_t)/η = ĝ^i_t at x^i_{t-1}: noise std σC/B, clip C."""
        p = view.public.params
        prev = view.get(t, src, dst, "model")  # x^i_{t-1}
        new = view.get(t + 1, src, dst, "model")  # x^i_t
        mixed, unseen = mix(view, src, lambda j: view.sent(t, j, "model"), prev)
        meta = {"exact": t == 1 or not unseen}  # at t = 1 every model is x_0
        if not meta["exact"]:
            meta["approx"] = f"unseen models of agents {unseen} replaced by x_i"
        return self.make_observation(
            view,
            prev,
            (mixed - new) / p["lr"],
            clip=p["clip"],
            noise_std=p["sigma"] * p["clip"] / view.public.batch_size,
            meta=meta,
        )


@register
class HalfNoiseCTADPSGD(CTADPSGD):
    """Deliberately broken, for the audit to catch: adds noise of std σC/(2B), while
    ``privacy()`` and ``observe()`` (inherited) state σC/B."""

    name = "cta-dpsgd-halfnoise"
    kinds = {"model": "as cta-dpsgd's, with half the noise its privacy() states (a planted bug)"}
    noise_scale = 0.5
