"""Per-example gradients of many (model, batch) pairs (:class:`PairGrads`), by one of three
engines within a memory budget (:mod:`.memory`): :mod:`.pairs` evaluates them with
``torch.func`` (``vmap`` over pairs and examples), hands plain conv/linear nets on the CPU to
:mod:`.pairnet` (one stacked forward and backward, as opacus keeps ``grad_sample/`` beside its
functorch fallback), and large models such as ResNet-18 to :mod:`.ghost` (ghost clipping on
opacus' fast-gradient-clipping hooks, one pair at a time: no per-example gradient of the whole
model is ever held)."""

from privaudit.grads.pairs import PATHS, PairGrads, batch_loss_fn, clip_factors, clip_rows

__all__ = ["PATHS", "PairGrads", "batch_loss_fn", "clip_factors", "clip_rows"]
