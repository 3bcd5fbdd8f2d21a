"""The ``flowsearch`` command line: parses arguments, calls the library, prints what it returns.

``app`` holds the command group, the error mapping and :func:`main`; ``options`` the options the
commands share and every choice list (each read from the module that owns it); ``output`` what is
printed and how. The commands: ``search`` (query, info), ``writes`` (index, add, upsert, delete,
compact, recalibrate), ``snapshots`` (snapshot, restore), ``export``, ``serve``, ``evaluate``
(eval). May import every layer below; holds no logic of its own.
"""

from flowsearch.cli import evaluate, export, search, serve, snapshots, writes  # noqa: F401 - register
from flowsearch.cli.app import app, main

__all__ = ["app", "main"]
