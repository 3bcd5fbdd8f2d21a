r"""The second release's one-segment lexical index, kept for that release's storage layout.

Until the segment storage replaces them, the writers (``writes/``) and the reader
(``search/version.py``) of the current layout keep one lexical index per version, over global
rows, which they add to, delete from and compact. :class:`LexicalIndex` is that index on the new
modules: one :class:`~flowsearch.lexical.postings.Postings` and a deletion mask, searched by
:class:`~flowsearch.lexical.bm25.Bm25`, so it answers exactly as the release did. It reads and
writes the release's files (format 1, whose ``live.npy`` holds the deletions). Remove this module
when nothing imports it.

Example:
    >>> lex = LexicalIndex.build(["tides rise twice a day", "heat pumps move heat"])
    >>> lex.delete([1])
    1
    >>> lex.search(["heat and tides"], k=5)[1].tolist()
    [[0]]
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from flowsearch.errors import BadInput, IndexDamaged
from flowsearch.lexical.bm25 import Bm25, Method
from flowsearch.lexical.postings import Int64, Mask, Postings, check_mask

__all__ = ["LexicalIndex"]


class LexicalIndex:
    """BM25 over global rows, with a deletion mask: the current layout's lexical index.

    Args:
        postings: the rows' postings.
        deleted: bool (n_rows,), True for a deleted row, or None for none.
        k1, b, method: as :class:`~flowsearch.lexical.bm25.Bm25`.
    """

    def __init__(
        self,
        postings: Postings,
        deleted: Mask | None = None,
        *,
        k1: float = 1.5,
        b: float = 0.75,
        method: Method = "lucene",
    ) -> None:
        if deleted is not None:
            check_mask(deleted, postings.n_rows, "deleted")
        self.postings = postings
        self.deleted = np.zeros(postings.n_rows, bool) if deleted is None else deleted.copy()
        self.params: dict[str, Any] = {"k1": float(k1), "b": float(b), "method": method}
        self._bm25 = Bm25([(postings, self.deleted)], k1=k1, b=b, method=method)

    @classmethod
    def build(
        cls, texts: Iterable[str], *, k1: float = 1.5, b: float = 0.75, method: Method = "lucene"
    ) -> LexicalIndex:
        """Index ``texts``; text ``i`` (in iteration order) is row ``i``."""
        return cls(Postings.build(texts), k1=k1, b=b, method=method)

    def _replace(self, postings: Postings, deleted: Mask) -> None:
        # a new mask object each time: Bm25 keeps per-mask statistics by identity
        self.postings, self.deleted = postings, deleted
        self._bm25 = Bm25([(postings, deleted)], **self.params)

    def add(self, texts: Iterable[str]) -> Int64:
        """Append ``texts`` as new rows; returns their rows, int64 (m,)."""
        new = Postings.build(texts)
        first = self.n_rows
        if new.n_rows:
            merged = Postings.merge([(self.postings, None), (new, None)])
            self._replace(merged, np.concatenate([self.deleted, np.zeros(new.n_rows, bool)]))
        return np.arange(first, first + new.n_rows, dtype=np.int64)

    def delete(self, rows: Sequence[int] | npt.NDArray[np.integer[Any]]) -> int:
        """Mark ``rows`` deleted; returns how many were live. Rows keep their numbers.

        Raises:
            BadInput: for a row outside ``[0, n_rows)``.
        """
        picked = np.asarray(rows, dtype=np.int64).reshape(-1)
        bad = picked[(picked < 0) | (picked >= self.n_rows)]
        if bad.size:
            raise BadInput(
                f"cannot delete row {int(bad[0])}: the lexical index has rows 0..{self.n_rows - 1}",
                "rebuild it from the shards",
            )
        was_live = int(np.count_nonzero(~self.deleted[np.unique(picked)]))
        if was_live:
            deleted = self.deleted.copy()
            deleted[picked] = True
            self._replace(self.postings, deleted)
        return was_live

    def compact(self) -> Int64:
        """Drop deleted rows (and terms only they held), renumbering the rest in order.

        Returns:
            int64 (n_live,): the old row of each new row.
        """
        kept = np.flatnonzero(~self.deleted).astype(np.int64)
        merged = Postings.merge([(self.postings, ~self.deleted)])
        self._replace(merged, np.zeros(merged.n_rows, bool))
        return kept

    @property
    def n_rows(self) -> int:
        """Rows, deleted ones included."""
        return self.postings.n_rows

    @property
    def n_live(self) -> int:
        """Rows not deleted."""
        return self._bm25.n_live

    @property
    def live(self) -> Mask:
        """bool (n_rows,), False for a deleted row (a copy)."""
        return ~self.deleted

    @property
    def vocab_size(self) -> int:
        """Distinct terms (including those only deleted rows hold, until :meth:`compact`)."""
        return self.postings.n_terms

    @property
    def nnz(self) -> int:
        """Postings: distinct (term, row) pairs."""
        return self.postings.nnz

    def search(
        self, queries: Sequence[str] | str, k: int, *, allowed: Mask | None = None
    ) -> tuple[npt.NDArray[np.float32], Int64]:
        """:meth:`flowsearch.lexical.bm25.Bm25.search` over the live rows."""
        return self._bm25.search(queries, k, allowed=allowed)

    def save(self, directory: str | Path) -> None:
        """Write the release's files (format 1) into ``directory``."""
        directory = Path(directory)
        (directory / "live.npy").unlink(missing_ok=True)  # ours; Postings.save refuses others
        self.postings.save(directory)
        config = json.loads((directory / "config.json").read_text())
        config.update(format_version=1, n_live=self.n_live, **self.params)
        (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        np.save(directory / "live.npy", ~self.deleted, allow_pickle=False)

    @classmethod
    def load(cls, directory: str | Path) -> LexicalIndex:
        """Open a directory :meth:`save` (or the second release) wrote.

        Raises:
            NotFound, IndexDamaged: as :meth:`Postings.load`, and for a ``live.npy`` that is
                not bool (n_rows,) or a format other than 1.
        """
        directory = Path(directory)
        postings = Postings.load(directory)
        config = json.loads((directory / "config.json").read_text())
        if config.get("format_version") != 1:
            raise IndexDamaged(f"{directory} is not a lexical index of format 1", "rebuild it")
        try:
            live = np.load(directory / "live.npy", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise IndexDamaged(f"cannot read {directory}/live.npy ({exc})", "rebuild it") from None
        if live.dtype != bool or live.shape != (postings.n_rows,):
            raise IndexDamaged(f"{directory}/live.npy does not match the rows", "rebuild it")
        params = {name: config.get(name) for name in ("k1", "b", "method")}
        if not (isinstance(params["k1"], float | int) and isinstance(params["b"], float | int)):
            raise IndexDamaged(f"{directory}/config.json lacks k1 and b", "rebuild it")
        return cls(postings, ~live, **params)
