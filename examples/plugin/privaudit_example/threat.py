"""``inbox``: a threat model as a privaudit plugin (docs/extending.md).

A passive observer of everything one or more agents *receive* — a compromised inbox, or a
relay that forwards each agent's incoming traffic — but not what they send. It sits between
``link`` and ``neighbor``: a neighbour also sees its own outgoing messages, which for
DPDL's cross-gradient (evaluated at the receiver's model, sent in the clear) is exactly what
makes the message attackable; ``--threat inbox`` shows the attack fail there.
"""

from __future__ import annotations

from dataclasses import dataclass

from privaudit.core.threat import Threat, register_threat


@register_threat
@dataclass(frozen=True)
class Inbox(Threat):
    """Every message whose receiver is one of ``agents``."""

    name = "inbox"
    strength = 5  # between link (0) and neighbor (10)
    summary = "what some agents receive, not what they send"

    def sees(self, src: int, dst: int) -> bool:
        return dst in self.agents
