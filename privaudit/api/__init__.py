"""The Python API: observe a target's messages as a threat model sees them, attack them and
score the reconstructions (:mod:`.pipeline`); sweep defenses × rounds × ε (:mod:`.sweeps`),
the privacy–utility frontier (:mod:`.frontier`) and the paper's tables (:mod:`.reproduce`)."""
