"""The engine: a run (:mod:`.run`) driven by one round loop (:mod:`.loop`) in one process or
one process per agent over torch.distributed (:mod:`.distributed`), copies of a run simulated
again in this process (:mod:`.copies`: the audits' trials, reference runs), its run directory
with manifest and writer lock, and the ``<defense>-<kind>`` target registry."""
