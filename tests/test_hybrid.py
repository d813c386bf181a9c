"""The L-BFGS + TV hybrid (privaudit.attacks.hybrid), on CPU."""

from __future__ import annotations

import pytest
import torch
from test_attacks import observe, photos, psnr

from privaudit.attacks import check_options, run_attack
from privaudit.core.errors import PrivauditError
from privaudit.eval.metrics import score
from privaudit.scenario.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lenet():
    return build_model("lenet", (3, 16, 16), 10, 0)


def test_hybrid_keeps_images_in_the_box_and_matches_the_gradient(lenet):
    x = photos(1, 16)
    obs = observe(lenet, x, torch.tensor([3]))
    rec = run_attack("hybrid", [obs], iterations=15, tv=0.0)[0]
    assert rec.meta["attack"] == "hybrid" and rec.labels.tolist() == [3]
    assert 0 < float(rec.images.min()) and float(rec.images.max()) < 1
    assert rec.loss < 1e-3  # cosine distance of the gradients
    random = psnr(torch.rand(x.shape, generator=torch.Generator().manual_seed(0)), x)
    assert psnr(rec.images, x) > random + 10


def test_hybrid_beats_idlg_and_ig_on_a_batch_through_the_sigmoid_lenet(lenet):
    """Cosine + TV under L-BFGS against L2 under L-BFGS (iDLG, same steps) and the same
    objective under signed Adam (IG, 300 iterations), on one batch of four."""
    x, y = photos(4, 16), torch.tensor([1, 3, 5, 7])
    obs = observe(lenet, x, y)

    def db(attack: str, iterations: int) -> float:
        rec = run_attack(attack, [obs], iterations=iterations)[0]
        return score(x, y, rec.images, rec.labels, lpips=False)["psnr"]

    hybrid = db("hybrid", 15)
    assert hybrid > db("idlg", 15) + 2
    assert hybrid > db("ig", 300) + 2


def test_hybrid_options_are_checked():
    with pytest.raises(PrivauditError, match="tv must be"):
        check_options("hybrid", {"tv": -1})
    assert check_options("hybrid", {"tv": 0, "max_iter": 5}) == {"tv": 0.0, "max_iter": 5}
