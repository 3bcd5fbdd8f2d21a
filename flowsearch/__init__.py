"""flowsearch: semantic search over a calibrated index (BERT-flow, Li et al. 2020)."""

from __future__ import annotations

__version__ = "0.1.0"
