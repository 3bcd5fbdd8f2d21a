r"""The encoder's options and their checks: poolings, backends, quantisation, input texts.

Every check raises :class:`~flowsearch.errors.BadInput` naming the parameter at fault, before
any file is read or model loaded.

Example:
    >>> check_options("mean", 64, "onnx", "int8", "raw")
    >>> check_options("mean", 64, "auto", "int8", "raw")
    >>> check_options("mean", None, "torch", "int8", "raw")
    Traceback (most recent call last):
    ...
    flowsearch.errors.BadInput: quantize='int8' needs backend='onnx'; pass backend='onnx'
    >>> checked_texts("one text")
    ['one text']
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal, get_args

from flowsearch.encode.static import STATIC_VARIANTS
from flowsearch.errors import BadInput, check_text

__all__ = [
    "BACKENDS",
    "POOLINGS",
    "RUNTIMES",
    "QUANTIZATIONS",
    "Backend",
    "Pooling",
    "Quantize",
    "check_options",
    "check_poolings",
    "checked_texts",
]

Pooling = Literal["cls", "mean", "last2avg", "first_last_avg", "static", "embedding_layer"]
#: The pooling names, in the order tables list them.
POOLINGS: tuple[str, ...] = get_args(Pooling)
Backend = Literal["auto", "torch", "onnx"]
#: What ``backend`` accepts: ``auto`` (the default: ONNX Runtime fp32 on the CPU, torch on
#: CUDA) or a runtime by name.
BACKENDS: tuple[str, ...] = get_args(Backend)
#: The runtimes a transformer runs on (what ``auto`` resolves to and an index records).
RUNTIMES: tuple[str, ...] = ("torch", "onnx")
Quantize = Literal["int8"]
#: The quantisations the ONNX backend offers.
QUANTIZATIONS: tuple[str, ...] = get_args(Quantize)


def _one_of(choices: Iterable[str]) -> str:
    return ", ".join(choices)


def check_options(
    pooling: str, max_length: int | None, backend: str, quantize: str | None, variant: str
) -> None:
    """Refuses an unknown or inconsistent combination of :class:`Encoder` options.

    Raises:
        BadInput: an unknown pooling, backend, quantisation or static variant; a
            ``max_length`` below 2; ``quantize`` without ONNX; ``static`` with ONNX.
    """
    if pooling not in POOLINGS:
        raise BadInput(
            f"unknown pooling {pooling!r}", f"choose one of {_one_of(POOLINGS)}", param="pooling"
        )
    if max_length is not None and (
        isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2
    ):
        raise BadInput(
            f"max_length must be an integer >= 2, got {max_length!r}",
            "pass {max_length} of 2 or more, or none for the model's own limit",
            param="max_length",
        )
    if backend not in BACKENDS:
        raise BadInput(
            f"unknown backend {backend!r}", f"choose one of {_one_of(BACKENDS)}", param="backend"
        )
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise BadInput(
            f"unknown quantize {quantize!r}",
            f"choose one of {_one_of(QUANTIZATIONS)} or none",
            param="quantize",
        )
    if quantize is not None and backend == "torch":
        raise BadInput(
            f"quantize={quantize!r} needs backend='onnx'", "pass {backend='onnx'}", param="backend"
        )
    if quantize is not None and pooling == "static":
        raise BadInput(
            f"quantize={quantize!r} quantises a transformer, and pooling 'static' runs none",
            "drop {quantize}",
            param="quantize",
        )
    if backend == "onnx" and pooling == "static":
        raise BadInput(
            "pooling 'static' is a table lookup that runs no model, so backend 'onnx' has "
            "nothing to run",
            "use {backend='torch'} with it",
            param="backend",
        )
    if variant not in STATIC_VARIANTS:
        raise BadInput(
            f"unknown static variant {variant!r}",
            f"choose one of {_one_of(STATIC_VARIANTS)}",
            param="static_variant",
        )


def check_poolings(poolings: Sequence[str]) -> None:
    """Refuses a pooling name not in :data:`POOLINGS` (``BadInput``)."""
    for pooling in poolings:
        if pooling not in POOLINGS:
            raise BadInput(
                f"unknown pooling {pooling!r}",
                f"choose from {_one_of(POOLINGS)}",
                param="poolings",
            )


def checked_texts(texts: Sequence[str] | str) -> list[str]:
    """The texts as a list of strings (a single string is a list of one).

    Raises:
        BadInput: ``texts`` is None, not iterable, or holds something other than a string.
    """
    if isinstance(texts, str):
        return [texts]
    if texts is None:
        raise BadInput("texts is None", "pass a list of strings", param="texts")
    try:
        items = list(texts)
    except TypeError as exc:
        raise BadInput(
            f"texts must be a list of strings, got {type(texts).__name__}", param="texts"
        ) from exc
    for i, text in enumerate(items):
        if not isinstance(text, str):
            raise BadInput(
                f"texts[{i}] is {type(text).__name__}, not a string",
                "drop or convert non-text entries first",
                param="texts",
            )
        check_text(text, f"texts[{i}]", "texts")
    return items
