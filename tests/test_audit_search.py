"""The white-box audit's canary search and its multi-round span
(privaudit/experiments/audit.py): a step that forgets its clip is found by the default
search, correct mechanisms are not flagged by it, the canary and its impact are reported
as used, and the span's upper bound is the K + 1 releases composed."""

from __future__ import annotations

import json
import math

import pytest
from conftest import run_cli, tiny

from privaudit.core.accounting import release_epsilon
from privaudit.core.errors import PLUGIN_ENV, PrivauditError
from privaudit.core.privacy import Privacy
from privaudit.defenses import DEFENSES
from privaudit.eval.canaries import candidates, check_canary
from privaudit.experiments.audit import audit, search_size
from privaudit.plugins import load_plugins
from privaudit.sim.run import Run

# A DP-SGD step that forgets to clip while its privacy() (dp-dpsgd's) states per-example
# clip C and noise σC on the sum: a planted bug, as a plugin would ship it.
NO_CLIP = """
from privaudit.defenses import register
from privaudit.defenses.dp_dpsgd import DPDPSGD


@register
class NoClipDPSGD(DPDPSGD):
    name = "noclip-dpsgd"
    kinds = {"half-model": "as dp-dpsgd's, but the gradient is never clipped (a planted bug)"}

    def round(self, ctx, p, state, net, batch):
        x = state["x"]
        g = ctx.grads.clipped_mean(x, *batch, None)  # the bug: no clip
        if p.sigma > 0:
            g = g + ctx.gaussian(None, g.shape[1]) * (p.sigma * p.clip / ctx.batch_size)
        return {"x": net.gossip("half-model", x - p.lr * g)}
"""
pytestmark = pytest.mark.usefixtures("one_thread")  # a trial is many tiny ops: 1 is best
SEARCH = 1300  # trials: the pilot (a quarter) affords all 5 candidates at 1 − α/10 each
C, B = 1.0, 2  # dp-dpsgd's default clip; tiny()'s batch size


@pytest.fixture(autouse=True)
def registry(monkeypatch):
    """What a test's plugin registered is gone afterwards, and so is the PRIVAUDIT_PLUGINS a
    loaded plugin file sets for the processes a run starts (later tests' ranks would load
    it again)."""
    monkeypatch.delenv(PLUGIN_ENV, raising=False)
    before = dict(DEFENSES)
    yield
    DEFENSES.clear()
    DEFENSES.update(before)


@pytest.fixture
def no_clip(tmp_path) -> str:
    path = tmp_path / "noclip.py"
    path.write_text(NO_CLIP)
    load_plugins([path])
    return str(path)


def _run(tmp_path, defense: str, sigma: float = 1.0, **kw) -> Run:
    return Run.create(tiny(defense, epsilon=None, sigma=sigma, **kw), tmp_path / defense)


def _impact(norm: float, clip: float | None) -> float:
    """A canary's change of the released batch mean: its norm after the clip, over B."""
    return (norm if clip is None else min(norm, clip)) / B


# -- the search finds the bug, and only the bug ------------------------------------------------
def test_the_default_search_finds_a_step_that_forgets_to_clip(tmp_path, no_clip) -> None:
    run = _run(tmp_path, "noclip-dpsgd")
    target = "noclip-dpsgd-half-model"
    fixed = audit(
        run, target, trials=400, canary_norm=C, canary_shape="dirac", progress=False
    ).to_dict()
    assert fixed["verdict"] != "violated"  # a canary of norm C cannot tell: C/B either way
    res = audit(run, target, trials=SEARCH, progress=False).to_dict()
    assert res["verdict"] == "violated", res["search"]
    assert res["upper"]["accountant"] == pytest.approx(release_epsilon(1.0, 1e-5))
    found = res["search"]["candidates"]
    assert [(c["kind"], c["norm"]) for c in found[:3]] == [
        ("dirac", C),
        ("dirac", 100 * C),
        ("opposite", 100 * C),
    ]
    assert [c["kind"] for c in found[3:]] == ["example", "dirac"] and found[4]["norm"] == 10 * C
    for c in found:  # nothing clips: every canary moves the release by its full norm / B
        assert c["impact"] == pytest.approx(_impact(c["norm"], None), rel=1e-3), c
    canary = res["canary"]  # a canary of norm 100C gave the bound, its impact 100C/B
    assert canary["kind"] in ("dirac", "opposite") and canary["norm"] == 100 * C
    assert canary["impact"] == pytest.approx(100 * C / B, rel=1e-3)
    assert res["epsilon_lo"] == max(c["epsilon_lo"] for c in found)
    levels = res["search"]["levels"]
    assert levels["pilot"] == pytest.approx(1 - 0.05 / 10) and levels["final"] == 0.975
    assert res["search"]["pilot_trials"] == SEARCH // 4
    assert sum(c["pilot"]["trials"] for c in found) == SEARCH // 4


@pytest.mark.parametrize(
    "defense, target", [("dp-dpsgd", "dp-dpsgd-half-model"), ("dpdl", "dpdl-cg")]
)
def test_the_search_does_not_flag_a_correct_mechanism(tmp_path, defense, target) -> None:
    """The same search on mechanisms that clip: every candidate's impact is C/B (past the
    clip every norm is the same canary), and the largest of the K + 1 bounds stays below
    the one-release accounting (all hold together at 95 %)."""
    res = audit(_run(tmp_path, defense), target, trials=SEARCH, progress=False).to_dict()
    assert res["verdict"] in ("consistent", "loose"), res["search"]
    assert 0 < res["epsilon_lo"] <= res["upper"]["accountant"]
    found = res["search"]["candidates"]
    assert len(found) == 5
    for c in found:
        assert c["impact"] == pytest.approx(_impact(c["norm"], C), rel=1e-3), c


def test_canary_norm_fixes_the_norm_through_the_cli(tmp_path, capsys, no_clip) -> None:
    """``--canary-norm 10`` on the forgotten clip: violated, and the impact reported is the
    one the canary caused (10C/B), not the clip's C/B."""
    out = tmp_path / "a"
    code, text, err = run_cli(
        capsys,
        *["--plugin", no_clip, "audit", "--target", "noclip-dpsgd-half-model"],
        *["--agents", "4", "--batch-size", str(B), "--sigma", "1", "--trials", "64"],
        *["--canary-norm", "10", "--canary-shape", "dirac", "--no-progress", "--out", str(out)],
    )
    assert code == 0, err
    res = json.loads((out / "audit.json").read_text())
    assert res["verdict"] == "violated"
    assert res["canary"] == {"kind": "dirac", "norm": 10.0, "impact": pytest.approx(10 * C / B)}
    assert "canary: dirac, norm 10, impact 5" in text


def test_help_explains_the_search_and_the_span(capsys) -> None:
    with pytest.raises(SystemExit):
        run_cli(capsys, "audit", "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "search norms C, 100C, 10C and shapes" in text and "1 − α/(2K)" in text
    assert "--span K" in text and "K+1 releases composed" in text


# -- which candidates, how many ----------------------------------------------------------------
def test_candidates_in_priority_order_and_what_fixes_them() -> None:
    example = Privacy(mechanism="gaussian", clip=2.0, clip_unit="example")
    flat = Privacy(mechanism="gaussian", clip=2.0, clip_unit="batch")
    none = Privacy(mechanism="laplace")
    shapes = lambda cs: [(c.kind, c.norm) for c in cs]  # noqa: E731
    assert shapes(candidates(example, 8)) == [
        ("dirac", 2.0),
        ("dirac", 200.0),
        ("opposite", 200.0),
        ("example", None),
        ("dirac", 20.0),
    ]
    assert shapes(candidates(flat, 8))[0] == ("opposite", 1e4 * 8 * 2.0)  # dominates the batch
    assert shapes(candidates(none, 8))[:2] == [("dirac", 1.0), ("dirac", 100.0)]
    assert shapes(candidates(example, 8, norm=5.0)) == [("dirac", 5.0), ("opposite", 5.0)]
    assert shapes(candidates(example, 8, kind="dirac")) == [
        ("dirac", 2.0),
        ("dirac", 200.0),
        ("dirac", 20.0),
    ]
    assert shapes(candidates(flat, 8, norm=5.0, kind="opposite")) == [("opposite", 5.0)]


@pytest.mark.parametrize(
    "norm, kind, needle",
    [
        (None, "ring", "--canary-shape must be one of dirac, opposite, example"),
        (-1.0, None, "--canary-norm must be a finite number > 0"),
        (math.inf, None, "--canary-norm must be a finite number > 0"),
        (3.0, "example", "an example canary's norm is its own gradient's"),
    ],
)
def test_a_canary_that_cannot_be_fixed_is_one_error(norm, kind, needle) -> None:
    with pytest.raises(PrivauditError, match=needle):
        check_canary(norm, kind)


def test_the_budget_decides_how_many_candidates_are_searched() -> None:
    """Every searched candidate's pilot share must afford a bound at 1 − α/(2K); fewer
    trials search fewer (the first ones), and a small budget searches none (every trial on
    the first candidate at 1 − α, as a fixed canary)."""
    assert search_size(5, 32, 1e-5, 0.95) == 1
    assert search_size(5, 511, 1e-5, 0.95) == 1
    assert search_size(5, 512, 1e-5, 0.95) == 2  # 128 pilot trials: 64 each at 1 − α/4
    assert search_size(5, 1279, 1e-5, 0.95) == 4
    assert search_size(5, 1280, 1e-5, 0.95) == 5


# -- the span ------------------------------------------------------------------------------------
def test_span_on_dp_dpsgd_is_not_violated_and_composes_its_releases(tmp_path) -> None:
    """dp-dpsgd's round t + 1 release is evaluated at a model that is post-processing of
    round t's noised one: the stacked statistic of rounds t..t+1 stays below the 2 releases
    composed, and it has power (a positive bound at σ = 0.5)."""
    run = _run(tmp_path, "dp-dpsgd", sigma=0.5)
    res = audit(
        run,
        "dp-dpsgd-half-model",
        trials=300,
        span=1,
        canary_norm=C,
        canary_shape="dirac",
        progress=False,
    ).to_dict()
    assert res["span"] == 1 and res["copies"] == 2
    assert res["upper"]["accountant"] == pytest.approx(release_epsilon(0.5 / math.sqrt(2), 1e-5))
    assert "gdp" not in res  # the stacked scores are no exact Gaussian shift: CP alone
    assert res["verdict"] != "violated"
    assert 0 < res["epsilon_lo"] <= res["upper"]["accountant"]
    shift = res["search"]["candidates"][0]["shift"]
    assert len(shift) == 2 and shift[0] == pytest.approx(_impact(C, C), rel=1e-3)


def test_span_on_dpdl_cg_measures_the_moved_evaluation_point(tmp_path) -> None:
    """DPDL's round-2 cross-gradient is evaluated at the receiver's model, which carries the
    victim's un-noised round-1 self-gradient: a canary against the victim's gradient moves
    it (a Dirac on one weight hardly does). At test-sized trial counts the bound stays
    below the 2 releases composed (docs/privacy-accounting.md: what it would take). The
    example canary goes through DPDL's pairs (one batch, three models) clipped to C."""
    run = _run(tmp_path, "dpdl", sigma=2.0, rounds=2)
    shifts = {}
    for shape in ("dirac", "opposite", "example"):
        norm = None if shape == "example" else C
        res = audit(
            run, "dpdl-cg", trials=64, span=1, canary_norm=norm, canary_shape=shape, progress=False
        ).to_dict()
        assert res["copies"] == 2 and res["verdict"] != "violated"
        up = release_epsilon(2.0 / math.sqrt(2), 1e-5)
        assert res["upper"]["accountant"] == pytest.approx(up)
        shifts[shape] = res["search"]["candidates"][0]["shift"]
    for shape in shifts:  # each clipped to C in round 1 (the example's gradient is ≈ 30C)
        assert shifts[shape][0] == pytest.approx(C / B, rel=1e-3)
    assert shifts["opposite"][1] > 0.05 * C / B > 100 * shifts["dirac"][1]


def test_span_needs_the_rounds_and_the_white_box(tmp_path, capsys) -> None:
    run = _run(tmp_path, "dp-dpsgd", rounds=2)
    with pytest.raises(PrivauditError, match="--round 2 with --span 1 is outside"):
        audit(run, "dp-dpsgd-half-model", round=2, trials=64, span=1, progress=False)
    code, _, err = run_cli(
        capsys,
        *["audit", "--target", "dpdl-cg", "--mode", "one-run", "--span", "1"],
        *["--agents", "4", "--no-progress", "--out", str(tmp_path / "o")],
    )
    assert code == 2 and "--span does nothing in --mode one-run" in err
