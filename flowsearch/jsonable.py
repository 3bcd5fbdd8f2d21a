r"""One JSON form for every result the CLI prints and the server returns.

Results hold numpy scalars and, for figures that could not be computed, NaN or infinity (not
valid JSON): :func:`to_json` turns both into plain JSON (non-finite numbers become null), so
``--json`` and the HTTP API print the same document.

Example:
    >>> to_json({"score": np.float32(0.5), "gap": float("nan"), "rows": np.int64(3)})
    '{"score": 0.5, "gap": null, "rows": 3}'
    >>> find_in_json({"a": [1, {"b": float("nan")}]}, lambda v: v != v)
    ('a', 1, 'b')
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from typing import TypeAlias

import numpy as np
from typing_extensions import TypeAliasType  # typing.TypeAliasType is 3.12+

__all__ = ["JSONObject", "JSONValue", "find_in_json", "json_safe", "to_json"]

#: A parsed JSON value: what :func:`json.loads` returns. A named alias (not a bare string), so
#: that pydantic fields may hold it too (``dict[str, JSONValue]``: validated and written back as
#: the same JSON).
JSONValue = TypeAliasType(
    "JSONValue", "None | bool | int | float | str | list[JSONValue] | dict[str, JSONValue]"
)
#: A parsed JSON object.
JSONObject: TypeAlias = dict[str, JSONValue]


def json_safe(value: object) -> object:
    """``value`` with numpy scalars as Python numbers and non-finite floats as None (dicts,
    lists and tuples item by item). Anything else is given back as it is, for ``json.dumps``'s
    ``default=`` to name: so not a :data:`JSONValue` (nor are a dict's keys made strings)."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def to_json(value: object) -> str:
    """The JSON text of ``value`` (see :func:`json_safe`; anything else unknown as ``str``)."""
    return json.dumps(json_safe(value), ensure_ascii=False, default=str, allow_nan=False)


def find_in_json(value: object, bad: Callable[[object], bool]) -> tuple[str | int, ...] | None:
    """The keys (dict keys, list positions) leading to the first leaf of a parsed JSON value
    that ``bad`` holds true of (``()``: the value itself), or None."""
    if isinstance(value, dict):
        items: Iterable[tuple[str | int, object]] = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return () if bad(value) else None
    for key, item in items:
        found = find_in_json(item, bad)
        if found is not None:
            return (key, *found)
    return None
