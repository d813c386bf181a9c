"""The engine: a run (:mod:`.run`) driven by one round loop (:mod:`.loop`) in one process or
one process per agent over torch.distributed (:mod:`.distributed`), its run directory with
manifest and writer lock, and the ``<defense>-<kind>`` target registry."""
