"""The release's version string (the package face re-exports it as ``flowsearch.__version__``)."""

__version__ = "0.3.0"
