"""One exception type for every user-facing error: the CLI prints its message on one line."""


class PrivauditError(Exception):
    """A bad input or a broken file. The message names the problem and the fix."""


class Interrupted(PrivauditError):
    """A stop request (Ctrl-C, SIGTERM) ended a run at a round boundary; it can resume."""


class Unobservable(PrivauditError):
    """An adversary cannot see the message asked for (not on its links, not sent that
    round). The one error a search over threat models may pass over: anything else — an
    interrupt, a corrupt or locked run — ends the search."""


class NameTaken(PrivauditError):
    """A registry (of defenses or of attacks) already holds ``name``: registering it again
    would silently replace what is there (:mod:`privaudit.plugins` names the owner)."""

    def __init__(self, what: str, name: str):
        super().__init__(f"{what} name {name!r} is already taken; choose another name")
        self.what = what
        self.name = name


def unknown(kind: str, name: str, valid) -> PrivauditError:
    """The error for a name that is not in a registry, listing the valid names."""
    return PrivauditError(f"unknown {kind} {name!r}; choose one of: {', '.join(sorted(valid))}")


# how to bring back a defense or attack that only a plugin registers (privaudit.plugins)
PLUGIN_ENV = "PRIVAUDIT_PLUGINS"
PLUGIN_DOCS = "docs/extending.md"
MISSING = (
    "a defense or attack from a plugin must be loaded again: privaudit --plugin FILE.py "
    f"<command> …, {PLUGIN_ENV}=FILE.py, or pip install its package ({PLUGIN_DOCS})"
)
