r"""One JSON form for every result the CLI prints and the server returns.

Results hold numpy scalars and, for figures that could not be computed, NaN or infinity (not
valid JSON): :func:`to_json` turns both into plain JSON (non-finite numbers become null), so
``--json`` and the HTTP API print the same document.

Example:
    >>> to_json({"score": np.float32(0.5), "gap": float("nan"), "rows": np.int64(3)})
    '{"score": 0.5, "gap": null, "rows": 3}'
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

__all__ = ["json_safe", "to_json"]


def json_safe(value: Any) -> Any:
    """``value`` with numpy scalars as Python numbers and non-finite floats as None."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def to_json(value: Any) -> str:
    """The JSON text of ``value`` (see :func:`json_safe`; anything else unknown as ``str``)."""
    return json.dumps(json_safe(value), ensure_ascii=False, default=str, allow_nan=False)
