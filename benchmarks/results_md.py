"""Kept for scripts written before :mod:`harness`: publishing lives there now."""

from __future__ import annotations

from harness import publish, write_section

__all__ = ["publish", "write_section"]
