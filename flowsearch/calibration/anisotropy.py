r"""Anisotropy statistics of sentence vectors, and the rule ``calibration="auto"`` follows.

Li et al. (2020) argue that BERT's sentence vectors occupy a narrow cone (high mean cosine between
unrelated sentences, a few dominating directions), and that mapping them to an isotropic Gaussian
restores the meaning of cosine similarity. Encoders trained contrastively (SimCSE, sentence-
transformers' all-* models) are already close to isotropic, and calibrating them can cost quality.
The statistics here tell the two apart from the vectors alone, with no labels:

- ``mean_cosine``: mean cosine similarity over distinct pairs of rows (exact, over a sample of at
  most ``max_rows`` rows: ``(|sum of unit rows|^2 - n) / (n (n - 1))``).
- ``top1_var`` / ``top10_var``: share of the centred vectors' variance along the top 1 / top 10
  singular directions (Mu et al. 2018's "dominating directions").
- ``rank_deficit``: one minus the effective rank (exp of the entropy of the normalised spectrum)
  over the dimension.
- ``gauss_gain``: nats per dimension a full-covariance Gaussian gains over a diagonal one,
  ``-1/2 mean(log eig(correlation))``: how much linear correlation whitening can remove.
- ``norm_cv``: coefficient of variation of the row norms.

All of them grow with anisotropy (``norm_cv`` only loosely).

``should_calibrate`` thresholds one statistic, ``AUTO_STATISTIC``, at ``AUTO_THRESHOLD``: calibrate
when ``mean_cosine > 0.33``. Chosen from the measurements in ``benchmarks/RESULTS.md`` ("When does
calibration help?", written by ``benchmarks/run_sts.py``): 14 (encoder, pooling) settings (the
bundled MiniLM with five poolings, the same architecture untrained, and with its top half
re-drawn), each with the statistics of its STS-B vectors beside the STS-B gain of the flow.
"Helps" means a gain above 0.5 Spearman points. ``mean_cosine`` at 0.33 classifies all 14
correctly (93% leave-one-out); the next best (``top1_var``, ``top10_var``) get 93% / 86%. The
margin is narrow on one side: MiniLM ``first_last_avg`` (0.29, the flow costs 1 point) against
MiniLM ``static`` (0.36, the flow gains 15). Judged by the gain of ``whitening-flow`` (what
``auto`` fits) instead, the same threshold still classifies all 14. Contrastively trained
poolings (MiniLM ``mean``:
0.02) sit far below it, untrained and partly trained encoders (0.5-1.0) far above. Measured on
STS-B's varied sentences: a topically narrow corpus has a higher mean cosine under any encoder.

References:
    Li et al., "On the Sentence Embeddings from Pre-trained Language Models", EMNLP 2020.
    Ethayarajh, "How Contextual are Contextualized Word Representations?", EMNLP 2019.
    Mu & Viswanath, "All-but-the-Top: Simple and Effective Postprocessing for Word
    Representations", ICLR 2018.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> iso = anisotropy_stats(rng.standard_normal((2000, 64)))
    >>> abs(iso["mean_cosine"]) < 0.05
    True
    >>> should_calibrate(anisotropy_stats(rng.standard_normal((2000, 64)) + 5.0))
    True
"""

from __future__ import annotations

import logging

import numpy as np

__all__ = ["AUTO_STATISTIC", "AUTO_THRESHOLD", "STATISTICS", "anisotropy_stats", "should_calibrate"]

LOG = logging.getLogger(__name__)

#: Names of the statistics :func:`anisotropy_stats` returns.
STATISTICS: tuple[str, ...] = (
    "mean_cosine",
    "top1_var",
    "top10_var",
    "rank_deficit",
    "gauss_gain",
    "norm_cv",
)

#: The statistic ``should_calibrate`` thresholds (see module docstring and RESULTS.md).
AUTO_STATISTIC: str = "mean_cosine"
#: Calibrate when ``stats[AUTO_STATISTIC] > AUTO_THRESHOLD``.
AUTO_THRESHOLD: float = 0.33

# Correlation eigenvalues are floored here: with fewer rows than dimensions, or constant
# dimensions, some are zero and log(0) would make gauss_gain infinite.
_EIG_FLOOR = 1e-3


def anisotropy_stats(U: np.ndarray, seed: int = 0, max_rows: int = 20_000) -> dict[str, float]:
    r"""Anisotropy statistics of a set of vectors.

    Arguments:
        U: vectors, shape (n, d), any float dtype; n >= 2.
        seed: seed for the row sample taken when ``n > max_rows``.
        max_rows: rows used at most (the statistics are stable long before 20k rows).

    Returns:
        A dict with the keys of :data:`STATISTICS`, plain floats.
    """
    X = np.asarray(U)
    if X.ndim != 2 or X.shape[0] < 2:
        raise ValueError(f"anisotropy_stats needs an (n >= 2, d) array, got shape {X.shape}")
    if X.shape[0] > max_rows:  # sample before converting: no float64 copy of a large corpus
        rows = np.random.default_rng(seed).choice(X.shape[0], size=max_rows, replace=False)
        X = X[np.sort(rows)]
    X = np.asarray(X, dtype=np.float64)
    if not np.isfinite(X).all():
        raise ValueError("anisotropy_stats got non-finite values")
    n, d = X.shape

    norms = np.linalg.norm(X, axis=1)
    unit = X[norms > 0] / norms[norms > 0, None]
    m = unit.shape[0]
    if m >= 2:
        total = unit.sum(axis=0)
        mean_cosine = float((total @ total - m) / (m * (m - 1)))
    else:
        mean_cosine = 0.0

    centred = X - X.mean(axis=0)
    spectrum = np.linalg.svd(centred, compute_uv=False) ** 2
    var_total = float(spectrum.sum())
    if var_total > 0:
        share = spectrum / var_total
        top1 = float(share[0])
        top10 = float(share[:10].sum())
        nz = share[share > 0]
        rank_deficit = float(1.0 - np.exp(-(nz * np.log(nz)).sum()) / d)
    else:
        top1, top10, rank_deficit = 1.0, 1.0, 1.0

    std = centred.std(axis=0)
    live = std > 1e-6 * max(float(std.max()), 1e-30)
    if live.sum() >= 2:
        corr = np.corrcoef(centred[:, live], rowvar=False)
        eig = np.clip(np.linalg.eigvalsh(corr), _EIG_FLOOR, None)
        gauss_gain = float(-0.5 * np.log(eig).mean())
    else:
        gauss_gain = 0.0

    mean_norm = float(norms.mean())
    norm_cv = float(norms.std() / mean_norm) if mean_norm > 0 else 0.0
    return {
        "mean_cosine": mean_cosine,
        "top1_var": top1,
        "top10_var": top10,
        "rank_deficit": rank_deficit,
        "gauss_gain": gauss_gain,
        "norm_cv": norm_cv,
    }


def should_calibrate(stats: dict[str, float]) -> bool:
    """True when the vectors are anisotropic enough that search should use the flow's space.

    Arguments:
        stats: the output of :func:`anisotropy_stats` (at least ``AUTO_STATISTIC``).
    """
    if AUTO_STATISTIC not in stats:
        raise KeyError(f"should_calibrate needs the {AUTO_STATISTIC!r} statistic")
    return bool(stats[AUTO_STATISTIC] > AUTO_THRESHOLD)
