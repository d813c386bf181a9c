"""Image datasets and their split across agents.

Every dataset is an :class:`ImageData`: float32 images in [0, 1], ``(n, C, H, W)``, int64
labels, and the per-channel mean/std of the training images (models normalise with them;
attacks reconstruct in [0, 1] pixel space).

- ``photos`` (default, offline): 32×32 RGB crops of ten real photographs bundled inside
  scikit-image, one class per photograph (see :func:`photos`). Nothing is downloaded.
- ``mnist``, ``fashion-mnist``, ``cifar10``: torchvision's datasets read from ``--data-root``
  (the folder that contains ``MNIST/``, ``FashionMNIST/`` or ``cifar-10-batches-py/``, as
  torchvision lays them out), fetched with ``--download``. When only the MNIST (or
  Fashion-MNIST) *test* files ``t10k-*-idx3/1-ubyte`` are present, they are split 80/20 into
  train/test (see :func:`load_dataset`). CIFAR-10's batches are pickles: torchvision unpickles
  them only after checking their MD5 against the official release.

Agents get disjoint shards: :func:`dirichlet_partition`, the label-skew split of Hsu, Qi &
Brown 2019 (α = 0.5 by default; smaller α, more skew), or :func:`iid_partition`.
"""

from __future__ import annotations

import functools
import os
import pickle
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from privaudit.core.config import EVAL_SPLITS
from privaudit.core.errors import PrivauditError, unknown


@dataclass
class ImageData:
    """Train/test images in [0, 1] (float32, ``(n, C, H, W)``) with int64 labels."""

    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    classes: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    name: str

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_x.shape[1:])  # type: ignore[return-value]

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def _image_data(
    name: str, train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, classes
) -> ImageData:
    """Assemble an :class:`ImageData`, computing per-channel mean/std on the training set."""
    x64 = train_x.to(torch.float64)
    mean = tuple(x64.mean(dim=(0, 2, 3)).tolist())
    std = tuple(x64.std(dim=(0, 2, 3)).tolist())
    return ImageData(
        train_x.to(torch.float32).contiguous(),
        train_y.to(torch.int64),
        test_x.to(torch.float32).contiguous(),
        test_y.to(torch.int64),
        list(classes),
        mean,
        std,
        name,
    )


# --------------------------------------------------------------------------- photos

# class name -> file in the installed ``skimage/data/`` folder. All ship inside the
# scikit-image wheel; they are read straight from that folder, never through skimage's
# fetcher (which would try pooch/the network for a missing file).
PHOTOS: dict[str, str] = {
    "astronaut": "astronaut.png",
    "camera": "camera.png",  # grayscale
    "chelsea": "chelsea.png",
    "coffee": "coffee.png",
    "coins": "coins.png",  # grayscale
    "gravel": "gravel.png",  # grayscale
    "hubble_deep_field": "hubble_deep_field.jpg",
    "immunohistochemistry": "ihc.png",
    "motorcycle": "motorcycle_left.png",
    "rocket": "rocket.jpg",
}


def _read_photo(fname: str) -> np.ndarray:
    """One bundled photograph as float64 RGB in [0, 1]."""
    import skimage.data
    import skimage.io
    from skimage.color import gray2rgb, rgba2rgb
    from skimage.util import img_as_float

    path = Path(skimage.data.__file__).parent / fname
    if not path.is_file():
        raise PrivauditError(
            f"the photos dataset needs {path}, which this scikit-image install lacks; "
            f"reinstall scikit-image (pip install --force-reinstall scikit-image) or pass "
            f"--dataset mnist with --data-root"
        )
    img = img_as_float(skimage.io.imread(path))
    if img.ndim == 2:
        img = gray2rgb(img)
    elif img.shape[-1] == 4:
        img = rgba2rgb(img)
    return img


@functools.lru_cache(maxsize=4)
def _photos_cached(crop: int, n_train: int, n_test: int, short_side: int, seed: int) -> ImageData:
    from skimage.transform import resize

    rng = np.random.default_rng(seed)
    xs: dict[str, list[np.ndarray]] = {"train": [], "test": []}
    for name in sorted(PHOTOS):
        img = _read_photo(PHOTOS[name])
        h, w = img.shape[:2]
        scale = short_side / min(h, w)
        h, w = round(h * scale), round(w * scale)
        img = resize(img, (h, w), anti_aliasing=True, preserve_range=True).clip(0.0, 1.0)
        test_w = max(w // 4, crop + 16)  # right strip: ≥ 17 horizontal test positions
        split = w - test_w
        for part, (x0, x1), count in (("train", (0, split), n_train), ("test", (split, w), n_test)):
            ny, nx = h - crop + 1, x1 - x0 - crop + 1
            if ny < 1 or nx < 1 or ny * nx < count:
                raise PrivauditError(
                    f"photo {name!r} at short side {short_side} has too few distinct "
                    f"{crop}×{crop} {part} crops for {count}; raise short_side or lower the count"
                )
            for pos in rng.choice(ny * nx, size=count, replace=False):
                y, x = divmod(int(pos), nx)
                xs[part].append(img[y : y + crop, x0 + x : x0 + x + crop])

    def stack(part: str, count: int) -> tuple[Tensor, Tensor]:
        x = np.stack(xs[part]).transpose(0, 3, 1, 2).astype(np.float32)
        return torch.from_numpy(x), torch.arange(len(PHOTOS)).repeat_interleave(count)

    return _image_data("photos", *stack("train", n_train), *stack("test", n_test), sorted(PHOTOS))


def photos(
    crop: int = 32, n_train: int = 240, n_test: int = 40, short_side: int = 128, seed: int = 0
) -> ImageData:
    """The default, offline dataset: crops of ten photographs bundled with scikit-image.

    One class per photograph (names in :data:`PHOTOS`, sorted; grayscale ones become
    3-channel). Each photo is resized (anti-aliased) so its short side is ``short_side`` px,
    then ``n_train`` + ``n_test`` distinct ``crop``×``crop`` windows are drawn by a seeded
    numpy Generator: test windows from the right strip of the image (its right quarter, at
    least ``crop`` + 16 px wide), train windows from the rest, so no train and test crop share a
    pixel. Bitwise deterministic; cached in-process (each call returns fresh tensors).
    """
    d = _photos_cached(crop, n_train, n_test, short_side, seed)
    return replace(
        d,
        train_x=d.train_x.clone(),
        train_y=d.train_y.clone(),
        test_x=d.test_x.clone(),
        test_y=d.test_y.clone(),
        classes=list(d.classes),
    )


# --------------------------------------------------------------------------- torchvision

_T10K = ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_TRAIN = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")
T10K_TRAIN_FRACTION = 0.8  # t10k fallback: first 80 % train, last 20 % test (8,000 / 2,000)
_LOAD_ERRORS = (
    RuntimeError,
    OSError,
    ValueError,
    TypeError,
    AssertionError,
    EOFError,
    pickle.UnpicklingError,
)


def _root_dir(name: str, root: str | os.PathLike | None, download: bool, folder: str) -> Path:
    """The folder that contains ``folder``/ (torchvision's ``root``), checked for access.

    ``DIR/<folder>`` and ``DIR/<folder>/raw`` are accepted too and mapped back to ``DIR``.
    """
    if root is None:
        raise PrivauditError(
            f"dataset {name!r} is read from disk: pass --data-root DIR (the folder containing "
            f"{folder}/), adding --download to fetch it; the default dataset 'photos' needs none"
        )
    p = Path(root).expanduser()
    if p.name == "raw" and p.parent.name == folder:
        p = p.parent.parent
    elif p.name == folder:
        p = p.parent
    if p.exists() and not p.is_dir():
        raise PrivauditError(
            f"--data-root {root} is not a folder; point it at the folder containing {folder}/"
        )
    if p.exists() and not os.access(p, os.R_OK | os.X_OK):
        raise PrivauditError(
            f"--data-root {root} is not readable; fix its permissions or point --data-root at a "
            f"readable folder containing {folder}/"
        )
    if not p.exists() and not download:
        raise PrivauditError(
            f"--data-root {root} does not exist; pass --download to fetch {name} into it, or "
            f"point --data-root at a folder containing {folder}/"
        )
    return p


def _torchvision(cls, name: str, base: Path, train: bool, download: bool, hint: str):
    try:
        return cls(str(base), train=train, download=download)
    except _LOAD_ERRORS as e:
        detail = " ".join(str(e).split()) or "no detail"
        if download:
            raise PrivauditError(
                f"{name} could not be downloaded into {base} ({type(e).__name__}: {detail}); "
                f"check the network, or fetch the files elsewhere and point --data-root at them"
            ) from e
        # torchvision's own "not found" text speaks of download=True; say it the CLI's way
        why = "" if isinstance(e, RuntimeError) else f" ({type(e).__name__}: {detail})"
        raise PrivauditError(f"{name} is missing or unreadable under {base}{why}; {hint}") from e


def _gray(images: Tensor) -> Tensor:
    """uint8 ``(n, H, W)`` -> float32 ``(n, 1, H, W)`` in [0, 1]."""
    return images.unsqueeze(1).to(torch.float32).div_(255.0)


def _mnist_like(cls, name: str, root, download: bool) -> ImageData:
    folder = cls.__name__
    base = _root_dir(name, root, download, folder)
    raw = base / folder / "raw"
    hint = (
        f"pass --download to fetch it, or point --data-root at a folder containing "
        f"{folder}/raw/ with the uncompressed IDX files ({', '.join(_TRAIN + _T10K)})"
    )
    have = {f: (raw / f).is_file() for f in _TRAIN + _T10K}
    if not download and all(have[f] for f in _T10K) and not all(have[f] for f in _TRAIN):
        return _t10k_split(cls, name, raw)
    train = _torchvision(cls, name, base, True, download, hint)
    test = _torchvision(cls, name, base, False, False, hint)
    return _image_data(
        name, _gray(train.data), train.targets, _gray(test.data), test.targets, cls.classes
    )


def _t10k_split(cls, name: str, raw: Path) -> ImageData:
    """Only the test files: first 80 % -> train, last 20 % -> test (deterministic)."""
    from torchvision.datasets.mnist import read_image_file, read_label_file

    try:
        x = read_image_file(str(raw / _T10K[0]))
        y = read_label_file(str(raw / _T10K[1]))
    except _LOAD_ERRORS as e:
        raise PrivauditError(
            f"{raw / _T10K[0]} or its labels file is not a valid IDX file ({type(e).__name__}); "
            f"replace them with the originals or pass --download"
        ) from e
    k = len(cls.classes)
    if len(x) != len(y) or len(x) < 2 or int(y.min()) < 0 or int(y.max()) >= k:
        raise PrivauditError(
            f"{raw} holds {len(x)} images but {len(y)} labels (labels must be 0..{k - 1}); "
            f"replace the t10k files with the originals or pass --download"
        )
    n_train = min(len(x) - 1, max(1, round(T10K_TRAIN_FRACTION * len(x))))
    warnings.warn(
        f"{name}: only the t10k test files are in {raw}; using them split "
        f"{n_train:,} train / {len(x) - n_train:,} test",
        stacklevel=5,  # the caller of load_dataset
    )
    x = _gray(x)
    return _image_data(name, x[:n_train], y[:n_train], x[n_train:], y[n_train:], cls.classes)


def _mnist(root, download: bool) -> ImageData:
    from torchvision.datasets import MNIST

    return _mnist_like(MNIST, "mnist", root, download)


def _fashion_mnist(root, download: bool) -> ImageData:
    from torchvision.datasets import FashionMNIST

    return _mnist_like(FashionMNIST, "fashion-mnist", root, download)


def _cifar10(root, download: bool) -> ImageData:
    from torchvision.datasets import CIFAR10

    folder = CIFAR10.base_folder
    base = _root_dir("cifar10", root, download, folder)
    hint = f"pass --download to fetch it, or point --data-root at a folder containing {folder}/"
    train = _torchvision(CIFAR10, "cifar10", base, True, download, hint)
    test = _torchvision(CIFAR10, "cifar10", base, False, False, hint)

    def rgb(a: np.ndarray) -> Tensor:
        return torch.from_numpy(a).permute(0, 3, 1, 2).to(torch.float32).div_(255.0)

    return _image_data(
        "cifar10",
        rgb(train.data),
        torch.tensor(train.targets),
        rgb(test.data),
        torch.tensor(test.targets),
        train.classes,
    )


DATASETS: dict[str, Callable[[str | None, bool], ImageData]] = {
    "photos": lambda root, download: photos(),
    "mnist": _mnist,
    "fashion-mnist": _fashion_mnist,
    "cifar10": _cifar10,
}


def load_dataset(name: str, root: str | None = None, download: bool = False) -> ImageData:
    """Load dataset ``name`` (``photos`` ignores ``root`` and ``download``).

    ``mnist``/``fashion-mnist`` use the full dataset when ``root/<MNIST|FashionMNIST>/raw``
    holds all four IDX files (or ``download`` fetches them); with only the two ``t10k`` files
    they warn and split those 10,000 images into the first 8,000 for train and the last 2,000
    for test.
    """
    if name not in DATASETS:
        raise unknown("dataset", name, DATASETS)
    return DATASETS[name](root, download)


def validation_indices(n_test: int, size: int, seed: int) -> Tensor:
    """The ``size`` test-split indices (sorted) of a public validation set, drawn uniformly
    without replacement by a generator seeded apart from the run's own streams."""
    if not 0 < size < n_test:
        raise PrivauditError(
            f"a public validation set of {size} examples needs a test split of more than "
            f"{size} (this one has {n_test}), so that some are left to measure test accuracy; "
            f"lower the defense's val_size"
        )
    gen = torch.Generator().manual_seed(seed + 7927)
    return torch.randperm(n_test, generator=gen)[:size].sort().values


def split_validation(
    data: ImageData, size: int, seed: int
) -> tuple[ImageData, Tensor | None, Tensor | None]:
    """Take a public validation set of ``size`` examples out of ``data``'s test split
    (:func:`validation_indices`): returns ``data`` whose test split keeps only the other
    examples (in their order), and the validation images (in [0, 1]) and labels; ``size``
    0 returns ``data`` unchanged and no validation set."""
    if size <= 0:
        return data, None, None
    idx = validation_indices(len(data.test_y), size, seed)
    keep = torch.ones(len(data.test_y), dtype=torch.bool)
    keep[idx] = False
    rest = replace(data, test_x=data.test_x[keep], test_y=data.test_y[keep])
    return rest, data.test_x[idx], data.test_y[idx]


VALIDATION_FRACTION = 0.1  # of the training split, when a run is evaluated on validation


def evaluation_split(data: ImageData, split: str, seed: int) -> ImageData:
    """``data`` as a run evaluates it: ``split="test"`` leaves it unchanged; ``"validation"``
    holds a seeded :data:`VALIDATION_FRACTION` of the *training* split out of training and
    puts it in place of the test split, so a hyper-parameter search (``benchmarks/tune.py``)
    never sees a test example. The normalisation statistics stay those of the whole
    training split (they are public constants of the dataset)."""
    if split not in EVAL_SPLITS:
        raise unknown("evaluation split", split, EVAL_SPLITS)
    if split == "test":
        return data
    n = len(data.train_y)
    size = round(n * VALIDATION_FRACTION)
    gen = torch.Generator().manual_seed(seed + 7933)  # apart from the run's own streams
    perm = torch.randperm(n, generator=gen)
    held, kept = perm[:size].sort().values, perm[size:].sort().values
    return replace(
        data,
        train_x=data.train_x[kept],
        train_y=data.train_y[kept],
        test_x=data.train_x[held],
        test_y=data.train_y[held],
    )


# --------------------------------------------------------------------------- partitions


def _labels_np(labels: Tensor | np.ndarray | Sequence[int]) -> np.ndarray:
    y = labels.cpu().numpy() if isinstance(labels, Tensor) else np.asarray(labels)
    if y.ndim != 1:
        raise PrivauditError(f"labels must be 1-D (got shape {tuple(y.shape)})")
    return y.astype(np.int64)


def _check_agents(n_agents: int, n: int, min_size: int) -> None:
    if n_agents < 1:
        raise PrivauditError(f"--agents must be at least 1 to partition data (got {n_agents})")
    if n_agents * min_size > n:
        raise PrivauditError(
            f"{n} examples cannot give {n_agents} agents at least {min_size} each (a batch "
            "and the defense's held-out examples); lower --agents, --batch-size or "
            "--examples-per-agent, or use a larger dataset"
        )


def iid_partition(
    labels: Tensor | np.ndarray | Sequence[int], n_agents: int, seed: int = 0
) -> list[Tensor]:
    """Uniformly random, near-equal shards (sizes differ by at most one); sorted int64 indices."""
    y = _labels_np(labels)
    _check_agents(n_agents, len(y), 1)
    perm = np.random.default_rng(seed).permutation(len(y))
    return [torch.from_numpy(np.sort(p)) for p in np.array_split(perm, n_agents)]


def dirichlet_partition(
    labels: Tensor | np.ndarray | Sequence[int],
    n_agents: int,
    alpha: float = 0.5,
    seed: int = 0,
    min_size: int = 8,
    max_tries: int = 100,
) -> list[Tensor]:
    """Label-skew split (Hsu, Qi & Brown 2019; as in FedMA / Yurochkin et al. 2019 code).

    For each class, agent shares p ~ Dirichlet(α·1_N) and the class's shuffled indices are
    cut at ⌊cumsum(p)·n_k⌋. The whole draw is repeated (at most ``max_tries`` times) until
    every agent holds ≥ ``min_size`` examples (default 8, the default batch size). Returns
    one sorted int64 index tensor per agent: disjoint, covering every index, reproducible in
    ``seed``. Small α -> few classes per agent; α -> ∞ approaches an IID split.
    """
    y = _labels_np(labels)
    if not (np.isfinite(alpha) and alpha > 0):
        raise PrivauditError(f"--dirichlet-alpha must be a positive number (got {alpha})")
    _check_agents(n_agents, len(y), min_size)
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(y == k) for k in np.unique(y)]
    for _ in range(max_tries):
        shards: list[list[np.ndarray]] = [[] for _ in range(n_agents)]
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(n_agents, float(alpha)))
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
            for agent, part in enumerate(np.split(idx, cuts)):
                shards[agent].append(part)
        parts = [np.sort(np.concatenate(s)) for s in shards]
        if min(len(p) for p in parts) >= min_size:
            return [torch.from_numpy(p.astype(np.int64)) for p in parts]
    raise PrivauditError(
        f"a Dirichlet(α={alpha}) split left some of {n_agents} agents with fewer than "
        f"{min_size} examples in {max_tries} draws; raise --dirichlet-alpha or lower --agents"
    )


def per_agent(parts: list[Tensor], examples: int | None, seed: int = 0) -> list[Tensor]:
    """Each shard cut to ``examples`` of its indices (``--examples-per-agent``; None: the
    shards unchanged): a seeded draw per shard, kept sorted, apart from the partition's and
    the run's own streams. El Mrini, Cyffers & Bellet (ICML 2024) give every agent one fixed
    example; a shard cut to its batch size is trained full-batch (q = 1, D-GD)."""
    if examples is None:
        return parts
    small = [len(p) for p in parts if len(p) < examples]
    if small:
        raise PrivauditError(
            f"--examples-per-agent {examples} is more than a shard of {min(small)} examples "
            "holds; lower it or --agents"
        )
    gen = torch.Generator().manual_seed(seed + 104729)
    return [p[torch.randperm(len(p), generator=gen)[:examples]].sort().values for p in parts]
