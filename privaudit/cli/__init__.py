"""The ``privaudit`` command: one module per command, the options they share in
:mod:`.options`; commands import options, never each other."""

from privaudit.cli.app import main

__all__ = ["main"]
