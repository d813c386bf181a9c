"""Scoring, accounting, auditing and figures (imports as ``privaudit.eval``).

Kept light on purpose: import the submodules you need, e.g.
``from privaudit.eval.metrics import score``. matplotlib and lpips are imported
lazily inside the functions that use them.
"""
