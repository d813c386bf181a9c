"""Scores, statistical bounds, tables, figures and report pages (imports as
``privaudit.eval``). It works on results already computed: it depends on
:mod:`privaudit.core` alone and runs no simulation or attack (:mod:`privaudit.experiments`
and :mod:`privaudit.api` do).

- :mod:`.metrics`: reconstruction quality (MSE, PSNR, SSIM, LPIPS, label accuracy,
  matching); :mod:`.labelcounts`: how well a batch's label counts were recovered;
- :mod:`.bounds`: ε lower bounds from audit outcomes (Clopper–Pearson, Gaussian DP, one
  run); :mod:`.fdp`: f-DP trade-off functions and the one-run f-DP audit;
  :mod:`.canaries`: the canaries the white-box audit searches;
- :mod:`.membership_scoring`: membership inference scored (ROC, TPR at low FPR, the region
  (ε, δ)-DP allows, ε lower bounds) and the model-level scorers LOSS, LiRA and RMIA;
  :mod:`.membership_attacks`: the registry of model-level membership attacks
  (``privaudit mia --attack NAME``);
- :mod:`.report`: tables and figures of a comparison sweep; :mod:`.figures`: image grids;
  :mod:`.style`: the one figure style; :mod:`.page`: a report as data, written as HTML,
  Markdown and LaTeX.

Kept light on purpose: import the submodules you need, e.g.
``from privaudit.eval.metrics import score``. matplotlib and lpips are imported
lazily inside the functions that use them.
"""
