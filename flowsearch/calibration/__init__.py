"""Calibrators: map raw sentence vectors to a space where cosine similarity behaves.

Owns the calibration math only: fitting, the map, its inverse, the log-density, and saving and
loading a calibrator's own files. It knows nothing of indexes, manifests or the ``auto`` policy,
and imports only ``flowsearch.errors`` and ``flowsearch.atomic``.

All calibrators share one protocol (:class:`Calibrator`: ``fit``, ``transform``, ``inverse``,
``log_prob``, ``save``) and one registry (:func:`make_calibrator`, :func:`load_calibrator`,
:func:`names`). The flows (``flow``, ``whitening-flow``) are small steps composed
(:mod:`~flowsearch.calibration.stepmath`, :mod:`~flowsearch.calibration.glowmath`): fitting
one imports torch, loading and running one does not (its steps run frozen in numpy); the linear
ones need numpy only. ``docs/CALIBRATION.md`` tells why each is as it is.
"""

from __future__ import annotations

from flowsearch.calibration import flow as _flow  # noqa: F401 - registers the flows
from flowsearch.calibration import linear as _linear  # noqa: F401 - registers the linear ones
from flowsearch.calibration.base import CALIBRATORS, Calibrator, make_calibrator, names
from flowsearch.calibration.loader import load as load_calibrator

__all__ = ["CALIBRATORS", "Calibrator", "load_calibrator", "make_calibrator", "names"]
