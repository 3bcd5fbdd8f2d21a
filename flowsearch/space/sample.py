r"""The reference sample: what a write's new rows are judged against, at a cost the corpus does
not set.

Drift (:mod:`flowsearch.space.drift`) places each new row's best score among the corpus's own
rows' best scores. Measured against the whole index, that is a top-1 search per new row whose
cost grows with the corpus (5.2 s of a 5.4 s upsert into 1M ``Flat`` rows). Instead, a version
keeps a fixed-size *sample* of its rows' searched vectors (at most
``Settings.reference_sample_rows``; every row of a smaller corpus) and a set of *probes* (the rows
the reference is measured on: held out of the calibrator's fit, or leave-one-out on a small
corpus; at most ``Settings.reference_max_rows``). A probe's best score is to the sample's rows
other than itself; a new row's is to all of them: the same figure on the same rows, so new rows
are judged like-for-like, and the check reads one file of ``sample x dim`` floats whatever the
corpus holds.

The sample follows the corpus through writes (:meth:`ReferenceSample.updated`):

- rows an upsert replaces, and rows deleted since (their id no longer live), leave the sample and
  the probes (entries are keyed by their id's key, :func:`flowsearch.storage.keys.keys_of`);
- a write's new rows enter each, seeded, in proportion to the rows written (reservoir style), so
  both stay uniform samples of the live corpus;
- only probes whose nearest sample row left, and new entries, are re-measured.

``recalibrate`` changes the searched space: the sample is drawn again from the rewritten rows.
An index written before the sample existed gets one drawn at its next write.

Example:
    >>> rng = np.random.default_rng(0)
    >>> Z = rng.normal(size=(300, 8)).astype(np.float32)
    >>> Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    >>> keys = np.arange(300, dtype=np.uint64)
    >>> s = ReferenceSample.measured(Z, keys, Z[:100], keys[:100])
    >>> s.n_sample, s.n_probes, bool(np.isfinite(s.probe_best).all())
    (300, 100, True)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from flowsearch.errors import IndexDamaged

__all__ = ["SAMPLE_FILE", "ReferenceSample", "best_against"]

#: The file a reference sample is saved as, inside its directory.
SAMPLE_FILE = "sample.npz"

#: Query rows scored against the sample per matrix product (bounds the (chunk, sample) block).
_CHUNK = 1024


def best_against(
    Z: np.ndarray, sample: np.ndarray, own: np.ndarray | None = None, keys: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each row of ``Z``'s best inner product over the rows of ``sample``.

    Args:
        Z: float32 (m, d) unit rows.
        sample: float32 (s, d) unit rows.
        own: uint64 (m,), each row's key, or None; a sample row with the same key (in ``keys``)
            is skipped (a row is not its own neighbour).
        keys: uint64 (s,), the sample rows' keys (with ``own``).

    Returns:
        ``(best, at)``: float64 (m,) (NaN when no row is left), int64 (m,) the sample row
        (-1 for none).
    """
    m = len(Z)
    best = np.full(m, np.nan)
    at = np.full(m, -1, np.int64)
    if not m or not len(sample):
        return best, at
    for start in range(0, m, _CHUNK):
        stop = min(start + _CHUNK, m)
        S = np.asarray(Z[start:stop], np.float32) @ np.asarray(sample, np.float32).T
        if own is not None and keys is not None:
            S[own[start:stop, None] == keys[None, :]] = -np.inf
        j = np.argmax(S, axis=1)
        top = S[np.arange(stop - start), j].astype(np.float64)
        ok = np.isfinite(top)
        best[start:stop] = np.where(ok, top, np.nan)
        at[start:stop] = np.where(ok, j, -1)
    return best, at


class ReferenceSample:
    """A sample of a version's rows and its probes, in the searched space (module docstring).

    Attributes:
        vectors: float32 (s, d), the sample's searched vectors.
        keys: uint64 (s,), their ids' keys.
        probe_vectors: float32 (p, d), the probes' searched vectors.
        probe_keys: uint64 (p,).
        probe_best: float64 (p,), each probe's best score to another sample row (NaN: none).
        probe_near: uint64 (p,), the key of that row (meaningless where ``probe_best`` is NaN).
        method: how the probes were first chosen (``held-out`` or ``leave-one-out``).
    """

    def __init__(self, vectors: np.ndarray, keys: np.ndarray, probe_vectors: np.ndarray,
                 probe_keys: np.ndarray, probe_best: np.ndarray, probe_near: np.ndarray,
                 method: str, *, rounded: bool = False) -> None:  # fmt: skip
        # held at the precision they are stored in (float16), so that what is measured now
        # and what a later write measures against the file agree exactly (``rounded``: the
        # vectors come from a sample's own, already so)
        def held(X: np.ndarray) -> np.ndarray:
            if rounded:
                return np.asarray(X, np.float32)
            return np.asarray(X, np.float16).astype(np.float32)

        self.vectors = held(vectors)
        self.keys = np.asarray(keys, np.uint64)
        self.probe_vectors = held(probe_vectors)
        self.probe_keys = np.asarray(probe_keys, np.uint64)
        self.probe_best = np.asarray(probe_best, np.float64)
        self.probe_near = np.asarray(probe_near, np.uint64)
        self.method = method

    @classmethod
    def measured(cls, vectors: np.ndarray, keys: np.ndarray, probe_vectors: np.ndarray,
                 probe_keys: np.ndarray, method: str = "held-out") -> ReferenceSample:  # fmt: skip
        """A sample with every probe measured against it."""
        out = cls(vectors, keys, probe_vectors, probe_keys, np.zeros(0), np.zeros(0, np.uint64),
                  method)  # fmt: skip
        out.probe_best, out.probe_near = out._measure(out.probe_vectors, out.probe_keys)
        return out

    @property
    def n_sample(self) -> int:
        """Rows in the sample."""
        return len(self.keys)

    @property
    def n_probes(self) -> int:
        """Probes (rows the reference is measured on)."""
        return len(self.probe_keys)

    @property
    def dim(self) -> int:
        """The searched dimension."""
        return int(self.vectors.shape[1]) if self.vectors.ndim == 2 else 0

    def _measure(self, Z: np.ndarray, own: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        best, at = best_against(Z, self.vectors, own, self.keys)
        near = np.where(at >= 0, self.keys[np.maximum(at, 0)], 0).astype(np.uint64)
        return best, near

    def best_scores(self, Z: np.ndarray) -> np.ndarray:
        """New rows' best scores (float64 (m,)) against the whole sample: what drift places
        among :attr:`probe_best`."""
        return best_against(Z, self.vectors)[0]

    def without(self, gone: np.ndarray, probes: bool = True) -> ReferenceSample:
        """The sample without the rows whose keys are in ``gone`` (deleted or replaced), in
        the sample and (``probes``) among the probes; probes whose nearest row left are
        measured again."""
        gone = np.asarray(gone, np.uint64)
        keep = ~np.isin(self.keys, gone)
        keep_p = ~np.isin(self.probe_keys, gone) if probes else np.ones(self.n_probes, bool)
        if keep.all() and keep_p.all():
            return self
        out = ReferenceSample(self.vectors[keep], self.keys[keep], self.probe_vectors[keep_p],
                              self.probe_keys[keep_p], self.probe_best[keep_p],
                              self.probe_near[keep_p], self.method, rounded=True)  # fmt: skip
        if not keep.all():
            stale = np.isin(out.probe_near, gone) | ~np.isfinite(out.probe_best)
            if stale.any():
                best, near = out._measure(out.probe_vectors[stale], out.probe_keys[stale])
                out.probe_best[stale], out.probe_near[stale] = best, near
        return out

    def updated(self, n_live: int, Z: np.ndarray, keys: np.ndarray, n_new: int, most: int,
                most_probes: int, seed: int) -> ReferenceSample:  # fmt: skip
        """The sample after a write added ``n_new`` rows to ``n_live`` live ones.

        Args:
            n_live: live rows before the write (those it replaces not counted).
            Z: float32 (q, d), a uniform sample of the new rows (all of them when ``q`` ==
                ``n_new``), at least as many as may enter; keys: uint64 (q,), their keys.
            n_new: rows the write added.
            most: the sample's size bound (``Settings.reference_sample_rows``).
            most_probes: the probes' bound (``Settings.reference_max_rows``).
            seed: seeds which rows enter and which leave.

        Returns:
            A uniform sample of the ``n_live + n_new`` rows (as uniform as the one before):
            each new row enters the sample with probability ``size / total`` (all of them
            while the corpus fits), evicting uniformly chosen old entries past ``most``; each
            enters the probes with the probes' share of the live rows (uniformly chosen probes
            leave past ``most_probes``). Only what changed is measured.
        """
        rng = np.random.default_rng(seed)
        total = n_live + n_new
        if n_new == 0 or not len(Z):
            return self
        Z = np.asarray(Z, np.float16).astype(np.float32)  # the precision the sample holds
        s = self.n_sample
        target = min(most, total)
        if s >= n_live:  # the sample holds every live row: every new row enters
            k = min(n_new, target)
        else:
            k = int(rng.binomial(n_new, min(1.0, target / total)))
        k = min(k, len(Z))
        old_kept = min(s, target - k)
        entering = np.sort(rng.choice(len(Z), k, replace=False)).astype(np.int64)
        kept = np.sort(rng.choice(s, old_kept, replace=False)) if old_kept < s else np.arange(s)
        share = self.n_probes / max(n_live, 1)
        kp = int(rng.binomial(n_new, min(1.0, share))) if self.n_probes else 0
        kp = min(kp, len(Z), most_probes)
        new_probes = np.sort(rng.choice(len(Z), kp, replace=False)).astype(np.int64)
        p_kept = min(self.n_probes, max(most_probes - kp, 0))
        if not len(entering) and old_kept == s and not kp:
            return self
        out = self
        if p_kept < self.n_probes:  # probes past the bound leave (uniformly chosen)
            keep_p = np.sort(rng.choice(self.n_probes, p_kept, replace=False))
            out = ReferenceSample(out.vectors, out.keys, out.probe_vectors[keep_p],
                                  out.probe_keys[keep_p], out.probe_best[keep_p],
                                  out.probe_near[keep_p], out.method, rounded=True)  # fmt: skip
        gone = self.keys[np.setdiff1d(np.arange(s), kept)]
        out = out.without(gone, probes=False) if len(gone) else out
        # new sample rows: each probe may find a nearer row among them
        add_keys = np.asarray(keys, np.uint64)[entering]
        add_vecs = np.asarray(Z, np.float32)[entering]
        if len(entering):
            best, at = best_against(out.probe_vectors, add_vecs, out.probe_keys, add_keys)
            closer = np.isfinite(best) & ~(best <= out.probe_best)  # NaN best: anything is
            probe_best = out.probe_best.copy()
            probe_near = out.probe_near.copy()
            probe_best[closer] = best[closer]
            probe_near[closer] = add_keys[at[closer]]
            out = ReferenceSample(np.concatenate([out.vectors, add_vecs]),
                                  np.concatenate([out.keys, add_keys]), out.probe_vectors,
                                  out.probe_keys, probe_best, probe_near, out.method,
                                  rounded=True)  # fmt: skip
        if kp:
            pv = np.asarray(Z, np.float32)[new_probes]
            pk = np.asarray(keys, np.uint64)[new_probes]
            best, near = out._measure(pv, pk)
            out = ReferenceSample(out.vectors, out.keys,
                                  np.concatenate([out.probe_vectors, pv]),
                                  np.concatenate([out.probe_keys, pk]),
                                  np.concatenate([out.probe_best, best]),
                                  np.concatenate([out.probe_near, near]), out.method,
                                  rounded=True)  # fmt: skip
        return out

    # -- files -----------------------------------------------------------------------------

    def save(self, directory: Path) -> None:
        """Write :data:`SAMPLE_FILE` into ``directory`` (a writer's staging directory): the
        vectors as float16 (the precision :class:`ReferenceSample` holds them in: half the bytes
        a write adds; a cosine moves by ~1e-3, far inside a percentile step)."""
        with open(Path(directory) / SAMPLE_FILE, "wb") as handle:
            np.savez(handle, vectors=self.vectors.astype(np.float16), keys=self.keys,
                     probe_vectors=self.probe_vectors.astype(np.float16),
                     probe_keys=self.probe_keys,
                     probe_best=self.probe_best, probe_near=self.probe_near,
                     method=np.array(self.method))  # fmt: skip

    @classmethod
    def load(cls, directory: Path, dim: int) -> ReferenceSample:
        """Read what :meth:`save` wrote.

        Raises:
            IndexDamaged: a file that is not a reference sample of dimension ``dim``.
        """
        path = Path(directory) / SAMPLE_FILE
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays: dict[str, Any] = {name: data[name] for name in data.files}
            out = cls(arrays["vectors"], arrays["keys"], arrays["probe_vectors"],
                      arrays["probe_keys"], arrays["probe_best"], arrays["probe_near"],
                      str(arrays["method"]))  # fmt: skip
        except (OSError, ValueError, KeyError) as exc:
            raise IndexDamaged(
                f"the reference sample {path} is unreadable ({type(exc).__name__})",
                "rebuild the index, or recalibrate it to draw a new sample",
            ) from None
        shapes_ok = (
            out.vectors.ndim == 2
            and out.vectors.shape == (out.n_sample, dim)
            and out.probe_vectors.shape == (out.n_probes, dim)
            and out.probe_best.shape == (out.n_probes,)
            and out.probe_near.shape == (out.n_probes,)
        )
        if not shapes_ok:
            raise IndexDamaged(
                f"the reference sample {path} does not match the index (dimension {dim})",
                "rebuild the index, or recalibrate it to draw a new sample",
            )
        return out
