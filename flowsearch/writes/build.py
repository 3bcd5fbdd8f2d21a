r"""Corpus in, calibrated index out: :func:`build_index`.

The data flow is one direction: stream the corpus's record batches, encode them (raw float32
vectors cached in a scratch file), fit the calibrator on a uniform sample of the corpus's own
vectors (:func:`~flowsearch.space.fitting.fit_for_index`), project every row into the searched
space (:class:`~flowsearch.space.search_space.SearchSpace`), and write one segment — Parquet
parts, its vector index filled chunk by chunk, its postings and keys
(:class:`~flowsearch.writes.segments.SegmentBuilder`) — then publish the version through the
version writer (:mod:`flowsearch.storage.writer`): a crash or Ctrl-C at any moment leaves the
previous version as it was. Memory does not grow with the corpus beyond the vector index.

Rows held out of the calibrator's fit give the reference queries and new rows are judged
against (:mod:`flowsearch.space.reference`).

Example:
    >>> build_index("data/sample.parquet", "my_index")  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from flowsearch.ann.factory import check_factory
from flowsearch.ann.policy import AnnPolicy, policy_or_default
from flowsearch.calibration.base import Calibrator
from flowsearch.encode.protocol import TextEncoder
from flowsearch.errors import BadInput, check_bool, check_int, check_path
from flowsearch.ingest.corpus import Corpus, CorpusOptions, CorpusPlan
from flowsearch.ingest.passages import Cuts, requested_sizes
from flowsearch.progress import Stages
from flowsearch.space.fitting import checked_calibration, load_fitted
from flowsearch.space.reference import (
    reference_rows,
    split_fit_rows,
)
from flowsearch.space.search_space import SearchSpace
from flowsearch.storage import manifest as mf
from flowsearch.storage.cleanup import check_target
from flowsearch.storage.passages import passage_columns
from flowsearch.storage.rows import rows_table
from flowsearch.storage.writer import Writer, open_writer
from flowsearch.writes import ENGINES
from flowsearch.writes.corpus import read_for_build
from flowsearch.writes.engine import (
    CHUNK_ROWS,
    BuildOptions,
    EncoderRuntime,
    finish_build,
    fit_space,
)
from flowsearch.writes.results import WriteResult, result_of
from flowsearch.writes.segments import SegmentBuilder

__all__ = ["ENGINES", "BuildRequest", "EncoderOptions", "build", "build_index"]

LOG = logging.getLogger(__name__)

#: What builds an index's version under the writer lock, once the corpus is read and the
#: encoder loaded (the local build, or the Ray engine's).
Builder = Callable[[Writer, CorpusPlan, TextEncoder, Stages, BuildOptions], mf.Manifest]


@dataclass(frozen=True)
class EncoderOptions:
    """Which encoder a build loads (recorded in the manifest; every later write reuses it).

    Attributes:
        model: model id or directory; None is the bundled all-MiniLM-L6-v2.
        pooling: ``mean``, ``cls``, ``last2avg``, ``first_last_avg``, ``static``,
            ``embedding_layer``.
        max_length: tokens the encoder reads of a text (its window); None takes the model's.
        backend: the runtime: ``auto`` (ONNX Runtime fp32 on the CPU, torch on CUDA),
            ``torch`` or ``onnx``.
        quantize: ``int8`` (ONNX dynamic quantisation), or None.
    """

    model: str | os.PathLike[str] | None = None
    pooling: str = "mean"
    max_length: int | None = None
    backend: str = "auto"
    quantize: str | None = None

    def runtime(self) -> EncoderRuntime:
        """The Encoder's runtime keywords, given only when asked for (not every encoder has
        them)."""
        if self.backend != "auto" or self.quantize is not None:
            return {"backend": self.backend, "quantize": self.quantize}
        return {}


@dataclass(frozen=True)
class BuildRequest:
    """Everything a build is asked, beyond the corpus and the index directory; checked when
    made, before any work (see :func:`build_index` for each field's meaning).

    Raises:
        BadInput: a batch size below 1, a fit sample below 2 (or either not an integer), a
            flag that is not a bool, an unknown engine, or an unknown calibration name.
    """

    corpus: CorpusOptions = field(default_factory=CorpusOptions)
    encoder: EncoderOptions = field(default_factory=EncoderOptions)
    calibration: str = "auto"
    calibrator: str | os.PathLike[str] | None = None
    index_factory: str = "auto"
    batch_size: int = 64
    overwrite: bool = False
    fit_sample: int = 200_000
    lexical: bool = True
    engine: str = "local"
    address: str | None = None
    wait: float | None = None
    passage_tokens: int | None = None
    passage_overlap: int | None = None
    ann: AnnPolicy | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ann", policy_or_default(self.ann))
        check_int(self.batch_size, "batch_size", 1)
        check_int(self.fit_sample, "fit_sample", 2)
        check_bool(self.overwrite, "overwrite")
        check_bool(self.lexical, "lexical")
        if self.engine not in ENGINES:
            raise BadInput(
                f"unknown engine {self.engine!r}",
                f"choose one of {', '.join(ENGINES)}",
                param="engine",
            )
        if self.calibrator is None:
            checked_calibration(self.calibration)  # an unknown name fails here, before any work


def build_index(
    corpus: Corpus,
    index_dir: str | os.PathLike[str],
    text_column: str = "text",
    id_column: str | None = "id",
    model: str | os.PathLike[str] | None = None,
    pooling: str = "mean",
    max_length: int | None = None,
    calibration: str = "auto",
    calibrator: str | os.PathLike[str] | None = None,
    index_factory: str = "auto",
    batch_size: int = 64,
    overwrite: bool = False,
    fit_sample: int = 200_000,
    strict: bool = False,
    lexical: bool = True,
    backend: str = "auto",
    quantize: str | None = None,
    engine: str = "local",
    address: str | None = None,
    wait: float | None = None,
    passage_tokens: int | None = None,
    passage_overlap: int | None = None,
    ann: AnnPolicy | None = None,
) -> WriteResult:
    r"""Index a corpus into ``index_dir`` (see the module docstring for the data flow).

    Args:
        corpus: a corpus file, a directory of them, a glob, a list of paths or of records.
        index_dir: the index directory to publish into.
        text_column: column with the passages.
        id_column: column with unique ids (row numbers when the default ``"id"`` is absent).
        model: encoder model id or directory; None is the bundled all-MiniLM-L6-v2.
        pooling: encoder pooling (``mean``, ``cls``, ``last2avg``, ``first_last_avg``,
            ``static``, ``embedding_layer``).
        max_length: tokens per passage; None takes the model's limit.
        calibration: ``auto`` (default), a calibrator name (``flow``, ``whitening``, ...), ``none``.
        calibrator: directory of a calibrator fitted before, used instead of fitting one.
        index_factory: ``auto`` or any ``faiss.index_factory`` string (inner product).
        batch_size: texts per encoder forward pass.
        overwrite: replace an existing index at ``index_dir``.
        fit_sample: fit the calibrator on a uniform sample of at most this many rows.
        strict: refuse null or blank texts instead of skipping them.
        lexical: also build BM25 postings, for ``mode="lexical"`` and ``"hybrid"``.
        backend: the encoder's runtime: ``auto`` (ONNX Runtime fp32 on the CPU, torch on
            CUDA), ``torch`` or ``onnx``.
        quantize: ``int8`` (ONNX dynamic quantisation), or None.
        engine: ``local`` (this process) or ``ray`` (extra ``ray``).
        address: the Ray cluster to join (``engine="ray"``); None starts a local one.
        wait: seconds to wait for another writer (None: refuse at once).
        passage_tokens: a text longer than the encoder's window is cut into passages of at
            most this many tokens (:mod:`flowsearch.ingest.passages`); None: the default
            (:data:`~flowsearch.ingest.passages.DEFAULT_TOKENS`, at most the window); 0: not
            cut (only its first tokens are read).
        passage_overlap: tokens a passage shares with the previous one, at most; None: the
            default (:data:`~flowsearch.ingest.passages.DEFAULT_OVERLAP`).
        ann: what ``index_factory="auto"`` builds and tunes for
            (:class:`~flowsearch.ann.policy.AnnPolicy`; None: the defaults).

    Returns:
        A :class:`~flowsearch.writes.results.WriteResult` (``kind="build"``).

    Raises:
        FlowsearchError: bad input (nothing is written).
    """
    request = BuildRequest(
        corpus=CorpusOptions(text_column, id_column, strict),
        encoder=EncoderOptions(model, pooling, max_length, backend, quantize),
        calibration=calibration, calibrator=calibrator, index_factory=index_factory,
        batch_size=batch_size, overwrite=overwrite, fit_sample=fit_sample, lexical=lexical,
        engine=engine, address=address, wait=wait,
        passage_tokens=passage_tokens, passage_overlap=passage_overlap, ann=ann,
    )  # fmt: skip
    return build(corpus, index_dir, request)


def build(corpus: Corpus, index_dir: str | os.PathLike[str], request: BuildRequest) -> WriteResult:
    """:func:`build_index` with its request made (what the command line calls)."""
    target = check_path(index_dir, "index_dir", "an index directory")
    check_target(target, request.overwrite)
    st = Stages()
    with st.timed("scan"):
        plan = read_for_build(corpus, request.corpus)
    if request.engine == "ray" and not plan.files:
        raise BadInput(
            "engine='ray' reads corpus files",
            "write the records to Parquet first, or use {engine='local'}",
            param="engine",
        )
    with st.timed("load model"):
        enc, loaded = _load(request)
    builder: Builder = _build
    sizes = requested_sizes(enc, request.passage_tokens, request.passage_overlap)
    model = request.encoder.model
    if request.engine == "ray":  # imported only here: `ray` is an optional extra
        from flowsearch.writes import ray_engine

        builder = ray_engine.builder(request.address, model, request.encoder.runtime())
    options = BuildOptions(
        source=None if model is None else str(enc.model_id), calibration=request.calibration,
        loaded=loaded, loaded_from=request.calibrator, index_factory=request.index_factory,
        batch_size=request.batch_size, fit_sample=request.fit_sample, lexical=request.lexical,
        passages=sizes, ann=policy_or_default(request.ann),
    )  # fmt: skip
    with (
        open_writer(target, new=True, overwrite=request.overwrite, wait=request.wait) as writer,
        st.live(),
    ):
        manifest = builder(writer, plan, enc, st, options)
    out = result_of("build", target, manifest, st, n_written=plan.n_rows, n_skipped=plan.n_skipped)
    LOG.info("indexed %d rows into %s in %.1f s", plan.n_rows, target, out.seconds["total"])
    return out


def _encode_pass(enc: TextEncoder, cuts: Cuts, raw_path: Path, batch_size: int, st: Stages) -> None:
    """Encode every passage row to float32, appended to ``raw_path`` (rows in corpus order)."""
    with st.task("encoding", total=cuts.n_rows) as advance, open(raw_path, "wb") as out:
        for batch in cuts.batches():
            U = enc.encode(batch.texts, batch_size=batch_size, progress=False)
            out.write(np.ascontiguousarray(U, dtype=np.float32).tobytes())
            advance(len(batch.texts))


def _load(request: BuildRequest) -> tuple[TextEncoder, Calibrator | None]:
    """The encoder and a calibrator fitted elsewhere (or None); the factory checked against
    the searched dimension before any encoding."""
    from flowsearch.encode.encoder import Encoder

    wanted = request.encoder
    enc = Encoder(wanted.model, pooling=wanted.pooling, max_length=wanted.max_length,
                  **wanted.runtime())  # fmt: skip
    calibrator = request.calibrator
    loaded: Calibrator | None = None
    if calibrator is not None:
        loaded = load_fitted(calibrator, request.calibration, enc.dim)
    dim = (loaded.dim_out if loaded else None) or enc.dim
    check_factory(request.index_factory, dim)
    if request.index_factory == "auto":  # the graph auto may build, checked before it is needed
        check_factory(policy_or_default(request.ann).graph_factory, dim)
    return enc, loaded


def _build(
    writer: Writer, plan: CorpusPlan, enc: TextEncoder, st: Stages, options: BuildOptions
) -> mf.Manifest:
    """Encode, calibrate, write the segment and publish (under the writer lock)."""
    work = writer.stage()
    with st.timed("cut"):
        cuts = Cuts(enc, plan, options.passages, CHUNK_ROWS)
    n_rows = cuts.n_rows  # passage rows: the calibrator is fitted on passages
    with st.timed("encode"):
        _encode_pass(enc, cuts, work / "raw.f32", options.batch_size, st)
    raw = np.memmap(work / "raw.f32", dtype=np.float32, mode="r").reshape(n_rows, enc.dim)
    with st.timed("fit"):
        fit_idx, held_idx = split_fit_rows(n_rows, options.fit_sample)
        space, index, factory = fit_space(np.asarray(raw[fit_idx]), enc, n_rows, st, options)
    builder = SegmentBuilder(writer, dim=space.dim, n_rows=n_rows,
                             requested=options.index_factory, lexical=options.lexical,
                             strict_factory=True, index=index, factory=factory,
                             ann=options.ann)  # fmt: skip
    with st.timed("write segment"):
        lps = _write_rows(builder, cuts, raw, space, st)
    measured, method = reference_rows(n_rows, held_idx)
    measured_raw = np.asarray(raw[measured])
    del raw
    return finish_build(writer, builder, space, enc, plan, lps,
                        (measured, measured_raw, method), options, cuts.documents())  # fmt: skip


def _write_rows(builder: SegmentBuilder, cuts: Cuts, raw: np.ndarray, space: SearchSpace,
                st: Stages) -> list[np.ndarray]:  # fmt: skip
    """Every passage row projected and written to the segment; their log-densities (row
    order)."""
    lps: list[np.ndarray] = []
    with st.task("writing rows", total=cuts.n_rows) as advance:
        row = 0
        for ids, texts, meta, spans in cuts.batches():
            U = np.asarray(raw[row : row + len(texts)])
            Z, lp = space.project(U)
            if lp is not None:
                lps.append(lp)
            columns = None if spans is None else passage_columns(spans)
            builder.add(rows_table(ids, texts, meta, Z, U, columns), Z)
            row += len(texts)
            advance(len(texts))
    return lps
