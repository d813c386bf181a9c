"""privaudit.eval: metrics against hand-computed values, matching, LPIPS availability, figures."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from privaudit.core.files import from_jsonable, to_jsonable
from privaudit.eval import metrics as M
from privaudit.eval.figures import reconstruction_grid


def _rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed))


def test_package_import_is_light() -> None:
    import subprocess

    code = (
        "import sys, privaudit.eval; "
        "assert 'matplotlib' not in sys.modules and 'lpips' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("channels", [1, 3])
def test_constant_images_hand_values(channels: int) -> None:
    t = torch.full((channels, 8, 8), 0.5)
    r = torch.full((channels, 8, 8), 0.6)
    assert M.mse(t, r) == pytest.approx(0.01)
    assert M.psnr(t, r) == pytest.approx(10 * math.log10(1 / 0.01))  # 20 dB
    assert M.psnr(t, t) == math.inf
    assert M.mse(t, t) == 0.0


@pytest.mark.parametrize("channels", [1, 3])
def test_ssim_identity_and_noise(channels: int) -> None:
    x = _rand(channels, 32, 32)
    assert M.ssim(x, x) == pytest.approx(1.0)
    noisy = x + 0.2 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    less = x + 0.05 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    assert M.ssim(x, noisy) < M.ssim(x, less) < 1.0


@pytest.mark.parametrize("side", [3, 4, 5, 6, 8, 28])
def test_ssim_small_images(side: int) -> None:
    x = _rand(1, side, side)
    assert M.ssim(x, x) == pytest.approx(1.0)
    assert M.ssim(x, 1 - x) < 1.0


def test_ssim_too_small_is_clear_error() -> None:
    with pytest.raises(ValueError, match="at least 3 px"):
        M.ssim(torch.zeros(1, 2, 2), torch.zeros(1, 2, 2))


def test_batch_equals_mean_of_singles() -> None:
    t, r = _rand(4, 3, 16, 16), _rand(4, 3, 16, 16, seed=1)
    for fn in (M.mse, M.psnr, M.ssim):
        singles = [fn(t[i], r[i]) for i in range(4)]
        assert fn(t, r, "none") == pytest.approx(singles)
        assert fn(t, r) == pytest.approx(np.mean(singles))
    assert M.mse(t.numpy(), r.numpy()) == pytest.approx(M.mse(t, r))  # numpy input too


def test_recon_is_clamped_and_truth_checked() -> None:
    t = torch.ones(1, 4, 4)
    assert M.mse(t, torch.full((1, 4, 4), 5.0)) == 0.0
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        M.mse(t * 2, t)
    with pytest.raises(ValueError, match="shape"):
        M.mse(t, torch.ones(1, 4, 5))


def test_label_accuracy() -> None:
    assert M.label_accuracy([1, 2, 3, 4], torch.tensor([1, 2, 0, 4])) == 0.75
    assert M.label_set_accuracy([1, 1, 2, 3], [3, 1, 2, 2]) == 0.75


def test_match_recovers_permutation_and_score_is_order_free() -> None:
    true = _rand(6, 3, 16, 16)
    labels = torch.tensor([0, 1, 2, 3, 4, 5])
    recon = (
        true + 0.03 * torch.randn(true.shape, generator=torch.Generator().manual_seed(2))
    ).clamp(0, 1)
    shuffle = torch.tensor([4, 2, 5, 0, 3, 1])
    perm = M.match(true, recon[shuffle])
    assert torch.equal(shuffle[perm], torch.arange(6))
    assert torch.equal(recon[shuffle][perm], recon)

    a = M.score(true, labels, recon, labels, lpips=False)
    b = M.score(true, labels, recon[shuffle], labels[shuffle], lpips=False)
    assert b["perm"] == perm
    for key in ("mse", "psnr", "ssim", "label_acc", "label_acc_set"):
        assert b[key] == pytest.approx(a[key])
    assert b["per_image"]["psnr"] == pytest.approx(a["per_image"]["psnr"])
    assert b["label_acc"] == 1.0 and b["lpips"] is None and b["lpips_note"] is None


def test_score_many_aggregates() -> None:
    t = _rand(2, 1, 8, 8)
    r = (t + 0.1).clamp(0, 1)
    out = M.score_many([((t, [0, 1]), (t, [0, 1])), ((t, [0, 1]), (r, [0, 0]))], lpips=False)
    assert out["n_observations"] == 2
    assert out["psnr"]["mean"] == math.inf and math.isnan(out["psnr"]["std"])
    assert out["psnr"]["median"] == math.inf
    assert out["mse"]["mean"] == pytest.approx(np.mean([0.0, out["scores"][1]["mse"]]))
    assert out["label_acc"] == {"mean": 0.75, "std": 0.25, "median": 0.75, "n": 2}
    assert out["lpips"]["n"] == 0 and out["lpips"]["mean"] is None


def test_to_jsonable_round_trip() -> None:
    t = _rand(3, 1, 8, 8)
    s = M.score(t, torch.tensor([1, 2, 3]), t, torch.tensor([1, 2, 3]))
    data = to_jsonable({"score": s, "x": np.float32(1.5), "nan": math.nan, "t": torch.ones(2)})
    text = json.dumps(data, allow_nan=False)
    assert json.loads(text) == data
    assert data["score"]["psnr"] == "inf" and data["nan"] == "nan"
    back = from_jsonable(json.loads(text))
    assert back["score"]["psnr"] == math.inf and back["score"]["mse"] == 0.0


# --------------------------------------------------------------------------- LPIPS


def test_lpips_real_or_clearly_unavailable() -> None:
    x = _rand(2, 3, 32, 32)
    status = M.lpips_status()
    if status is not None:
        assert M.lpips_distance(x, x) is None
        assert status.startswith("LPIPS unavailable")
        assert "pip install lpips" in status or (
            M.ALEXNET_WEIGHTS in status and "torchvision.models.alexnet" in status
        )
        assert M.score(x, None, x, None)["lpips_note"] == status
    else:
        assert M.lpips_distance(x, x) == pytest.approx(0.0, abs=1e-6)


@pytest.fixture
def hub_dir(tmp_path: Path) -> Iterator[Path]:
    old = torch.hub.get_dir()
    torch.hub.set_dir(str(tmp_path / "hub"))
    try:
        yield tmp_path / "hub"
    finally:
        torch.hub.set_dir(old)


def test_lpips_missing_weights_never_downloads(hub_dir: Path) -> None:
    x = _rand(1, 1, 28, 28)
    assert M.lpips_distance(x, x) is None
    status = M.lpips_status()
    assert status is not None and str(hub_dir / "checkpoints") in status
    assert not (hub_dir / "checkpoints" / M.ALEXNET_WEIGHTS).exists()


def test_lpips_corrupt_weights_reported(hub_dir: Path) -> None:
    pytest.importorskip("lpips")
    (hub_dir / "checkpoints").mkdir(parents=True)
    (hub_dir / "checkpoints" / M.ALEXNET_WEIGHTS).write_bytes(b"not a checkpoint")
    assert M.lpips_distance(_rand(1, 3, 32, 32), _rand(1, 3, 32, 32)) is None
    assert "could not load" in M.lpips_status()


def test_lpips_pipeline_with_stand_in_weights(hub_dir: Path) -> None:
    """Loading path, grayscale and small-image handling, using a stand-in backbone file.

    The weights are random, so only properties that hold for any backbone are checked:
    d(x, x) = 0, d(x, y) > 0, batch = singles. No number from this is ever reported.
    """
    pytest.importorskip("lpips")
    from torchvision.models import alexnet

    torch.manual_seed(0)
    features = alexnet().features.state_dict()
    (hub_dir / "checkpoints").mkdir(parents=True)
    torch.save(
        {f"features.{k}": v for k, v in features.items()},
        hub_dir / "checkpoints" / M.ALEXNET_WEIGHTS,
    )
    assert M.lpips_status() is None
    for shape in [(2, 3, 32, 32), (2, 1, 28, 28), (2, 1, 8, 8)]:
        x, y = _rand(*shape), _rand(*shape, seed=1)
        assert M.lpips_distance(x, x) == pytest.approx(0.0, abs=1e-6)
        d = M.lpips_distance(x, y, "none")
        assert all(v > 0 for v in d)
        assert d[1] == pytest.approx(M.lpips_distance(x[1], y[1]), rel=1e-4)


# --------------------------------------------------------------------------- figures


@pytest.mark.parametrize(("n", "channels"), [(1, 1), (4, 3), (16, 1)])
def test_reconstruction_grid_png(tmp_path: Path, n: int, channels: int) -> None:
    import matplotlib.image as mpimg

    true = _rand(n, channels, 16, 16)
    recon = _rand(n, channels, 16, 16, seed=1)
    s = M.score(true, None, recon, None, lpips=False)
    out = tmp_path / "figs" / "grid.png"
    path = reconstruction_grid(
        true, recon[s["perm"]], s["per_image"], "dpdl-cg · round 200 · ε = 8", out
    )
    assert path == out
    img = mpimg.imread(out)
    assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50
    assert sorted(p.name for p in out.parent.iterdir()) == ["grid.pdf", "grid.png"]


def test_reconstruction_grid_several_rows(tmp_path: Path) -> None:
    import matplotlib.image as mpimg

    true = _rand(3, 3, 16, 16)
    rows = [true, _rand(3, 3, 16, 16, seed=1)]
    per = [M.score(true, None, r, None, lpips=False)["per_image"] for r in rows]
    per[1]["lpips"] = [0.1, None, 0.3]
    out = tmp_path / "cmp.png"
    reconstruction_grid(true, rows, per, "compare", out, row_labels=["nd-cg", "dpdl-cg"])
    out2 = tmp_path / "cmp.png"  # overwrite in place
    reconstruction_grid(true, rows, None, "compare again", out2, row_labels=["a", "b"])
    assert mpimg.imread(out).shape[2] in (3, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp.pdf", "cmp.png"]
    with pytest.raises(ValueError, match="row labels"):
        reconstruction_grid(true, rows, None, "x", tmp_path / "bad.png", row_labels=["a"])
    assert not (tmp_path / "bad.png").exists()
