"""privaudit.attacks.completion: a separation made exact, the rest found at the rank left.

The polish's fixed point is the truth: a true input perturbed a little inside the layer's
row space comes back to float32 rounding and is called exact; a blend of two inputs is not.
With some examples exact and the others unknown, SPEAR's search at the rank they leave finds
every other one exactly; a noised gradient is not completed; and on photographs CPA with the
completion recovers at least what it does without.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import run_cli
from test_attacks import observe
from test_cpa import psnrs
from test_rowspace import batch

from privaudit.attacks import run_attack
from privaudit.cli.attack import how_lines
from privaudit.eval.metrics import match, psnr
from privaudit.scenario.data import photos
from privaudit.scenario.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

completion = sys.modules["privaudit.attacks.completion"]
disaggregation = sys.modules["privaudit.attacks.disaggregation"]
spear = sys.modules["privaudit.attacks.spear"]


def inputs(obs, x: torch.Tensor) -> torch.Tensor:
    return disaggregation.inputs_from_images(obs, x.double())


def factors(obs):
    layer = disaggregation.pick_layer(obs)
    b = int(obs.batch_size)
    ly = spear.factor(obs, layer, b, spear.ZERO_TOL, spear.ZERO_SIGMAS)
    return layer, ly, spear.next_layer_projector(obs, layer, b)


def test_a_near_input_is_polished_to_the_truth_and_a_blend_is_not_called_exact():
    """Each true input plus 2 % of another (inside ∂W's row space) is returned to within
    1e-4 and called exact (residual ≤ 1e-8, measured ≈ 1e-13); half of one plus half of
    another reaches no exact fixed point (residual > 1e-8)."""
    x, _, obs = batch(16)
    _, ly, proj = factors(obs)
    p = inputs(obs, x) @ ly.R.T
    near, res = completion.polish(ly, proj, p + 0.02 * p.roll(1, 0))
    assert float(((near - p).norm(dim=1) / p.norm(dim=1)).max()) < 1e-4
    assert float(res.max()) <= completion.EXACT
    _, blend = completion.polish(ly, proj, 0.5 * (p + p.roll(1, 0)))
    assert float(blend.min()) > completion.EXACT


def test_what_the_exact_examples_leave_is_found_by_the_search():
    """B = 16: ten inputs known up to 2 %, six replaced by the batch mean (a failed
    separation). The completion makes the ten exact and finds the six at rank 6; all sixteen
    images at ≥ 40 dB, and each exact example's output gradient gives its label."""
    x, y, obs = batch(16, seed=1)
    layer, _, _ = factors(obs)
    h = inputs(obs, x)
    start = h + 0.02 * h.roll(1, 0)
    start[10:] = h.mean(0)
    sep = disaggregation.Separated(start, torch.zeros(200, 16), torch.ones(16, dtype=bool), {})
    out = completion.complete(obs, layer, sep, seed=0)
    meta = out.meta["complete"]
    assert (meta["exact"], meta["searched"], meta["left"]) == (10, 6, 0)
    images = disaggregation.images_from_inputs(obs, out.h).float()
    labels = disaggregation.labels_from_directions(obs, layer, out.h[:10], out.g[:, :10])
    assert torch.equal(labels, y[:10])
    got = torch.tensor(psnr(x, images[match(x, images)], "none"))
    assert float(got.min()) >= 40


def test_a_noised_gradient_is_not_completed():
    x, y, _ = batch(8)
    data = photos()
    obs = observe(build_model("mlp", data.input_shape, 10, 0), x, y, clip=1.0, noise=1e-6,
                  mean=data.mean, std=data.std)  # fmt: skip
    (rec,) = run_attack("cpa", [obs])
    assert "noised" in rec.meta["cpa"]["complete"]["skipped"]


def test_cpa_with_the_completion_recovers_the_whole_batch():
    """Photographs, B = 32 on ``mlp``: the refinement alone leaves some examples at a blend
    (measured 31 of 32 at ≥ 30 dB); with the completion (the default) every one is at
    ≥ 30 dB and at least as many as without."""
    x, _, obs = batch(32)
    (off,) = run_attack("cpa", [obs], complete="off")
    (on,) = run_attack("cpa", [obs])
    assert "complete" not in off.meta["cpa"]
    p_off, p_on = psnrs(x, off), psnrs(x, on)
    assert int((p_on >= 30).sum()) >= int((p_off >= 30).sum())
    assert int((p_on >= 30).sum()) == 32


def test_the_attacks_own_meta_reaches_result_json_and_the_summary(tmp_path, capsys):
    """``privaudit train`` then ``privaudit attack --attack cpa`` on a noise-free ``mlp``
    message: result.json's ``attack_meta`` holds, per observation, what CPA recorded — the
    completion made every example of the realised batch exact and searched for none, and
    ``how`` says so, as do a line of the summary and the report's per-victim table — without
    the observation's provenance (already in ``links``)."""
    run, out = tmp_path / "run", tmp_path / "out"
    quiet = ["--no-progress"]
    code, _, err = run_cli(capsys, "train", "--defense", "dsgd", "--model", "mlp",
                           "--batch-size", "8", "--rounds", "1", "--agents", "4",
                           "--out", str(run), *quiet)  # fmt: skip
    assert code == 0, err
    code, stdout, err = run_cli(capsys, "attack", "--target", "dsgd-half-model", "--run",
                                str(run), "--round", "1", "--attack", "cpa", "--out",
                                str(out), "--no-lpips", *quiet)  # fmt: skip
    assert code == 0, err
    result = json.loads((out / "result.json").read_text())
    (b,) = result["batch_sizes"]
    (meta,) = result["attack_meta"]
    assert b > 1 and meta["attack"] == "cpa" and meta["recovered"] == b
    done = meta["cpa"]["complete"]
    assert (done["exact"], done["searched"], done["left"]) == (b, 0, 0)
    assert len(done["residual"]) == b and max(done["residual"]) <= completion.EXACT
    how = meta["cpa"]["how"]
    assert how.startswith(f"{b} exact after the polish") and "SPEAR's search" in how
    assert "observation" not in meta and f"cpa: {how}" in stdout.splitlines()
    assert result["metrics"]["label_acc"] == 1.0
    code, _, err = run_cli(capsys, "report", str(out), "--markdown")
    assert code == 0, err
    assert how in (out / "report.md").read_text()  # the report's per-victim table says how


def test_the_summary_says_how_each_victim_was_solved_and_why_a_completion_was_skipped():
    """The lines :func:`how_lines` prints from ``attack_meta``: the attack's ``how`` and a
    skipped completion's reason, naming the victim where several were attacked; nothing
    for an attack that records neither, or for an empty batch."""
    skipped = {"attack": "cpa", "cpa": {"complete": {"skipped": "the gradient is noised"}}}
    spear_ = {"attack": "spear", "spear": {"how": "all B directions"}}
    empty = {"empty": "the victim's batch has no example: nothing to reconstruct"}
    assert how_lines([skipped], [[0, 1]]) == [
        "cpa: the completion was skipped: the gradient is noised"
    ]
    assert how_lines([spear_, {"attack": "ig"}, empty], [[0, 1], [2, 1], [3, 1]]) == [
        "spear, victim 0: all B directions"
    ]
