r"""Anisotropy statistics of sentence vectors (``calibration="auto"`` thresholds one of them).

Li et al. (2020) argue that BERT's sentence vectors occupy a narrow cone (high mean cosine between
unrelated sentences, a few dominating directions), and that mapping them to an isotropic Gaussian
restores the meaning of cosine similarity; contrastively trained encoders are already close to
isotropic. The statistics here tell the two apart from the vectors alone, with no labels:

- ``mean_cosine``: mean cosine similarity over distinct pairs of rows (exact, over a sample of at
  most ``max_rows`` rows: ``(|sum of unit rows|^2 - n) / (n (n - 1))``).
- ``top1_var`` / ``top10_var``: share of the centred vectors' variance along the top 1 / top 10
  singular directions (Mu and Viswanath 2018's "dominating directions").
- ``rank_deficit``: one minus the effective rank (exp of the entropy of the normalised spectrum)
  over the dimension.
- ``gauss_gain``: nats per dimension a full-covariance Gaussian gains over a diagonal one,
  ``-1/2 mean(log eig(correlation))``: how much linear correlation whitening can remove.
- ``norm_cv``: coefficient of variation of the row norms.

All of them grow with anisotropy (``norm_cv`` only loosely). The policy that thresholds one of
them, :func:`flowsearch.space.fitting.should_calibrate`, belongs to the space layer; how its
threshold was chosen, and on what measurements, is in ``docs/CALIBRATION.md``.

References:
    Li et al., "On the Sentence Embeddings from Pre-trained Language Models", EMNLP 2020.
    Ethayarajh, "How Contextual are Contextualized Word Representations?", EMNLP 2019.
    Mu and Viswanath, "All-but-the-Top: Simple and Effective Postprocessing for Word
    Representations", ICLR 2018.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> iso = anisotropy_stats(rng.standard_normal((2000, 64)))
    >>> abs(iso["mean_cosine"]) < 0.05
    True
    >>> anisotropy_stats(rng.standard_normal((2000, 64)) + 5.0)["mean_cosine"] > 0.9
    True
"""

from __future__ import annotations

import numpy as np

from flowsearch.errors import BadInput

__all__ = ["STATISTICS", "anisotropy_stats"]

#: Names of the statistics :func:`anisotropy_stats` returns.
STATISTICS: tuple[str, ...] = (
    "mean_cosine",
    "top1_var",
    "top10_var",
    "rank_deficit",
    "gauss_gain",
    "norm_cv",
)


# Correlation eigenvalues are floored here: with fewer rows than dimensions, or constant
# dimensions, some are zero and log(0) would make gauss_gain infinite.
_EIG_FLOOR = 1e-3


def anisotropy_stats(U: np.ndarray, seed: int = 0, max_rows: int = 20_000) -> dict[str, float]:
    r"""Anisotropy statistics of a set of vectors.

    Arguments:
        U: Vectors, shape ``(n, d)``, any float dtype; ``n >= 2``, finite.
        seed: Seed of the row sample taken when ``n > max_rows``.
        max_rows: Rows used at most (the statistics are stable long before 20k rows).

    Returns:
        A dict with the keys of :data:`STATISTICS`, plain floats.

    Raises:
        BadInput: ``U`` is not an ``(n >= 2, d)`` array of finite values.
    """
    X = np.asarray(U)
    if X.ndim != 2 or X.shape[0] < 2:
        raise BadInput(f"anisotropy_stats needs an (n >= 2, d) array, got shape {X.shape}")
    if X.shape[0] > max_rows:  # sample before converting: no float64 copy of a large corpus
        rows = np.random.default_rng(seed).choice(X.shape[0], size=max_rows, replace=False)
        X = X[np.sort(rows)]
    X = np.asarray(X, dtype=np.float64)
    if not np.isfinite(X).all():
        raise BadInput("anisotropy_stats got non-finite values")
    norms = np.linalg.norm(X, axis=1)
    centred = X - X.mean(axis=0)
    mean_norm = float(norms.mean())
    return {
        "mean_cosine": _mean_cosine(X, norms),
        **_spectrum_shares(centred),
        "gauss_gain": _gauss_gain(centred),
        "norm_cv": float(norms.std() / mean_norm) if mean_norm > 0 else 0.0,
    }


def _mean_cosine(X: np.ndarray, norms: np.ndarray) -> float:
    """Mean cosine over distinct pairs of the non-zero rows (0 with fewer than two)."""
    unit = X[norms > 0] / norms[norms > 0, None]
    m = unit.shape[0]
    if m < 2:
        return 0.0
    total = unit.sum(axis=0)
    return float((total @ total - m) / (m * (m - 1)))


def _spectrum_shares(centred: np.ndarray) -> dict[str, float]:
    """``top1_var``, ``top10_var`` and ``rank_deficit`` from the centred rows' spectrum."""
    spectrum = np.linalg.svd(centred, compute_uv=False) ** 2
    var_total = float(spectrum.sum())
    if var_total <= 0:  # every row the same
        return {"top1_var": 1.0, "top10_var": 1.0, "rank_deficit": 1.0}
    share = spectrum / var_total
    nz = share[share > 0]
    effective_rank = float(np.exp(-(nz * np.log(nz)).sum()))
    return {
        "top1_var": float(share[0]),
        "top10_var": float(share[:10].sum()),
        "rank_deficit": 1.0 - effective_rank / centred.shape[1],
    }


def _gauss_gain(centred: np.ndarray) -> float:
    """``-1/2 mean(log eig(correlation))`` over the non-constant dimensions (0 with fewer than
    two)."""
    std = centred.std(axis=0)
    live = std > 1e-6 * max(float(std.max()), 1e-30)
    if live.sum() < 2:
        return 0.0
    corr = np.corrcoef(centred[:, live], rowvar=False)
    eig = np.clip(np.linalg.eigvalsh(corr), _EIG_FLOOR, None)
    return float(-0.5 * np.log(eig).mean())
