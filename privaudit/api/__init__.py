"""The Python API behind the commands, for scripts and notebooks; each submodule is imported
on its own (this package imports none of them).

- :mod:`.pipeline`: observe a target's messages as a threat model sees them, attack them and
  score the reconstructions (``privaudit attack``); :mod:`.gossip`: the gossip algebra that
  reaches a victim past the attacker's neighbourhood; :mod:`.distance`: privacy against
  graph distance (audit bounds and attack PSNR hop by hop);
- :mod:`.message_membership`: membership and label leakage of the messages (``privaudit mia``);
  :mod:`.model_membership`: model-level membership inference with reference ("shadow") runs;
  both return a :class:`.membership_result.MembershipResult`;
- :mod:`.sweeps`: plan, run and cache a comparison sweep, targets × rounds × ε × seeds
  (``privaudit compare``), whose tasks run where :mod:`.executor` puts them (this process or
  a Ray cluster, checked first by :mod:`.cluster`); :mod:`.cache`: cache entries read only
  when they hold what privaudit wrote, by the code running now;
- :mod:`.frontier`: privacy–utility frontiers against the centralised DP-SGD and
  non-private references; :mod:`.reproduce`: published attack tables reproduced beside the
  published numbers;
- :mod:`.report`: ``privaudit report``, what a run or a study showed, as one page.
"""
