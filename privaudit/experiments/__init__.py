"""Experiment drivers: they run the engine to measure something (imports as
``privaudit.experiments``).

- :mod:`.audit`: the white-box and one-run canary audits (re-runs of rounds with canaries),
  built from :mod:`.canary_grads` (the canary where gradients are computed),
  :mod:`.audit_setting` (the audited message), :mod:`.audit_trials` (the trials) and
  :mod:`.audit_stats` (trial counts, bounds, verdicts); its result, typed:
  :mod:`.audit_result`;
- :mod:`.final_audit`: the final-model audit (a canary in every round, only the final models
  observed: the hidden-state threat model);
- :mod:`.claims`: the claims ledger (every defense's claim against accounting and audit),
  built from :mod:`.claims_plan` (the rows and their settings), :mod:`.claims_row` (one
  row), :mod:`.claims_final` (the final-model column) and :mod:`.claims_cache`;
- :mod:`.ledger_text`: the ledger as text (its Markdown and the terminal table);
- :mod:`.centralised`: centralised DP-SGD and non-private references beside a decentralised run.

Scoring that needs no engine — metrics, bounds, figures, membership scores — lives in
:mod:`privaudit.eval`.
"""
