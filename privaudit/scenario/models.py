"""The architectures the sources attack and train.

- ``lenet``: the DLG paper's LeNet (Zhu et al. 2019, official code): three 5×5 convolutions
  with sigmoid activations and one linear layer, every weight and bias drawn from
  uniform(−0.5, 0.5). Smooth and twice differentiable: the classic inversion target. Like
  DLG's code (``transforms.ToTensor()`` only) it takes raw [0, 1] pixels: mean/std
  normalisation multiplies inputs by ≈ 4 and saturates the sigmoids (iDLG at 32×32 then
  drops from 34–57 dB to 7–22 dB PSNR on the embedded photos).
- ``cnn``: the DPDL-style CNN (DPDL §VI: "two conv layers, each followed by max-pooling, then
  a fully connected layer"); the paper's widths are stripped, ours are 32 and 64 channels,
  5×5 kernels, ReLU (named parameters ``width1``/``width2``).
- ``tanh-cnn``: the DP-SGD model of Papernot et al. 2021 ("Tempered Sigmoid Activations for
  Deep Learning with Differential Privacy", AAAI; Table 1, MNIST): conv 16 8×8 stride 2 (pad
  3), max-pool 2×2 stride 1, conv 32 4×4 stride 2, max-pool 2×2 stride 1, FC 32, FC classes,
  with tanh (the tempered sigmoid with s = 2, T = 2, o = 1) after every layer but the last.
  Bounded activations keep per-example gradient norms small and steady, so clipping
  discards little — the model privaudit trains its operating points with. Sized for any
  ``input_shape`` by a probe; PyTorch's default initialisation.
- ``resnet18``: torchvision's ResNet-18 with a CIFAR stem (3×3 stride-1 first convolution,
  no max-pool). BatchNorm is replaced by GroupNorm because per-example gradients — which DP
  clipping needs — are undefined with batch statistics (the same substitution opacus makes).
- ``fedavg-cnn``: the CNN of McMahan et al. 2017 ("Communication-Efficient Learning of Deep
  Networks from Decentralized Data", AISTATS, §3): conv 5×5 32 (same padding), ReLU, max-pool
  2×2, conv 5×5 64, ReLU, max-pool 2×2, FC 512 ReLU, FC classes — 1,663,370 parameters on
  MNIST, as the paper counts. Sized for any ``input_shape`` by a probe; PyTorch's default
  initialisation. Its wide FC 512 layer's gradient has rank B for B ≤ 512: the layer a batch
  disaggregation attack separates (:mod:`privaudit.attacks.cpa`, :mod:`privaudit.attacks.spear`).
- ``mlp``: the paper's "2NN": two hidden layers of 200 units with ReLU (199,210 parameters
  on MNIST); the input is flattened, so any ``input_shape`` fits. Its first layer's gradient is
  a sum of B outer products with the examples themselves.
- ``linear``: one Linear layer on the flattened input (multinomial logistic regression), the
  model of El Mrini, Cyffers & Bellet's D-GD experiments (ICML 2024, Fig. 4a and 6): its
  gradient on one example is ∂b xᵀ, which inverts in closed form
  (:mod:`privaudit.attacks.analytic`), so their attack beyond the neighbourhood runs on it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from privaudit.core.errors import unknown


class LeNet(nn.Module):
    """DLG's LeNet (sigmoid), sized for any ``input_shape``; raw [0, 1] inputs."""

    normalize_inputs = False

    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        c, h, w = input_shape
        self.body = nn.Sequential(
            nn.Conv2d(c, 12, kernel_size=5, padding=2, stride=2),
            nn.Sigmoid(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=2),
            nn.Sigmoid(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=1),
            nn.Sigmoid(),
        )
        with torch.no_grad():
            feat = self.body(torch.zeros(1, c, h, w)).numel()
        self.fc = nn.Linear(feat, num_classes)
        for p in self.parameters():  # DLG's weights_init: uniform(-0.5, 0.5) on every tensor
            nn.init.uniform_(p, -0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x).flatten(1))


class DPDLCNN(nn.Module):
    """conv–pool–conv–pool–FC (DPDL §VI); widths are an open choice, documented above."""

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, width1: int = 32, width2: int = 64
    ):
        super().__init__()
        c, h, w = input_shape
        self.body = nn.Sequential(
            nn.Conv2d(c, width1, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width1, width2, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.fc = nn.Linear(width2 * (h // 4) * (w // 4), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x).flatten(1))


class TanhCNN(nn.Module):
    """Papernot et al.'s tempered-sigmoid (tanh) CNN for DP-SGD (module docstring)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        c, h, w = input_shape
        self.body = nn.Sequential(
            nn.Conv2d(c, 16, 8, stride=2, padding=3),
            nn.Tanh(),
            nn.MaxPool2d(2, 1),
            nn.Conv2d(16, 32, 4, stride=2),
            nn.Tanh(),
            nn.MaxPool2d(2, 1),
        )
        with torch.no_grad():
            feat = self.body(torch.zeros(1, c, h, w)).numel()
        self.head = nn.Sequential(nn.Linear(feat, 32), nn.Tanh(), nn.Linear(32, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).flatten(1))


class FedAvgCNN(nn.Module):
    """McMahan et al.'s CNN (module docstring), sized for any ``input_shape``."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        c, h, w = input_shape
        self.body = nn.Sequential(
            nn.Conv2d(c, 32, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        with torch.no_grad():
            feat = self.body(torch.zeros(1, c, h, w)).shape[1]
        self.head = nn.Sequential(nn.Linear(feat, 512), nn.ReLU(), nn.Linear(512, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class MLP(nn.Module):
    """McMahan et al.'s 2NN: 200-200 ReLU (module docstring); ``width`` is an open choice."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: int = 200):
        super().__init__()
        d = 1
        for s in input_shape:
            d *= int(s)
        self.body = nn.Sequential(
            nn.Flatten(),
            nn.Linear(d, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def linear(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """One Linear layer on the flattened input (module docstring); default initialisation."""
    d = 1
    for s in input_shape:
        d *= int(s)
    return nn.Sequential(nn.Flatten(), nn.Linear(d, num_classes))


def resnet18_cifar(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """torchvision ResNet-18, CIFAR stem, GroupNorm (see module docstring)."""
    from torchvision.models import resnet18

    model = resnet18(num_classes=num_classes, norm_layer=lambda ch: nn.GroupNorm(32, ch))
    model.conv1 = nn.Conv2d(input_shape[0], 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


MODELS: dict[str, Callable[[tuple[int, ...], int], nn.Module]] = {
    "lenet": LeNet,
    "cnn": DPDLCNN,
    "tanh-cnn": TanhCNN,
    "resnet18": resnet18_cifar,
    "fedavg-cnn": FedAvgCNN,
    "mlp": MLP,
    "linear": linear,
}


def normalizes_inputs(model: nn.Module) -> bool:
    """Whether the model is fed mean/std-normalised pixels (all but DLG's LeNet)."""
    return getattr(model, "normalize_inputs", True)


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, seed: int = 0
) -> nn.Module:
    """A freshly initialised model, deterministic in ``seed``, in eval mode."""
    if name not in MODELS:
        raise unknown("model", name, MODELS)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MODELS[name](tuple(input_shape), num_classes)
    return model.eval()
