# ruff: noqa: E501 -- one line per target, as privaudit targets prints it
"""The built-in attack targets and attacks, each with its one line, as ``privaudit targets``
lists them — copied from the registries (:func:`privaudit.sim.targets.all_targets`,
:data:`privaudit.attacks.registry.SUMMARIES`) so that listing them loads no torch.
``tests/test_cli_help.py`` keeps the copy equal to the registries, and prints the new copy
when a defense or an attack changes.
"""

from __future__ import annotations

TARGETS: tuple[tuple[str, str], ...] = (
    ("adad2p-half-model", "x_i^{k+½} = x_i − γ(g_i + N), N ~ N(0, σ²‖g_i‖²): one peer per round"),
    ("adad2p-weight", "w_i^k: the push-sum weight, in the clear (≡ 1 on this graph)"),
    (
        "constd2p-half-model",
        "x_i^{k+½} = x_i − γ(g_i + N), N ~ N(0, σ²G²), G assumed: one peer/round",
    ),
    ("constd2p-weight", "w_i^k: the push-sum weight, in the clear (≡ 1 on this graph)"),
    ("clipd2p-half-model", "x_i^{k+½} = x_i − γ(clip_C(g_i) + N), N ~ N(0, σ²C²): one peer/round"),
    ("clipd2p-weight", "w_i^k: the push-sum weight, in the clear (≡ 1 on this graph)"),
    ("dp-cga-model", "x_i, the model at the start of the round, in the clear"),
    ("dp-cga-cg", "ĝ^{ji}: i's batch at j's model, batch-mean gradient clipped to C + N(0,σ²C²)"),
    ("dp-cga-half-model", "x̃_i = x_i − η ṽ_i: half-step with the QP-aggregated noised gradients"),
    (
        "dp-dpsgd-half-model",
        "x̃_i = x_i − η ĝ_i: half-step with a per-example clipped, noised gradient",
    ),
    ("dpdl-model", "x_i, the model at the start of the round, in the clear"),
    ("dpdl-cg", "g̈^{ji}: i's batch at j's model, per-example clip C + N(0,σ²C²) on the sum, /B"),
    (
        "dpdl-mm",
        "ṽ_i = β v_i + g̃_i: the momentum, in the clear (holds the un-noised self-gradient)",
    ),
    ("dpdl-half-model", "x̃_i = x_i − η ṽ_i: the half-step model, in the clear"),
    ("nd-model", "x_i, the model at the start of the round, in the clear"),
    ("nd-cg", "g^{ji}: i's batch-mean gradient at j's model, no clipping, no noise"),
    ("nd-mm", "ṽ_i = β v_i + g̃_i: the momentum, in the clear"),
    ("nd-half-model", "x̃_i = x_i − η ṽ_i: the half-step model, in the clear"),
    ("dsgd-half-model", "x̃_i = x_i − η∇F_i(x_i): the half-step model, gossiped in the clear"),
    (
        "muffliato-model",
        "y⁰_i = x_i − η∇F_i(x_i) + N(0, σ²s²): the noised model, first of K gossip steps (steps k ≥ 2 are recorded as model@k)",
    ),
    ("pdsl-model", "x_i, the model at the start of the round, in the clear"),
    ("pdsl-cg", "ĝ_{i,j}: i's batch at j's model, batch-gradient clip C + N(0,σ²C²)"),
    ("pdsl-mm", "û_i = α u_i + Σ_j π_ij ĝ_{j,i}: Shapley-weighted momentum, in the clear"),
    ("pdsl-half-model", "x̂_i = x_i − γ û_i: the half-step model, in the clear"),
    ("dsgt-model", "θ_i^{t-1}, the model, in the clear"),
    ("dsgt-gt", "γ_i^{t-1}, the gradient tracking variable (γ^0 = the raw gradient), in the clear"),
    ("lppa-model", "θ_i^{t-1}, the model, in the clear"),
    ("lppa-gt", "γ_i^{t-1}; γ^0 = ∇L(θ^0) + Σ sent − Σ received noise shares, in the clear"),
    (
        "lppa-noise",
        "δ_li ~ Laplace(β): the share i sends to l, round 1 only (every round with reinject), in the clear",
    ),
    ("dp-dsgt-model", "θ_i^{t-1}, the model (carries the noised γ through Eq. 2), in the clear"),
    ("dp-dsgt-gt", "γ_i^{t-1} + Laplace(β) per coordinate, added before transmission"),
)

ATTACKS: tuple[tuple[str, str], ...] = (
    ("analytic", "closed-form recovery of the first linear layer's input (B = 1 or exact cases)"),
    ("ig", "Inverting Gradients: cosine matching + TV, Adam (Geiping et al. 2020)"),
    ("fi", "feature inversion: the last layer's input solved in closed form, then inverted"),
    ("spear", "SPEAR: exact batch from a ReLU linear layer's low-rank, sparse gradient"),
    ("cpa", "Cocktail Party Attack: FastICA separates a linear layer's gradient into the batch"),
    (
        "rgap",
        "R-GAP: layer-wise linear systems, recursive (Zhu & Blaschko 2021); IG where not exact",
    ),
    ("auto", "picks analytic, R-GAP, SPEAR, CPA, fi or IG per observation by what is solvable"),
    ("dlg", "DLG: images and soft labels by L2 gradient matching, L-BFGS (Zhu et al. 2019)"),
    ("idlg", "iDLG: DLG with the labels inferred first (Zhao et al. 2020)"),
    ("hybrid", "IG's objective (cosine + TV, images in the box) minimised by L-BFGS"),
)
