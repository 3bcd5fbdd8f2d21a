"""Calibrators: map raw sentence vectors to a space where cosine similarity behaves.

All share one protocol (:class:`Calibrator`: ``fit``, ``transform``, ``inverse``, ``log_prob``,
``save``) and one registry (:func:`make_calibrator`, :func:`load_calibrator`).
"""

from __future__ import annotations

from flowsearch.calibration import linear as _linear  # noqa: F401 - registers the linear ones
from flowsearch.calibration.base import (
    CALIBRATORS,
    Calibrator,
    load_calibrator,
    make_calibrator,
    names,
)

__all__ = ["CALIBRATORS", "Calibrator", "load_calibrator", "make_calibrator", "names"]
