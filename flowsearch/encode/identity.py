r"""What identifies an encoder's vectors, and how an index's record of it is checked.

An index records the fields :meth:`~flowsearch.encode.encoder.Encoder.describe` returns: the
core five (``model``, ``revision``, ``pooling``, ``max_length``, ``dim``) and options
(``variant``, ``backend``, ``quantize``; older indexes lack some). A query must come from an
encoder that describes itself the same way, except that a model directory may move: then its
content hash (``revision``) still has to match. Plain mappings only: nothing here knows how an
index stores the record.

The runtime (``backend``) names how the vectors were computed, not what they are: torch and ONNX
Runtime in fp32 run the same graph and agree to float rounding (``tests/test_onnx_backend.py``
checks 1e-4 on every pooling), so an fp32 record reopens on the fastest exact runtime here
(``auto``: ONNX Runtime on the CPU) whichever built it, and is not compared on it. Only
``int8`` changes the vectors: a quantised record reopens as recorded and must match.

Example:
    >>> recorded = {"model": "m", "revision": "abc", "pooling": "mean", "max_length": 64,
    ...             "dim": 8, "variant": None, "backend": "torch", "quantize": None}
    >>> reopen_options(recorded)
    {'pooling': 'mean', 'max_length': 64}
    >>> first_difference(dict(recorded, backend="onnx"), recorded, relocated=False) is None
    True
    >>> first_difference(dict(recorded, pooling="cls"), recorded, relocated=False)
    ('pooling', 'cls', 'mean')
    >>> first_difference(dict(recorded, quantize="int8"), recorded, relocated=False)
    ('quantize', 'int8', None)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flowsearch.encode.static import STATIC_VARIANTS
from flowsearch.errors import BadInput

__all__ = ["CORE_FIELDS", "first_difference", "mismatch_error", "reopen_options"]

#: The fields every recorded encoder has.
CORE_FIELDS = ("model", "revision", "pooling", "max_length", "dim")
# Recorded options passed to the Encoder again on reopening (``variant`` is mapped apart).
_REOPEN_OPTIONS = ("backend", "quantize")


def reopen_options(described: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments that rebuild the recorded encoder (all but the model's place).

    Args:
        described: the recorded fields (see the module docstring).

    Returns:
        ``pooling`` and ``max_length``, ``backend``/``quantize`` when the record is quantised
        (an fp32 record takes the default runtime, ``auto``), and
        ``static_variant`` for a transformer's static table (a Model2Vec directory's variant
        comes from the directory itself).
    """
    options: dict[str, Any] = {
        "pooling": str(described["pooling"]),
        "max_length": int(described["max_length"]),
    }
    if described.get("quantize") is not None:
        for key in _REOPEN_OPTIONS:
            if described.get(key) is not None:
                options[key] = described[key]
    variant = described.get("variant")
    if options["pooling"] == "static" and variant in STATIC_VARIANTS:
        options["static_variant"] = variant
    return options


def first_difference(
    got: Mapping[str, Any], want: Mapping[str, Any], *, relocated: bool
) -> tuple[str, Any, Any] | None:
    """The first recorded field an encoder's description differs in, as ``(field, got,
    want)``, or None when it matches.

    Args:
        got: the encoder's :meth:`~flowsearch.encode.encoder.Encoder.describe`.
        want: the recorded fields; a field absent from the record is not compared.
        relocated: the model was named by another place than the record's (a moved
            directory): its name is not compared, its ``revision`` still is.

    ``backend`` is compared only when either side is quantised (see the module docstring).
    """
    exact = got.get("quantize") is None and want.get("quantize") is None
    for key, wanted in want.items():
        if (key == "model" and relocated) or (key == "backend" and exact):
            continue
        if got.get(key) != wanted:
            return key, got.get(key), wanted
    return None


def mismatch_error(
    difference: tuple[str, Any, Any], *, reused: bool, moved_to: str | None
) -> BadInput:
    """The error for an encoder that differs from the index's record.

    Args:
        difference: ``(field, the encoder's value, the index's value)``.
        reused: the encoder was passed in by the caller (not built from the record).
        moved_to: where the caller said the model now is, if they did.
    """
    key, got, want = difference
    if moved_to is not None:
        return BadInput(
            f"the model at {moved_to} has {key} {got!r}, the index's has {want!r}",
            "pass {model=DIR} where DIR holds the index's own model, or rebuild the index",
            param="model",
        )
    if reused:
        return BadInput(
            f"encoder {key} {got!r} differs from the index's {want!r}",
            "pass an encoder built like the index's (or none), or rebuild the index",
            param="encoder",
        )
    return BadInput(
        f"encoder {key} {got!r} differs from the index's {want!r}: its model changed since the "
        "index was built",
        "restore the model, pass {model=DIR} where DIR holds the index's own model, "
        "or rebuild the index",
        param="model",
    )
