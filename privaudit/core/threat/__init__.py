"""Threat models: who sees which messages (README, "Threat models: who listens").

A threat model decides two things: which links the tap must record for an attack on a
target message, and which of the recorded messages go into the adversary"s :class:`View`.
The View holds those messages plus the public parameters (W, η, β, σ, C, B, the
architecture and the shared initial model); secrets never enter it.

Four adversaries are built in, weakest first (the registry :data:`THREATS`; a plugin may
register more with :func:`register_threat`):

- ``link``: an eavesdropper on one undirected link ``a ↔ b`` (both directions);
- ``neighbor``: one honest-but-curious agent ``a`` — every message on its links, both what
  it sends and what it receives; its private state (data, batches, noise draws, values it
  never sends) is not in the View;
- ``coalition``: a set of agents pooling what each of them sees;
- ``global``: every message on every link.

A threat model"s own methods (:data:`HOOKS`: ``sees``, ``build``, ``for_victim``, ``who``,
``describe``) are guarded wherever they are called: a plugin"s that raises — or a ``sees``
that answers anything but True or False — is one line naming the threat model, its plugin,
the method and the exception (:mod:`privaudit.core.extensions`), not a privaudit bug.
"""

from privaudit.core.threat.base import (
    HOOKS,
    THREATS,
    Key,
    Public,
    Threat,
    View,
    build_threat,
    get_threat,
    parse_link,
    parse_links,
    register_threat,
    threat_help,
    threat_names,
    victim_threat,
)

# isort: split
from privaudit.core.threat.coalition import Coalition
from privaudit.core.threat.everyone import Global
from privaudit.core.threat.link import Link
from privaudit.core.threat.neighbor import Neighbor

__all__ = [
    "Coalition",
    "Global",
    "HOOKS",
    "Key",
    "Link",
    "Neighbor",
    "Public",
    "THREATS",
    "Threat",
    "View",
    "build_threat",
    "get_threat",
    "parse_link",
    "parse_links",
    "register_threat",
    "threat_help",
    "threat_names",
    "victim_threat",
]
