import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from privaudit.core.errors import PrivauditError
from privaudit.scenario.data import (
    DATASETS,
    PHOTOS,
    dirichlet_partition,
    iid_partition,
    load_dataset,
    photos,
)

SHARED_MNIST = Path(__file__).resolve().parents[1].parent / "shared" / "data"


# --------------------------------------------------------------------------- photos


def test_photos_shape_range_classes():
    d = photos()
    assert d.name == "photos" and d.classes == sorted(PHOTOS) and d.num_classes == 10
    assert d.input_shape == (3, 32, 32)
    assert d.train_x.shape == (2400, 3, 32, 32) and d.test_x.shape == (400, 3, 32, 32)
    assert d.train_x.dtype == torch.float32 and d.train_y.dtype == torch.int64
    assert d.train_x.min() >= 0 and d.train_x.max() <= 1
    assert torch.bincount(d.train_y).tolist() == [240] * 10
    assert torch.bincount(d.test_y).tolist() == [40] * 10
    assert len(d.mean) == len(d.std) == 3
    assert np.allclose(d.mean, d.train_x.double().mean(dim=(0, 2, 3)).numpy())
    assert all(0 < s < 0.5 for s in d.std)
    # every class has texture, not blank crops
    assert (d.train_x.flatten(1).std(1) > 0.01).float().mean() > 0.95


def test_photos_deterministic_and_cache_safe():
    a = photos()
    a.train_x.zero_()  # a caller mutating its copy must not touch the cache
    b, c = photos(), photos()
    assert torch.equal(b.train_x, c.train_x) and torch.equal(b.test_x, c.test_x)
    assert b.train_x.abs().sum() > 0
    assert load_dataset("photos").train_x.equal(b.train_x)
    other = photos(seed=1)
    assert not torch.equal(other.train_x, b.train_x)


def test_photos_train_test_disjoint_and_distinct():
    d = photos()
    train = {x.numpy().tobytes() for x in d.train_x}
    test = {x.numpy().tobytes() for x in d.test_x}
    assert len(train) == len(d.train_x) and len(test) == len(d.test_x)  # no repeated crop
    assert not train & test


def test_unknown_dataset():
    with pytest.raises(PrivauditError, match="unknown dataset 'imagenet'; choose one of: cifar10"):
        load_dataset("imagenet")
    assert set(DATASETS) == {"photos", "mnist", "fashion-mnist", "cifar10"}


# --------------------------------------------------------------------------- partitions


def _labels(n=2400, k=10, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, k, n))


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(p, q) for p, q in zip(a, b, strict=True))


def _check_cover(parts, n):
    allidx = torch.cat(parts)
    assert allidx.dtype == torch.int64
    assert torch.equal(allidx.sort().values, torch.arange(n))  # disjoint and covering
    for p in parts:
        assert torch.equal(p, p.sort().values)


def test_dirichlet_reproducible_disjoint_covering():
    y = _labels()
    a = dirichlet_partition(y, 10, alpha=0.5, seed=3)
    b = dirichlet_partition(y, 10, alpha=0.5, seed=3)
    c = dirichlet_partition(y, 10, alpha=0.5, seed=4)
    assert len(a) == 10
    assert _same(a, b)
    assert not _same(a, c)
    _check_cover(a, len(y))
    assert min(len(p) for p in a) >= 8
    assert min(len(p) for p in dirichlet_partition(y, 10, alpha=0.3, seed=0, min_size=60)) >= 60
    # numpy labels give the same split
    d = dirichlet_partition(y.numpy(), 10, alpha=0.5, seed=3)
    assert _same(a, d)


def _mean_entropy(y, parts):
    ent = []
    for p in parts:
        q = torch.bincount(y[p], minlength=10).double()
        q = q[q > 0] / q.sum()
        ent.append(-(q * q.log()).sum().item())
    return float(np.mean(ent))


def test_dirichlet_skew_grows_as_alpha_shrinks():
    y = _labels()
    skewed = np.mean([_mean_entropy(y, dirichlet_partition(y, 10, 0.1, s)) for s in range(3)])
    mild = np.mean([_mean_entropy(y, dirichlet_partition(y, 10, 100.0, s)) for s in range(3)])
    assert skewed < mild - 0.5
    assert mild > 0.95 * np.log(10)


def test_dirichlet_errors():
    y = _labels(100)
    with pytest.raises(PrivauditError, match="--dirichlet-alpha"):
        dirichlet_partition(y, 4, alpha=0.0)
    with pytest.raises(PrivauditError, match="lower --agents"):
        dirichlet_partition(y, 20, min_size=8)  # 160 > 100 examples
    with pytest.raises(PrivauditError, match="raise --dirichlet-alpha"):
        dirichlet_partition(y, 10, alpha=0.001, min_size=9, max_tries=3)


def test_iid_partition():
    y = _labels(1003)
    a = iid_partition(y, 10, seed=1)
    _check_cover(a, 1003)
    assert {len(p) for p in a} <= {100, 101}
    assert _same(a, iid_partition(y, 10, seed=1))
    assert not _same(a, iid_partition(y, 10, seed=2))


# --------------------------------------------------------------------------- MNIST files


def _write_idx(raw: Path, prefix: str, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic IDX files in MNIST's format (big-endian magic 2051 / 2049)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, n, dtype=np.uint8)
    raw.mkdir(parents=True, exist_ok=True)
    (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
        struct.pack(">IIII", 2051, n, 28, 28) + x.tobytes()
    )
    (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + y.tobytes())
    return x, y


def test_mnist_t10k_fallback(tmp_path):
    x, y = _write_idx(tmp_path / "MNIST" / "raw", "t10k", 50)
    for root in (tmp_path, tmp_path / "MNIST", tmp_path / "MNIST" / "raw"):
        with pytest.warns(UserWarning, match="t10k"):
            d = load_dataset("mnist", str(root))
        assert d.train_x.shape == (40, 1, 28, 28) and d.test_x.shape == (10, 1, 28, 28)
        assert d.input_shape == (1, 28, 28) and d.num_classes == 10
        assert torch.equal(d.train_x, torch.from_numpy(x[:40]).float().unsqueeze(1) / 255)
        assert torch.equal(d.test_y, torch.from_numpy(y[40:]).long())
        assert d.train_y.dtype == torch.int64


def test_fashion_mnist_t10k_fallback(tmp_path):
    _write_idx(tmp_path / "FashionMNIST" / "raw", "t10k", 20)
    with pytest.warns(UserWarning, match="t10k"):
        d = load_dataset("fashion-mnist", str(tmp_path))
    assert len(d.train_x) == 16 and d.classes[0] == "T-shirt/top"


def test_mnist_full_dataset(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    x, _ = _write_idx(raw, "train", 30, seed=1)
    _write_idx(raw, "t10k", 12, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = load_dataset("mnist", str(tmp_path))
    assert len(d.train_x) == 30 and len(d.test_x) == 12
    assert torch.equal(d.train_x[:, 0], torch.from_numpy(x).float() / 255)


def test_data_root_errors(tmp_path):
    with pytest.raises(PrivauditError, match="pass --data-root"):
        load_dataset("mnist")
    missing = tmp_path / "nowhere"
    with pytest.raises(PrivauditError, match=f"{missing}.*--download"):
        load_dataset("mnist", str(missing))
    afile = tmp_path / "file.txt"
    afile.write_text("x")
    with pytest.raises(PrivauditError, match="not a folder"):
        load_dataset("mnist", str(afile))
    with pytest.raises(PrivauditError, match="pass --download to fetch it, or point --data-root"):
        load_dataset("mnist", str(tmp_path))
    with pytest.raises(PrivauditError, match="pass --download"):
        load_dataset("cifar10", str(tmp_path))
    raw = tmp_path / "MNIST" / "raw"
    _write_idx(raw, "t10k", 5)
    (raw / "t10k-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03garbage")
    with pytest.raises(PrivauditError, match="not a valid IDX file"):
        load_dataset("mnist", str(tmp_path))


@pytest.mark.skipif(
    not (SHARED_MNIST / "MNIST" / "raw" / "t10k-images-idx3-ubyte").exists(),
    reason="no real MNIST t10k files in the data folder beside this checkout",
)
def test_real_mnist_t10k():
    with pytest.warns(UserWarning, match="8,000 train / 2,000 test"):
        d = load_dataset("mnist", str(SHARED_MNIST))
    assert d.train_x.shape == (8000, 1, 28, 28) and d.test_x.shape == (2000, 1, 28, 28)
    assert torch.bincount(d.train_y).numel() == 10
    assert 0.1 < d.mean[0] < 0.15  # MNIST's well-known mean ≈ 0.13
