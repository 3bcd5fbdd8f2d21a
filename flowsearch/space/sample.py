r"""The reference sample: what a write's new rows are judged against, at a cost the corpus does
not set.

Drift (:mod:`flowsearch.space.drift`) places each new row's best score among the corpus's own
rows' best scores. Measured against the whole index, that is a top-1 search per new row whose
cost grows with the corpus, most of a small write's time on a large index. Instead, a version
keeps a fixed-size *sample* of its rows' searched vectors (at most :data:`REFERENCE_SAMPLE_ROWS`;
every row of a smaller corpus) and a set of *probes* (the rows the reference is measured on:
held out of the calibrator's fit, or leave-one-out on a small corpus; at most
:data:`~flowsearch.space.reference.REFERENCE_MAX_ROWS`). A probe's best score is to the sample's
rows other than itself; a new row's is to all of them: the same figure on the same rows, so new rows
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

**On disk, a write pays for what it changes.** A sample is a *base* file (:data:`SAMPLE_FILE`,
the whole sample) followed by *deltas* (:data:`DELTA_FILE`, one per write that changed it: the
entries that left, the rows that entered, the probes whose figure changed; :class:`SampleDelta`).
Every entry has a *serial*, implicit in the files (a base's entries are numbered in order, each
delta's entering ones after the highest number so far), so a delta names what left without
ambiguity (an id's passages share a key). A small write into a large index changes a few
entries: its delta is a small fraction of the whole sample. The writer folds the chain into a
new base when the deltas grow past a bound (``flowsearch.writes.measure.REFERENCE_DELTA_SHARE``,
``REFERENCE_DELTA_MAX``).

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

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from flowsearch.errors import IndexDamaged

__all__ = ["DELTA_FILE", "SAMPLE_FILE", "ReferenceSample", "SampleDelta", "best_against"]

#: The file a reference sample is saved as, inside its directory.
SAMPLE_FILE = "sample.npz"
#: The file a write's change to a reference sample is saved as, inside its directory.
DELTA_FILE = "delta.npz"
#: Rows of the reference sample new rows are judged against: a drift check reads this many
#: vectors whatever the corpus holds, enough for its percentiles to be steady.
REFERENCE_SAMPLE_ROWS = 4096

#: Entries' and probes' serials, and the next of each (see :class:`ReferenceSample`).
_Serials = tuple[np.ndarray, np.ndarray, int, int]

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
        # float64 products, rounded once to float32: the same bits whatever the BLAS build, its
        # threads or the chunk's shape (a float32 product's last bit depends on all three)
        S = (np.asarray(Z[start:stop], np.float64) @ np.asarray(sample, np.float64).T).astype(
            np.float32
        )
        if own is not None and keys is not None:
            S[own[start:stop, None] == keys[None, :]] = -np.inf
        j = np.argmax(S, axis=1)
        top = S[np.arange(stop - start), j].astype(np.float64)
        ok = np.isfinite(top)
        best[start:stop] = np.where(ok, top, np.nan)
        at[start:stop] = np.where(ok, j, -1)
    return best, at


def _rounded(X: np.ndarray) -> np.ndarray:
    """``X`` at the precision a sample holds its vectors in (float16), as float32."""
    return np.asarray(X, np.float16).astype(np.float32)


def _damaged(path: Path, what: str) -> IndexDamaged:
    return IndexDamaged(
        f"the reference sample {path} {what}",
        "rebuild the index, or recalibrate it to draw a new sample",
    )


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise _damaged(path, f"is unreadable ({type(exc).__name__})") from None


class SampleDelta:
    """What one write changed in a reference sample (module docstring): the entries that left
    (by serial), the rows that entered (appended, in order), the same for the probes, and the
    kept probes whose best score or nearest row changed.

    Attributes:
        out: int64, serials of the sample entries that left.
        vectors: float32 (k, d), the entering rows' vectors (float16 precision); keys: uint64 (k,).
        probes_out: int64, serials of the probes that left.
        probe_vectors, probe_keys, probe_best, probe_near: the entering probes.
        changed: int64, serials of kept probes measured again; changed_best: float64;
            changed_near: uint64 (their new figures).
    """

    FIELDS = ("out", "vectors", "keys", "probes_out", "probe_vectors", "probe_keys",
              "probe_best", "probe_near", "changed", "changed_best", "changed_near")  # fmt: skip

    def __init__(self, **arrays: np.ndarray) -> None:
        self.out = np.asarray(arrays["out"], np.int64)
        self.vectors = _rounded(arrays["vectors"])
        self.keys = np.asarray(arrays["keys"], np.uint64)
        self.probes_out = np.asarray(arrays["probes_out"], np.int64)
        self.probe_vectors = _rounded(arrays["probe_vectors"])
        self.probe_keys = np.asarray(arrays["probe_keys"], np.uint64)
        self.probe_best = np.asarray(arrays["probe_best"], np.float64)
        self.probe_near = np.asarray(arrays["probe_near"], np.uint64)
        self.changed = np.asarray(arrays["changed"], np.int64)
        self.changed_best = np.asarray(arrays["changed_best"], np.float64)
        self.changed_near = np.asarray(arrays["changed_near"], np.uint64)

    @property
    def nbytes(self) -> int:
        """About the bytes its file takes (vectors as float16)."""
        total = 0
        for name in self.FIELDS:
            array = getattr(self, name)
            total += array.size * (2 if name.endswith("vectors") else array.itemsize)
        return total

    def save(self, directory: Path) -> None:
        """Write :data:`DELTA_FILE` into ``directory`` (a writer's staging directory)."""
        arrays = {name: getattr(self, name) for name in self.FIELDS}
        for name in ("vectors", "probe_vectors"):
            arrays[name] = arrays[name].astype(np.float16)
        with open(Path(directory) / DELTA_FILE, "wb") as handle:
            np.savez(handle, **arrays)

    @classmethod
    def load(cls, directory: Path, dim: int) -> SampleDelta:
        """Read what :meth:`save` wrote.

        Raises:
            IndexDamaged: a file that is not a sample delta of dimension ``dim``.
        """
        path = Path(directory) / DELTA_FILE
        arrays = _read_npz(path)
        try:
            out = cls(**{name: arrays[name] for name in cls.FIELDS})
        except (KeyError, ValueError, TypeError):
            raise _damaged(path, "is not a sample delta") from None
        k, p, c = len(out.keys), len(out.probe_keys), len(out.changed)
        shapes_ok = (
            out.vectors.shape == (k, dim)
            and out.probe_vectors.shape == (p, dim)
            and out.probe_best.shape == out.probe_near.shape == (p,)
            and out.changed_best.shape == out.changed_near.shape == (c,)
            and all(getattr(out, n).ndim == 1 for n in ("out", "keys", "probes_out", "changed"))
        )
        if not shapes_ok:
            raise _damaged(path, f"does not match the index (dimension {dim})")
        return out


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
        serials, probe_serials: int64 (s,) and (p,), increasing: each entry's number (module
            docstring); next_serial, next_probe_serial: the numbers the next entering ones get.
        lineage: shared by the samples derived from one drawn or read (:meth:`delta_from`).
    """

    def __init__(self, vectors: np.ndarray, keys: np.ndarray, probe_vectors: np.ndarray,
                 probe_keys: np.ndarray, probe_best: np.ndarray, probe_near: np.ndarray,
                 method: str, *, rounded: bool = False,
                 serials: _Serials | None = None, lineage: object = None) -> None:  # fmt: skip
        # held at the precision they are stored in (float16), so that what is measured now
        # and what a later write measures against the file agree exactly (``rounded``: the
        # vectors come from a sample's own, already so)
        def held(X: np.ndarray) -> np.ndarray:
            return np.asarray(X, np.float32) if rounded else _rounded(X)

        self.vectors = held(vectors)
        self.keys = np.asarray(keys, np.uint64)
        self.probe_vectors = held(probe_vectors)
        self.probe_keys = np.asarray(probe_keys, np.uint64)
        self.probe_best = np.asarray(probe_best, np.float64)
        self.probe_near = np.asarray(probe_near, np.uint64)
        self.method = method
        if serials is None:  # a sample as drawn (or a base file): its entries in order
            s, p = len(self.keys), len(self.probe_keys)
            serials = (np.arange(s, dtype=np.int64), np.arange(p, dtype=np.int64), s, p)
        self.serials, self.probe_serials = serials[0], serials[1]
        self.next_serial, self.next_probe_serial = serials[2], serials[3]
        # what it was derived from (a sample drawn, or read from its files): serials compare
        # only within one lineage
        self.lineage = object() if lineage is None else lineage

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

    # -- changes: each keeps a subset of the entries in order, then appends ---------------

    def _subset(self, keep: np.ndarray | None, keep_p: np.ndarray | None) -> ReferenceSample:
        """The entries ``keep`` (a mask or sorted positions; None: all) and probes ``keep_p``."""
        k = slice(None) if keep is None else keep
        kp = slice(None) if keep_p is None else keep_p
        return ReferenceSample(
            self.vectors[k], self.keys[k], self.probe_vectors[kp], self.probe_keys[kp],
            self.probe_best[kp], self.probe_near[kp], self.method, rounded=True,
            serials=(self.serials[k], self.probe_serials[kp], self.next_serial,
                     self.next_probe_serial), lineage=self.lineage,
        )  # fmt: skip

    def _plus(self, vectors: np.ndarray, keys: np.ndarray) -> ReferenceSample:
        """With rows (float16-precision vectors) appended to the sample, numbered next."""
        k = len(keys)
        serials = np.concatenate([self.serials, self.next_serial + np.arange(k, dtype=np.int64)])
        return ReferenceSample(
            np.concatenate([self.vectors, vectors]), np.concatenate([self.keys, keys]),
            self.probe_vectors, self.probe_keys, self.probe_best, self.probe_near, self.method,
            rounded=True, serials=(serials, self.probe_serials, self.next_serial + k,
                                   self.next_probe_serial), lineage=self.lineage,
        )  # fmt: skip

    def _plus_probes(self, vectors: np.ndarray, keys: np.ndarray, best: np.ndarray,
                     near: np.ndarray) -> ReferenceSample:  # fmt: skip
        """With probes appended, numbered next."""
        k = len(keys)
        nxt = self.next_probe_serial
        serials = np.concatenate([self.probe_serials, nxt + np.arange(k, dtype=np.int64)])
        return ReferenceSample(
            self.vectors, self.keys, np.concatenate([self.probe_vectors, vectors]),
            np.concatenate([self.probe_keys, keys]), np.concatenate([self.probe_best, best]),
            np.concatenate([self.probe_near, near]), self.method, rounded=True,
            serials=(self.serials, serials, self.next_serial, nxt + k), lineage=self.lineage,
        )  # fmt: skip

    def without(self, gone: np.ndarray, probes: bool = True) -> ReferenceSample:
        """The sample without the rows whose keys are in ``gone`` (deleted or replaced), in
        the sample and (``probes``) among the probes; probes whose nearest row left are
        measured again."""
        gone = np.asarray(gone, np.uint64)
        keep = ~np.isin(self.keys, gone)
        keep_p = ~np.isin(self.probe_keys, gone) if probes else np.ones(self.n_probes, bool)
        if keep.all() and keep_p.all():
            return self
        out = self._subset(keep, keep_p)
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
            most: the sample's size bound (:data:`REFERENCE_SAMPLE_ROWS`).
            most_probes: the probes' bound
                (:data:`~flowsearch.space.reference.REFERENCE_MAX_ROWS`).
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
        Z = _rounded(Z)  # the precision the sample holds
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
            out = out._subset(None, np.sort(rng.choice(self.n_probes, p_kept, replace=False)))
        gone = self.keys[np.setdiff1d(np.arange(s), kept)]
        out = out.without(gone, probes=False) if len(gone) else out
        # new sample rows: each probe may find a nearer row among them
        add_keys = np.asarray(keys, np.uint64)[entering]
        add_vecs = Z[entering]
        if len(entering):
            best, at = best_against(out.probe_vectors, add_vecs, out.probe_keys, add_keys)
            closer = np.isfinite(best) & ~(best <= out.probe_best)  # NaN best: anything is
            out = out._plus(add_vecs, add_keys)
            out.probe_best = out.probe_best.copy()
            out.probe_near = out.probe_near.copy()
            out.probe_best[closer] = best[closer]
            out.probe_near[closer] = add_keys[at[closer]]
        if kp:
            pv = Z[new_probes]
            pk = np.asarray(keys, np.uint64)[new_probes]
            out = out._plus_probes(pv, pk, *out._measure(pv, pk))
        return out

    # -- deltas ----------------------------------------------------------------------------

    def delta_from(self, parent: ReferenceSample) -> SampleDelta | None:
        """What changed from ``parent`` to this sample (derived from it by :meth:`without`
        and :meth:`updated`), or None when this sample is not so derived (drawn or read
        again): ``parent.applied(delta)`` equals this sample."""
        if self.lineage is not parent.lineage:  # drawn again, or read again: not comparable
            return None
        kept = np.isin(parent.serials, self.serials)
        kept_p = np.isin(parent.probe_serials, self.probe_serials)
        n, n_p = int(kept.sum()), int(kept_p.sum())
        entered = self.next_serial - parent.next_serial
        entered_p = self.next_probe_serial - parent.next_probe_serial
        derived = (
            np.array_equal(self.serials[:n], parent.serials[kept])
            and np.array_equal(self.serials[n:], parent.next_serial + np.arange(entered))
            and np.array_equal(self.probe_serials[:n_p], parent.probe_serials[kept_p])
            and np.array_equal(
                self.probe_serials[n_p:], parent.next_probe_serial + np.arange(entered_p)
            )
        )
        if not derived:
            return None
        old_best, old_near = parent.probe_best[kept_p], parent.probe_near[kept_p]
        new_best, new_near = self.probe_best[:n_p], self.probe_near[:n_p]
        same = (old_best == new_best) | (np.isnan(old_best) & np.isnan(new_best))
        moved = ~same | (old_near != new_near)
        return SampleDelta(
            out=parent.serials[~kept], vectors=self.vectors[n:], keys=self.keys[n:],
            probes_out=parent.probe_serials[~kept_p], probe_vectors=self.probe_vectors[n_p:],
            probe_keys=self.probe_keys[n_p:], probe_best=self.probe_best[n_p:],
            probe_near=self.probe_near[n_p:], changed=self.probe_serials[:n_p][moved],
            changed_best=new_best[moved], changed_near=new_near[moved],
        )  # fmt: skip

    def applied(self, delta: SampleDelta, where: Path | None = None) -> ReferenceSample:
        """This sample with ``delta`` applied (see :meth:`delta_from`).

        Raises:
            IndexDamaged: a delta naming entries this sample does not hold (``where``: its
                directory, for the message).
        """
        out_at = np.searchsorted(self.serials, delta.out)
        probes_at = np.searchsorted(self.probe_serials, delta.probes_out)
        fits = _found(self.serials, delta.out, out_at) and _found(
            self.probe_serials, delta.probes_out, probes_at
        )
        if not fits:
            raise _damaged(Path(where or "."), "does not follow the sample before it")
        keep = np.ones(self.n_sample, bool)
        keep[out_at] = False
        keep_p = np.ones(self.n_probes, bool)
        keep_p[probes_at] = False
        out = self._subset(keep, keep_p)._plus(delta.vectors, delta.keys)
        out = out._plus_probes(delta.probe_vectors, delta.probe_keys, delta.probe_best,
                               delta.probe_near)  # fmt: skip
        at = np.searchsorted(out.probe_serials, delta.changed)
        if not _found(out.probe_serials, delta.changed, at):
            raise _damaged(Path(where or "."), "does not follow the sample before it")
        out.probe_best, out.probe_near = out.probe_best.copy(), out.probe_near.copy()
        out.probe_best[at], out.probe_near[at] = delta.changed_best, delta.changed_near
        return out

    # -- files -----------------------------------------------------------------------------

    def save(self, directory: Path) -> None:
        """Write :data:`SAMPLE_FILE` (a base) into ``directory`` (a writer's staging
        directory): the vectors as float16 (the precision :class:`ReferenceSample` holds them
        in: half the bytes; a cosine moves by ~1e-3, far inside a percentile step)."""
        with open(Path(directory) / SAMPLE_FILE, "wb") as handle:
            np.savez(handle, vectors=self.vectors.astype(np.float16), keys=self.keys,
                     probe_vectors=self.probe_vectors.astype(np.float16),
                     probe_keys=self.probe_keys,
                     probe_best=self.probe_best, probe_near=self.probe_near,
                     method=np.array(self.method))  # fmt: skip

    @classmethod
    def load(cls, directory: Path, dim: int, deltas: Sequence[Path] = ()) -> ReferenceSample:
        """Read what :meth:`save` wrote, with the :class:`SampleDelta` files in ``deltas``
        (directories, in order) applied.

        Raises:
            IndexDamaged: a file that is not a reference sample of dimension ``dim``, or a
                delta that does not follow the sample before it.
        """
        path = Path(directory) / SAMPLE_FILE
        arrays = _read_npz(path)
        try:
            out = cls(arrays["vectors"], arrays["keys"], arrays["probe_vectors"],
                      arrays["probe_keys"], arrays["probe_best"], arrays["probe_near"],
                      str(arrays["method"]))  # fmt: skip
        except (ValueError, KeyError, TypeError):
            raise _damaged(path, "is unreadable (not a reference sample)") from None
        shapes_ok = (
            out.vectors.ndim == 2
            and out.vectors.shape == (out.n_sample, dim)
            and out.probe_vectors.shape == (out.n_probes, dim)
            and out.probe_best.shape == (out.n_probes,)
            and out.probe_near.shape == (out.n_probes,)
        )
        if not shapes_ok:
            raise _damaged(path, f"does not match the index (dimension {dim})")
        for folder in deltas:
            out = out.applied(SampleDelta.load(folder, dim), Path(folder) / DELTA_FILE)
        return out


def _found(serials: np.ndarray, wanted: np.ndarray, at: np.ndarray) -> bool:
    """Every serial in ``wanted`` is in ``serials`` (increasing) at ``at``, each once."""
    if not len(wanted):
        return True
    inside = (at < len(serials)).all() and np.array_equal(
        serials[np.minimum(at, len(serials) - 1)], wanted
    )
    return bool(inside and len(np.unique(wanted)) == len(wanted))
