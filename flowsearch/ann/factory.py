r"""Choosing a vector index: ``auto``'s factory by segment size, and checking a user's factory.

Every index here is FAISS with inner product on L2-normalised vectors (cosine similarity), and
its ids are the segment's local rows, assigned in insertion order. ``"auto"`` chooses per
segment, by the :class:`~flowsearch.ann.policy.AnnPolicy` a write is given: exact ``Flat`` up to
``flat_max_rows`` rows (a segment's own size, so an index of many segments gets an approximate
index in each of its larger ones); above that its ``graph_factory`` (``HNSW32``, ``efSearch``
tuned by :func:`flowsearch.ann.tune.tune`); above ``graph_max_rows``, IVF-PQ with an exact
re-rank (:func:`large_factory`). Why these (measured): ``docs/SCALE.md``.

Example:
    >>> auto_factory(1_000)
    'Flat'
    >>> large_factory(1_000_000, 384)
    'IVF1024,PQ48,RFlat'
"""

from __future__ import annotations

import math
import re
from typing import NoReturn

import faiss

from flowsearch.ann.policy import DEFAULT, AnnPolicy
from flowsearch.errors import BadInput

__all__ = [
    "auto_factory",
    "check_factory",
    "ivf_factory",
    "large_factory",
    "mmap_flags",
    "new_index",
    "reason",
    "refined",
    "validate_factory",
]


def reason(exc: BaseException) -> str:
    """FAISS's message without the C++ signature and source location."""
    lines = str(exc).strip().splitlines()
    return re.split(r"\.(?:cpp|h):\d+: ", lines[-1])[-1][:200] if lines else type(exc).__name__


def _make(dim: int, factory: str) -> faiss.Index:
    validate_factory(factory, dim)
    try:
        return faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise BadInput(
            f"FAISS rejects index factory {factory!r} ({reason(exc)}); try 'auto' or 'Flat'"
        ) from None


def auto_factory(n_rows: int, policy: AnnPolicy = DEFAULT, *, dim: int | None = None) -> str:
    """The factory string ``"auto"`` stands for at ``n_rows`` rows of ``dim`` dimensions.

    ``Flat`` (exact) up to ``policy.flat_max_rows``; above, ``policy.graph_factory``
    (``HNSW32``), whose ``efSearch`` is then tuned (:func:`flowsearch.ann.tune.tune`). Not IVF
    at that size: on a calibrated (whitened, isotropic) space an inverted file has no cluster
    structure to exploit (benchmarks/RESULTS.md). HNSW needs no training and adds rows one by
    one (streaming). Above ``policy.graph_max_rows`` the vectors no longer belong in RAM:
    :func:`large_factory`.

    Raises:
        ValueError: ``dim`` missing when the large factory is chosen.
    """
    if n_rows <= policy.flat_max_rows:
        return "Flat"
    if n_rows <= policy.graph_max_rows:
        return policy.graph_factory
    if dim is None:
        raise ValueError("auto_factory needs dim above graph_max_rows (for the PQ code size)")
    return large_factory(n_rows, dim)


def _pq_subquantizers(dim: int) -> int:
    """Sub-quantizers of the large factory's PQ: about one per 8 dimensions (48 at 384), the
    largest such count that divides ``dim``."""
    m = max(1, dim // 8)
    while dim % m:
        m -= 1
    return m


def large_factory(n_rows: int, dim: int) -> str:
    """``IVF{nlist},PQ{m},RFlat``: IVF-PQ whose candidates are re-ranked exactly.

    ``nlist`` is the power of two nearest ``sqrt(n)``, with at least 39 training rows per list;
    ``m`` is :func:`_pq_subquantizers` (codes of ``m`` bytes). ``RFlat`` keeps the
    full-precision vectors (4 * dim bytes per row) for the re-rank, in the same file: on disk,
    memory-mapped when searching (:func:`mmap_flags`). Bare PQ loses too much recall@10 on these
    spaces (benchmarks/RESULTS.md); the re-rank wins it back.
    """
    nlist = 2 ** round(math.log2(math.sqrt(max(n_rows, 1))))
    while nlist > 1 and nlist * 39 > n_rows:
        nlist //= 2
    return f"IVF{nlist},PQ{_pq_subquantizers(dim)},RFlat"


def refined(factory: str) -> bool:
    """Whether a factory string ends in an exact re-rank (``,RFlat`` or ``,Refine(...)``)."""
    return bool(re.search(r"(^|,)\s*(RFlat|Refine\()", factory))


def mmap_flags(factory: str) -> int:
    """The FAISS read flags that memory-map an index of ``factory`` (faiss 1.15).

    ``IO_FLAG_MMAP_IFC`` maps flat code arrays: ``Flat``, HNSW's vectors, and, for an IVF index
    with a re-rank, both the re-rank vectors and the inverted lists (opening one leaves the
    anonymous memory unchanged). A plain IVF index needs
    ``IO_FLAG_MMAP`` for its lists; combining both flags fails on IVF files.
    """
    ivf = "IVF" in factory.upper()
    flags = faiss.IO_FLAG_MMAP if ivf and not refined(factory) else faiss.IO_FLAG_MMAP_IFC
    return int(flags) | int(faiss.IO_FLAG_READ_ONLY)


def ivf_factory(n_rows: int) -> str:
    """``IVF{nlist},Flat`` with ``nlist`` the power of two nearest ``4 * sqrt(n)`` (FAISS's rule
    of thumb), keeping at least 39 training points per list (what ``auto`` chose before HNSW)."""
    nlist = 2 ** round(math.log2(4 * math.sqrt(max(n_rows, 1))))
    while nlist > 1 and nlist * 39 > n_rows:
        nlist //= 2
    return f"IVF{nlist},Flat"


def check_factory(factory: str, dim: int) -> None:
    """Fail early (before any encoding) on a factory string FAISS rejects at dimension ``dim``.

    Raises:
        BadInput: naming the factory and FAISS's reason.
    """
    if factory == "auto":
        return
    index = _make(dim, factory)  # validated first (validate_factory)
    if isinstance(index, (faiss.IndexIDMap, faiss.IndexIDMap2)):
        raise BadInput(
            f"index factory {factory!r}: IDMap is not supported (flowsearch assigns the ids); "
            "drop the 'IDMap,' prefix"
        )


def new_index(dim: int, factory: str, policy: AnnPolicy = DEFAULT) -> faiss.Index:
    """An empty inner-product FAISS index of ``dim`` dimensions from a resolved factory string;
    an HNSW graph is built with ``efConstruction`` = ``policy.ef_construction`` (kept in the
    index file, so later adds use it too).

    Raises:
        BadInput: a factory string FAISS rejects.
    """
    index = _make(dim, factory)
    graph = faiss.downcast_index(index)
    if isinstance(graph, faiss.IndexHNSW):
        graph.hnsw.efConstruction = policy.ef_construction
    return index


# -- what FAISS is handed: the factory grammar, each parameter range-checked ------------------

#: Largest parameters a factory may name (beyond them FAISS allocates without bound).
MAX_HNSW_M = 256
MAX_NLIST = 2**20
MAX_CODE_BITS = 16
_FACTORY_EXAMPLE = "e.g. 'Flat', 'HNSW32', 'IVF1024,PQ48,RFlat' or 'auto'"
_PARTS = {
    "transform": re.compile(r"L2norm|PCAW?R?(\d+)|OPQ(\d+)(?:_(\d+))?|RR(\d+)"),
    "idmap": re.compile(r"IDMap2?"),
    "coarse": re.compile(r"IVF(\d+)(?:_HNSW(\d+))?|IMI2x(\d+)"),
    "encoding": re.compile(
        r"Flat|HNSW(\d+)(?:_(?:Flat|SQ(?:4|6|8|fp16|bf16)|PQ(\d+)(?:x(\d+))?))?"
        r"|PQ(\d+)(?:x(\d+))?(np|fs|fsr)?|SQ(?:4|6|8|fp16|bf16)(?:_direct)?|RaBitQ(?:fs)?"
        r"|(?:RQ|LSQ)(\d+)x(\d+)"
    ),
    "refine": re.compile(r"RFlat|Refine\((.+)\)"),
}
_ORDER = ("transform", "idmap", "coarse", "encoding", "refine")


def validate_factory(factory: str, dim: int | None = None, n_rows: int | None = None) -> None:
    """Refuse a factory string outside the grammar flowsearch hands FAISS, or with a parameter
    out of range, before FAISS sees it (FAISS aborts or crashes the process on some: ``HNSW1``
    segfaults, ``HNSW0`` aborts, ``PQ4x0`` divides by zero).

    The grammar, in order: transforms (``L2norm``, ``PCA{d}``/``PCAR``/``PCAW``/``PCAWR``,
    ``OPQ{m}[_{d}]``, ``RR{d}``), ``IDMap`` (refused later, with its own reason), a coarse
    quantizer (``IVF{nlist}[_HNSW{M}]``, ``IMI2x{bits}``), one encoding (``Flat``,
    ``HNSW{M}[_Flat|_SQ8|_PQ{m}[x{bits}]]``, ``PQ{m}[x{bits}][np|fs|fsr]``, ``SQ4/6/8/fp16/bf16``,
    ``RaBitQ[fs]``, ``RQ{m}x{bits}``, ``LSQ{m}x{bits}``) and a re-rank (``RFlat``,
    ``Refine({factory})``). Ranges: HNSW ``2 <= M <= 256``, ``1 <= nlist <= 2**20`` (and at most
    ``n_rows`` when given), PQ ``m`` dividing the dimension, RQ/LSQ at most 64 stages and at most
    the dimension, code bits 1 to 16 (``fs``: 4; RQ/LSQ: 12),
    transforms to ``1 <= d`` (PCA: at most the dimension).

    Args:
        factory: the factory string (``"auto"`` passes).
        dim: the dimension it is built at (None: checks that need it are left out).
        n_rows: the rows it is trained on (None: unknown).

    Raises:
        BadInput: one line naming the part and the range.

    Example:
        >>> validate_factory("IVF64,PQ8x8,RFlat", 384)
        >>> validate_factory("HNSW1", 384)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        flowsearch.errors.BadInput: flowsearch rejects index factory 'HNSW1': HNSW's M must be...
    """
    if not isinstance(factory, str):
        raise BadInput(
            f"index factory must be a string, got {type(factory).__name__}",
            f"pass a FAISS factory string, {_FACTORY_EXAMPLE}",
            param="index_factory",
        )
    if factory == "auto":
        return
    _validate(factory, factory, dim, n_rows)


def _validate(whole: str, factory: str, dim: int | None, n_rows: int | None) -> None:
    at = 0
    parts = _split(whole, factory)
    if not parts:
        _bad(whole, "it is empty")
    encodings = 0
    for part in parts:
        kind = next((k for k in _ORDER[at:] if _PARTS[k].fullmatch(part)), None)
        if kind is None:
            known = next((k for k in _ORDER if _PARTS[k].fullmatch(part)), None)
            problem = f"{part!r} is out of place" if known else f"unknown part {part!r}"
            _bad(whole, problem)
        at = _ORDER.index(kind) + (0 if kind == "transform" else 1)
        match = _PARTS[kind].fullmatch(part)
        assert match is not None
        numbers = [_number(whole, g) if g and g.isdigit() else None for g in match.groups()]
        if kind == "transform":
            dim = _transform(whole, part, numbers, dim)
        elif kind == "coarse":
            _coarse(whole, part, numbers, n_rows)
        elif kind == "encoding":
            encodings += 1
            _encoding(whole, part, match.groups(), numbers, dim)
        elif kind == "refine" and match.group(1) is not None:
            _validate(whole, match.group(1), dim, n_rows)
    if encodings != 1:
        _bad(whole, "it names no encoding (Flat, HNSW, PQ, SQ, ...)")


def _split(whole: str, factory: str) -> list[str]:
    """The comma-separated parts of ``factory``, commas inside ``(...)`` kept."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(factory):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                _bad(whole, "its parentheses do not match")
        elif char == "," and depth == 0:
            parts.append(factory[start:i])
            start = i + 1
    if depth:
        _bad(whole, "its parentheses do not match")
    parts.append(factory[start:])
    return [] if parts == [""] else parts


def _number(whole: str, digits: str) -> int:
    if len(digits) > 9:
        _bad(whole, f"{digits[:12]}... is too large")
    return int(digits)


def _in_range(whole: str, what: str, value: int | None, low: int, high: int) -> None:
    if value is not None and not low <= value <= high:
        _bad(whole, f"{what} must be {low} to {high}, got {value}")


def _transform(whole: str, part: str, numbers: list[int | None], dim: int | None) -> int | None:
    if part == "L2norm":
        return dim
    pca, opq_m, opq_d, rr = numbers
    if pca is not None:
        _in_range(whole, "PCA's output dimension", pca, 1, dim or 65536)
        return pca
    if rr is not None:
        _in_range(whole, "RR's output dimension", rr, 1, 65536)
        return rr
    _in_range(whole, "OPQ's sub-quantizers", opq_m, 1, 65536)
    out = opq_d if opq_d is not None else dim
    if out is not None:
        _in_range(whole, "OPQ's output dimension", out, 1, 65536)
        if opq_m and out % opq_m:
            _bad(whole, f"OPQ's output dimension {out} is not a multiple of its {opq_m}")
    return out


def _coarse(whole: str, part: str, numbers: list[int | None], n_rows: int | None) -> None:
    nlist, graph_m, imi_bits = numbers
    _in_range(whole, "IVF's nlist", nlist, 1, MAX_NLIST)
    if nlist is not None and n_rows is not None and nlist > n_rows:
        _bad(whole, f"IVF's nlist ({nlist}) is more than the {n_rows} rows it is trained on")
    _in_range(whole, "HNSW's M", graph_m, 2, MAX_HNSW_M)
    _in_range(whole, "IMI's bits", imi_bits, 1, 12)


def _encoding(
    whole: str, part: str, groups: tuple[str | None, ...], numbers: list[int | None],
    dim: int | None,
) -> None:  # fmt: skip
    hnsw, hnsw_pq, hnsw_bits, pq, pq_bits, pq_kind, rq, rq_bits = numbers
    _in_range(whole, "HNSW's M", hnsw, 2, MAX_HNSW_M)
    for m in (hnsw_pq, pq):
        _in_range(whole, "PQ's sub-quantizers", m, 1, dim or 65536)
        if m and dim is not None and dim % m:
            _bad(whole, f"the dimension {dim} is not a multiple of PQ's {m} sub-quantizers")
    for bits in (hnsw_bits, pq_bits, rq_bits):
        _in_range(whole, "the code bits", bits, 1, MAX_CODE_BITS)
    if groups[5] is not None and groups[5].startswith("fs") and pq_bits not in (None, 4):
        _bad(whole, f"fast-scan PQ codes are 4 bits, got {pq_bits}")
    # more additive stages than dimensions quantize zero residuals: FAISS's training hangs
    _in_range(whole, "RQ/LSQ's sub-quantizers", rq, 1, min(64, dim or 64))
    if rq_bits is not None:
        _in_range(whole, "RQ/LSQ's code bits", rq_bits, 1, 12)


def _bad(factory: str, problem: str) -> NoReturn:
    shown = factory if len(factory) <= 60 else factory[:57] + "..."
    shown = "".join(c if c.isprintable() else " " for c in shown)
    raise BadInput(
        f"flowsearch rejects index factory {shown!r}: {problem}",
        f"pass a FAISS factory string, {_FACTORY_EXAMPLE}",
        param="index_factory",
    )
