"""An example privaudit plugin (docs/extending.md): the defenses ``cta-dpsgd`` and
``cta-dpsgd-halfnoise`` (:mod:`.defense`) and the attack ``guess`` (:mod:`.attack`)."""
