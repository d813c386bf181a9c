"""Per-example gradients of many (model, batch) pairs: :mod:`.pairs` evaluates them with
``torch.func`` (``vmap`` over pairs and examples) and hands plain conv/linear nets on the CPU
to :mod:`.pairnet`, one stacked forward and backward — as opacus keeps ``grad_sample/``
beside its functorch fallback."""

from privaudit.grads.pairs import PairGrads, batch_loss_fn, clip_factors, clip_rows

__all__ = ["PairGrads", "batch_loss_fn", "clip_factors", "clip_rows"]
