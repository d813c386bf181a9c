"""The centralised DP-SGD reference of a privacy–utility table.

At a given (ε, δ), the best a decentralised algorithm could hope for is DP-SGD (Abadi et al.
2016, "Deep Learning with Differential Privacy", CCS) run by one trusted curator on the pooled
training data of all agents: the same model, Poisson-sampled batches (each example joins a
batch independently with probability q) of the same expected size, the same per-example
clipping and Gaussian noise, accounted by opacus over the same number of steps.

- :func:`centralised_dpsgd` trains it with opacus' :class:`~opacus.PrivacyEngine` and reports
  the test accuracy in a :class:`ReferenceResult`; with ``epsilon=None`` it trains the
  non-private reference (the same batches, no clipping, no noise).
- :func:`pooled_sample_rate` gives the pooled rate q that matches a decentralised run in which
  agent i samples its shard of n_i examples at q_i = B/n_i
  (:func:`privaudit.core.sampling.rate`).
- :func:`reference_for` is the reference of one run configuration: its data, partition,
  model, seed, rounds (as steps), δ and accountant.

Each of the ``steps`` steps draws a Poisson batch (opacus'
:class:`~opacus.utils.uniform_sampler.UniformWithReplacementSampler`, the sampler of
:class:`~opacus.data_loader.DPDataLoader`; an empty batch is still a step, the noise alone when
private) and updates

    θ ← θ − lr · ( Σ_{b ∈ batch} clip_C(∇ℓ_b) + N(0, σ²C² I) ) / (n · q)

(n training examples, so n·q is the expected batch size: opacus' fixed denominator), with
heavy-ball momentum. σ is the multiplier opacus'
:func:`~opacus.accountants.utils.get_noise_multiplier` finds for (ε, δ) after ``steps`` steps
at rate q (its ε at most 0.01 below the target), and the model is trained through
:meth:`opacus.PrivacyEngine.make_private` (per-example gradients, flat clipping, noise,
accounting). opacus derives the rate from its loader's length (1/⌊1/q⌋ for a Poisson loader),
which is q only when 1/q is an integer, so the engine is told q itself: the batches, the
accountant's steps and the denominator n·q all use exactly q. The non-private reference takes
the same update with no clipping and no noise, gradient Σ_b ∇ℓ_b / (n·q), so ``lr`` means the
same step size in both.

A reference is deterministic in its seed: the batches come from a :class:`torch.Generator`
seeded from it, and the noise (and any randomness of the model) from torch's global
generators, seeded from it inside :func:`torch.random.fork_rng` so the caller's random state
is left as it was.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from privaudit.core import limits, text
from privaudit.core.accountants import ACCOUNTANTS
from privaudit.core.config import RunConfig
from privaudit.scenario.data import dirichlet_partition, evaluation_split, load_dataset
from privaudit.scenario.models import build_model, normalizes_inputs

EVAL_CHUNK = 1024  # test examples per forward pass when scoring

__all__ = ["ReferenceResult", "centralised_dpsgd", "pooled_sample_rate", "reference_for"]


@dataclass(frozen=True)
class ReferenceResult:
    """What :func:`centralised_dpsgd` trained and what it spent.

    Attributes:
        accuracy: test accuracy of the final model, in [0, 1].
        epsilon: ε spent at the run's δ, from opacus' accountant after training
            (``math.inf`` for the non-private reference).
        sigma: noise multiplier (noise std over the clip norm) of every step (0.0 when
            non-private).
        steps: optimizer steps taken (empty Poisson batches included).
        sample_rate: Poisson sampling rate q over the pooled training data.
        clip: per-example gradient clip norm (``None`` when non-private: no clipping).
    """

    accuracy: float
    epsilon: float
    sigma: float
    steps: int
    sample_rate: float
    clip: float | None


def pooled_sample_rate(batch_size: int, shard_sizes: Sequence[int]) -> float:
    """The pooled Poisson rate that matches a decentralised run's expected batch.

    Agent i samples its shard of n_i examples at q_i = min(1, B/n_i), so one round draws
    Σ_i min(B, n_i) examples in expectation out of Σ_i n_i: the pooled rate is their ratio,
    N·B/Σ_i n_i for N agents when every shard holds at least B examples, and equal to each
    q_i when the shards are equal.

    Args:
        batch_size: the agents' expected batch size B (≥ 1).
        shard_sizes: every agent's training shard size n_i (each ≥ 1).

    Returns:
        The pooled sample rate, in (0, 1].

    Raises:
        ValueError: on an empty ``shard_sizes``, B < 1 or a shard size < 1.
    """
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be an integer ≥ 1, got {batch_size!r}")
    sizes = list(shard_sizes)
    if not sizes:
        raise ValueError("shard_sizes must name at least one agent")
    if any(isinstance(n, bool) or int(n) != n or n < 1 for n in sizes):
        raise ValueError(f"every shard size must be an integer ≥ 1, got {sizes!r}")
    return sum(min(int(batch_size), int(n)) for n in sizes) / sum(int(n) for n in sizes)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """opacus' routine warnings off, here only: the secure-RNG notice of every
    :class:`~opacus.PrivacyEngine`, torch's note on the full backward hooks opacus registers
    when the inputs need no gradient, and the RDP accountant's optimum at the last order."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Secure RNG turned off")
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        warnings.filterwarnings("ignore", message="Optimal order is the")
        yield


def _check(
    train_x: Tensor,
    train_y: Tensor,
    test_x: Tensor,
    test_y: Tensor,
    sample_rate: float,
    steps: int,
    lr: float,
    clip: float | None,
    epsilon: float | None,
    delta: float,
    accountant: str,
) -> None:
    if len(train_x) != len(train_y) or len(train_x) < 1:
        raise ValueError(
            f"train_x and train_y must hold the same number (≥ 1) of examples, got "
            f"{len(train_x)} and {len(train_y)}"
        )
    if len(test_x) != len(test_y) or len(test_x) < 1:
        raise ValueError(
            f"test_x and test_y must hold the same number (≥ 1) of examples, got "
            f"{len(test_x)} and {len(test_y)}"
        )
    if not 0.0 < sample_rate <= 1.0:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    if isinstance(steps, bool) or int(steps) != steps or steps < 1:
        raise ValueError(f"steps must be an integer ≥ 1, got {steps!r}")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    if epsilon is None:
        return
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(
            f"epsilon must be a finite number > 0 (None: non-private), got {epsilon!r}"
        )
    if clip is None:
        raise ValueError("clip (the per-example gradient norm bound) is required when private")
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be a finite number > 0, got {clip!r}")
    limits.check_delta(delta)
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {tuple(ACCOUNTANTS)}, got {accountant!r}")


def _rng_devices(device: torch.device) -> list[int]:
    """The CUDA devices whose generators :func:`torch.random.fork_rng` must save."""
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


@torch.no_grad()
def _accuracy(model: nn.Module, x: Tensor, y: Tensor, device: torch.device) -> float:
    """Top-1 accuracy of ``model`` (in eval mode) on ``x``, ``y``, in chunks."""
    model.eval()
    correct = 0
    for start in range(0, len(x), EVAL_CHUNK):
        xb = x[start : start + EVAL_CHUNK].to(device)
        yb = y[start : start + EVAL_CHUNK].to(device)
        correct += int((model(xb).argmax(-1) == yb).sum())
    return correct / len(x)


def centralised_dpsgd(
    model: nn.Module,
    train_x: Tensor,
    train_y: Tensor,
    test_x: Tensor,
    test_y: Tensor,
    *,
    sample_rate: float,
    steps: int,
    lr: float,
    clip: float | None,
    epsilon: float | None,
    delta: float = 1e-5,
    accountant: str = "rdp",
    momentum: float = 0.0,
    seed: int = 0,
    device: str = "cpu",
    progress: bool = False,
) -> ReferenceResult:
    """Centralised DP-SGD (Abadi et al. 2016) on the pooled training data, at ``epsilon``.

    The reference of a privacy–utility table: what one trusted curator holding every agent's
    data achieves at the same (ε, δ), sample rate and number of steps. Exactly ``steps`` SGD
    steps on Poisson batches at rate ``sample_rate``, clipped and noised through opacus (the
    update, σ and the exact rate: the module docstring). With ``epsilon=None`` the
    non-private reference is trained on the same batches (the same ``seed`` draws the same
    batches); ``clip`` is then ignored and the result reports ``clip=None``. Deterministic
    in ``seed``; the caller's random state is left as it was.

    Args:
        model: a freshly initialised model; a copy is trained on ``device`` and the trained
            weights are loaded back into ``model``, which is left in eval mode. Its layers
            must be supported by opacus' per-example gradients (e.g. ``Conv2d``, ``Linear``,
            ``GroupNorm``; no ``BatchNorm``).
        train_x: pooled training inputs, already normalised as the model expects.
        train_y: their labels (class indices).
        test_x: test inputs, normalised as ``train_x``.
        test_y: their labels.
        sample_rate: Poisson sampling rate q in (0, 1] (see :func:`pooled_sample_rate`).
        steps: number of optimizer steps (≥ 1).
        lr: SGD learning rate.
        clip: per-example gradient norm bound C; required when private.
        epsilon: target ε, or ``None`` for the non-private reference.
        delta: target δ.
        accountant: ``"rdp"`` or ``"prv"``: opacus' accountant of that name finds σ and the
            ε spent (privaudit's two built-in accountants are opacus'; a plugin's accountant
            passes the name check but is not opacus', which refuses it with a ValueError).
        momentum: SGD momentum.
        seed: seed of the batches, the noise and the model's randomness.
        device: torch device to train and evaluate on (e.g. ``"cpu"``, ``"cuda"``).
        progress: show a progress bar of the steps.

    Returns:
        A :class:`ReferenceResult`: the test accuracy, the ε spent (opacus'
        ``PrivacyEngine.get_epsilon(delta)`` after training; ``math.inf`` when non-private),
        σ, the steps, q and C.

    Raises:
        ValueError: on a private run without ``clip``, an out-of-range argument, mismatched
            data, or a budget opacus cannot reach (σ past its search bound).
    """
    _check(
        train_x, train_y, test_x, test_y, sample_rate, steps, lr, clip, epsilon, delta, accountant
    )
    dev = torch.device(device)
    steps, q = int(steps), float(sample_rate)
    x, y = train_x.to(dev), train_y.to(dev).long()
    # two independent streams from one seed: the batches' generator, the global generators
    batch_seed, torch_seed = np.random.SeedSequence(seed).generate_state(2).tolist()

    with torch.random.fork_rng(devices=_rng_devices(dev)), _quiet():
        torch.manual_seed(torch_seed)
        batches = _poisson_batches(len(x), q, steps, batch_seed)
        work = copy.deepcopy(model).to(dev).train()
        optimizer = torch.optim.SGD(work.parameters(), lr=lr, momentum=momentum)
        sigma, engine, forward = 0.0, None, work
        if epsilon is not None:
            sigma, engine, forward, optimizer = _make_private(
                work, optimizer, x, y, q, steps, clip, epsilon, delta, accountant
            )
        name = "non-private reference" if engine is None else f"DP-SGD reference ε={epsilon:g}"
        _train(forward, optimizer, batches, x, y, engine is not None, q, (steps, name, progress))
        spent = math.inf if engine is None else float(engine.get_epsilon(delta))
        accuracy = _accuracy(work, test_x, test_y, dev)

    model.load_state_dict(work.state_dict())
    model.eval()
    return ReferenceResult(
        accuracy=accuracy,
        epsilon=spent,
        sigma=float(sigma),
        steps=steps,
        sample_rate=q,
        clip=None if engine is None else float(clip),
    )


def _poisson_batches(n: int, q: float, steps: int, seed: int) -> Iterable[list[int]]:
    """``steps`` Poisson batches of indices into n examples, each example in a batch with
    probability q (opacus' sampler, its own generator seeded ``seed``; empty batches
    included)."""
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    return UniformWithReplacementSampler(
        num_samples=n,
        sample_rate=q,
        generator=torch.Generator().manual_seed(seed),
        steps=steps,
    )


def _train(
    forward: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[list[int]],
    x: Tensor,
    y: Tensor,
    private: bool,
    q: float,
    progress: tuple[int, str, bool],
) -> None:
    """One optimizer step per batch of indices into ``x``, ``y``, on the cross-entropy: its
    mean when ``private`` (opacus re-scales the clipped sum by the expected batch size n·q),
    else its sum over n·q. ``progress`` is the progress bar's (total, description, shown)."""
    n = len(x)
    bar, task = text.progress(*progress)
    with bar:
        for index in batches:
            at = torch.as_tensor(index, dtype=torch.long, device=x.device)
            xb, yb = x[at], y[at]
            optimizer.zero_grad(set_to_none=True)
            if not private:
                loss = F.cross_entropy(forward(xb), yb, reduction="sum") / (n * q)
            else:
                loss = F.cross_entropy(forward(xb), yb)
            loss.backward()
            optimizer.step()
            bar.advance(task)


@functools.lru_cache(maxsize=64)
def _noise_multiplier(epsilon: float, delta: float, q: float, steps: int, accountant: str) -> float:
    """opacus' σ for (ε, δ) after ``steps`` steps at rate q: a bisection over the accountant,
    memoised, as a table asks for the same σ once per seed."""
    from opacus.accountants.utils import get_noise_multiplier

    return float(
        get_noise_multiplier(
            target_epsilon=epsilon,
            target_delta=delta,
            sample_rate=q,
            steps=steps,
            accountant=accountant,
        )
    )


def _make_private(
    work: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: Tensor,
    y: Tensor,
    q: float,
    steps: int,
    clip: float,
    epsilon: float,
    delta: float,
    accountant: str,
):
    """σ for (ε, δ) after ``steps`` steps at rate q, and ``work``/``optimizer`` made private
    by opacus, told the exact q (sampling is done by the caller)."""
    from opacus import PrivacyEngine

    sigma = _noise_multiplier(epsilon, delta, q, steps, accountant)
    engine = PrivacyEngine(accountant=accountant)
    loader = DataLoader(TensorDataset(x, y), batch_size=max(1, round(len(x) * q)))
    module, dp_optimizer, _ = engine.make_private(
        module=work,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=sigma,
        max_grad_norm=clip,
        poisson_sampling=True,
    )
    # opacus took q = 1/len(loader) and the denominator ⌊n·q⌋: use the exact q for both
    dp_optimizer.expected_batch_size = len(x) * q
    dp_optimizer.attach_step_hook(engine.accountant.get_optimizer_hook_fn(sample_rate=q))
    return sigma, engine, module, dp_optimizer


def reference_for(cfg: RunConfig, epsilon: float | None, progress: bool = False) -> ReferenceResult:
    """The reference of run ``cfg``: its dataset, evaluation split, model and seed; the pooled
    rate of its partition (:func:`pooled_sample_rate`), its rounds as steps, its ``lr`` and
    ``clip`` (defaults 0.05 and 1, the defenses' own); ``epsilon`` at the run's δ and
    accountant (None: the non-private reference)."""
    data = load_dataset(cfg.dataset, root=cfg.data_root, download=cfg.download)
    data = evaluation_split(data, cfg.eval_split, cfg.seed)
    parts = dirichlet_partition(
        data.train_y, cfg.agents, cfg.dirichlet_alpha, seed=cfg.seed, min_size=cfg.batch_size
    )
    model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
    raw = not normalizes_inputs(model)  # DLG's LeNet takes [0, 1] pixels, as in a Run
    mean = torch.tensor((0.0,) * len(data.mean) if raw else data.mean).view(-1, 1, 1)
    std = torch.tensor((1.0,) * len(data.std) if raw else data.std).view(-1, 1, 1)
    pooled = torch.cat(parts)
    return centralised_dpsgd(
        model,
        (data.train_x[pooled] - mean) / std,
        data.train_y[pooled],
        (data.test_x - mean) / std,
        data.test_y,
        sample_rate=pooled_sample_rate(cfg.batch_size, [len(p) for p in parts]),
        steps=cfg.rounds,
        lr=float(cfg.params.get("lr", 0.05)),
        clip=float(cfg.params.get("clip", 1.0)),
        epsilon=epsilon,
        delta=cfg.delta,
        accountant=cfg.accountant,
        seed=cfg.seed,
        device=cfg.device,
        progress=progress,
    )
