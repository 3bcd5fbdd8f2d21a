r"""What both build engines (local and Ray) share: fitting the space, finishing the version.

:func:`fit_space` fits the calibrator on the fit rows and trains the segment's empty vector
index; :func:`finish_build` finishes the segment, saves the calibrator, measures the held-out
reference, and publishes the first version with :func:`template`'s manifest fields.

Example:
    >>> finish_build(writer, builder, space, enc, plan, lps, held, ...)  # doctest: +SKIP
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from flowsearch.ann import build as ann_build
from flowsearch.ann.policy import DEFAULT, AnnPolicy
from flowsearch.calibration.base import Calibrator
from flowsearch.encode.protocol import TextEncoder
from flowsearch.ingest.corpus import CorpusPlan
from flowsearch.ingest.passages import PassageSizes
from flowsearch.progress import Stages
from flowsearch.space.fitting import fit_for_index
from flowsearch.space.reference import (
    Method,
    Reference,
    best_other_score,
    density_stats,
    reliable,
)
from flowsearch.space.search_space import SearchSpace
from flowsearch.storage import manifest as mf
from flowsearch.storage import schema
from flowsearch.storage.layout import CALIBRATORS_DIR
from flowsearch.storage.writer import Writer
from flowsearch.writes.corpus import spec_of
from flowsearch.writes.measure import draw_sample, stage_sample
from flowsearch.writes.segments import SegmentBuilder

if TYPE_CHECKING:
    import faiss

__all__ = [
    "CHUNK_ROWS",
    "BuildOptions",
    "finish_build",
    "fit_space",
    "template",
]

CHUNK_ROWS = 2048  # texts per encoder call: enough to batch by length, small enough for progress


class EncoderRuntime(TypedDict, total=False):
    """An encoder's runtime keywords (:class:`~flowsearch.encode.encoder.Encoder`'s), given
    only when they differ from the default (``auto``)."""

    backend: str
    quantize: str | None


@dataclass(frozen=True)
class BuildOptions:
    """What a build was asked for, beyond the corpus and the encoder (both engines).

    Attributes:
        source: how to load the model again (None: the bundled one).
        calibration: ``auto``, a calibrator name or ``none``.
        loaded: a calibrator fitted elsewhere, used instead of fitting (or None).
        loaded_from: where ``loaded`` was read from.
        index_factory: ``auto`` or a FAISS factory string.
        batch_size: texts per encoder forward pass.
        fit_sample: rows the calibrator is fitted on, at most.
        lexical: build BM25 postings.
        passages: how documents are cut (a
            :class:`~flowsearch.ingest.passages.PassageSizes`; None: not cut).
        ann: what ``auto`` builds and tunes the segment for.
    """

    source: str | None
    calibration: str
    loaded: Calibrator | None
    loaded_from: str | os.PathLike[str] | None
    index_factory: str
    batch_size: int
    fit_sample: int
    lexical: bool
    passages: PassageSizes | None = None
    ann: AnnPolicy = DEFAULT


def fit_space(
    U_fit: np.ndarray, enc: TextEncoder, n_rows: int, st: Stages, options: BuildOptions
) -> tuple[SearchSpace, faiss.Index, str]:
    """Fit the calibrator on the raw fit rows, make the searched space and the empty vector
    index of the build's segment, trained on a projected sample (both engines):
    ``(space, index, resolved factory)``."""
    cal, spec = fit_for_index(
        U_fit,
        options.calibration,
        loaded=options.loaded,
        loaded_from=options.loaded_from,
        status=lambda what: st.status(what, follow="flowsearch.calibration"),
        pooling=enc.pooling,
    )
    space = SearchSpace(cal, spec, enc)
    index, factory = ann_build.segment_index(
        space.dim, options.index_factory, n_rows, policy=options.ann
    )
    if not index.is_trained:
        sample = ann_build.training_sample(index, U_fit, space.project)
        ann_build.train(index, sample, factory)
    return space, index, factory


def finish_build(
    writer: Writer,
    builder: SegmentBuilder,
    space: SearchSpace,
    enc: TextEncoder,
    plan: CorpusPlan,
    lps: list[np.ndarray],
    measured: tuple[np.ndarray, np.ndarray, Method],
    options: BuildOptions,
    documents: np.ndarray | None = None,
) -> mf.Manifest:
    """Finish the build's segment, save the calibrator, measure the reference (the rows
    ``measured[0]`` with raw vectors ``measured[1]``, chosen by
    :func:`~flowsearch.space.reference.reference_rows`; ``documents``: int (n_rows,) each
    row's document when documents were cut into passages, whose siblings are not "another
    row"), draw the reference sample later writes are judged against (the same rows as its
    probes) and publish the first version."""
    record = builder.finish()
    spec = _save_calibrator(writer, space)
    all_lp = np.concatenate(lps) if lps else None
    reference = _reference(builder.index, space, measured, all_lp, record.n_rows, documents)
    if len(measured[0]):  # what later writes' new rows are judged against (space/sample.py)
        sample = draw_sample(writer, [record], probes=measured[0], method=measured[2])
        reference = reference.model_copy(update={"sample": stage_sample(writer, sample)})
    manifest = template(enc, space, spec, plan, options)
    manifest = manifest.model_copy(
        update={
            "density": density_stats(all_lp) if all_lp is not None else None,
            "reference": reference.model_dump(mode="json"),
        }
    )
    return writer.publish(
        kind="build",
        n_rows=record.n_rows,
        template=manifest,
        detail={"segment": record.name, "factory": record.ann.factory},
    )


def _save_calibrator(writer: Writer, space: SearchSpace) -> mf.CalibrationSpec:
    stage = writer.stage(CALIBRATORS_DIR)
    space.calibrator.save(stage)
    return writer.set_calibrator(stage, space.spec)


def template(
    enc: TextEncoder,
    space: SearchSpace,
    spec: mf.CalibrationSpec,
    plan: CorpusPlan,
    options: BuildOptions,
) -> mf.Manifest:
    """The new index's manifest fields (the writer adds segments, version and times)."""
    return mf.Manifest(
        encoder=mf.EncoderSpec.from_description(enc.describe(), options.source),
        dim=space.dim,
        calibration=spec,
        ann_requested=options.index_factory,
        lexical=mf.LexicalSpec() if options.lexical else None,
        passages=spec_of(options.passages),
        columns=mf.Columns(
            text=plan.text_column,
            id=plan.id_column,
            id_type="int" if plan.id_type == "int" else "string",
        ),
        schema=schema.columns_of(plan.metadata_schema),
        skipped=int(plan.n_skipped),
        next_auto_id=int(plan.n_rows_in),
    )


def _reference(
    index: faiss.Index,
    space: SearchSpace,
    measured: tuple[np.ndarray, np.ndarray, Method],
    lp: np.ndarray | None,
    n_rows: int,
    documents: np.ndarray | None = None,
) -> Reference:
    """The reference: each measured row's best score to another row of the finished index,
    with their log-densities (``lp``: all rows' or None) when the calibrator is reliable."""
    from flowsearch.ann import io as ann_io

    rows, raw, method = measured
    spec = space.spec
    mean_cosine = spec.anisotropy.get("mean_cosine") if spec.space == "encoder" else None
    if not len(rows):
        return Reference(method=method, n_measured=0, n_corpus=n_rows, space=spec.space)
    Z = space.project(np.asarray(raw), want_density=False)[0]
    # past the row itself and its own document's other passages
    depth = 2 if documents is None else 1 + int(np.bincount(documents).max())
    scores, found = ann_io.search(index, Z, depth)
    top = best_other_score(scores, found, rows, documents)
    keep_lp = lp is not None and reliable(spec.fit_rows, space.dim)
    return Reference.from_scores(
        top,
        method=method,
        n_corpus=n_rows,
        space=spec.space,
        mean_cosine=mean_cosine,
        log_densities=lp[rows] if keep_lp and lp is not None else None,
    )
