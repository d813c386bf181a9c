"""How well a batch's label counts were recovered: pure functions of two label lists.

A label-inference attack (:mod:`privaudit.attacks.labels`) returns a batch's labels as a
multiset: which example carries which label is not identifiable from a gradient, only how
many examples each class has. Both scores therefore compare the two label *histograms*
``n_c = #{b : y_b = c}`` over ``num_classes`` classes:

- :func:`count_accuracy`: the fraction of classes whose count is exactly right (absent
  classes included: predicting a class that is not there, or missing one, is an error).
  This is iLRG's "LnAcc" (Ma et al. 2023, ICLR; in its code, ``accuracy_score`` over the
  classes' counts), the per-class score the label-count goal of issue 33 is stated in.
- :func:`count_tv`: the total-variation distance ``½ Σ_c |n̂_c/B̂ − n_c/B|`` between the two
  normalised histograms, in [0, 1]: the fraction of examples whose label would have to
  change to turn one histogram into the other (when both count B examples). It says how
  far wrong counts are, where :func:`count_accuracy` only says how many are wrong.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from privaudit.core.errors import PrivauditError

__all__ = ["count_accuracy", "count_tv", "histogram"]

Labels = Tensor | Sequence[int]


def histogram(labels: Labels, num_classes: int) -> Tensor:
    """The count of each class among ``labels`` -> (num_classes,) int64."""
    if num_classes < 1:
        raise PrivauditError(f"num_classes must be at least 1, got {num_classes}")
    y = torch.as_tensor(labels).reshape(-1)
    if y.dtype == torch.bool or (y.is_floating_point() and not bool((y == y.round()).all())):
        raise PrivauditError("labels must be integer class indices, not scores or masks")
    y = y.long().cpu()
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise PrivauditError(
            f"labels must lie in [0, {num_classes}); got {int(y.min())}..{int(y.max())}: "
            "pass the model's num_classes"
        )
    return torch.bincount(y, minlength=num_classes)


def count_accuracy(pred_labels: Labels, true_labels: Labels, num_classes: int) -> float:
    """Fraction of the ``num_classes`` classes whose predicted count equals the true one."""
    pred, true = histogram(pred_labels, num_classes), histogram(true_labels, num_classes)
    return float((pred == true).double().mean())


def count_tv(pred_labels: Labels, true_labels: Labels, num_classes: int) -> float:
    """Total-variation distance between the normalised label histograms, in [0, 1]."""
    pred, true = histogram(pred_labels, num_classes), histogram(true_labels, num_classes)
    if int(pred.sum()) == 0 or int(true.sum()) == 0:
        raise PrivauditError("count_tv needs at least one label on each side")
    return float(0.5 * (pred / pred.sum() - true / true.sum()).abs().sum())
