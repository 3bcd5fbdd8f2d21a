"""The ``flowsearch`` command line: parses arguments, calls the library, prints what it returns.

May import the library's public layers; holds no logic of its own.
"""

from flowsearch.cli import engine as _engine  # noqa: F401 - registers its commands
from flowsearch.cli import evaluate as _evaluate  # noqa: F401 - registers `eval`
from flowsearch.cli.app import app, main

__all__ = ["app", "main"]
