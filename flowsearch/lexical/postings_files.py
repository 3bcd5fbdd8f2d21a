r"""The files of a segment's postings: formats 2 and 3 written, formats 1 to 3 read.

A postings directory holds ``config.json`` (format, tokeniser, counts), ``vocab.json`` (the
terms, a JSON list; term id ``t`` is entry ``t``) and four plain ``.npy`` arrays (:data:`FILES`),
read with ``allow_pickle=False``: nothing is ever unpickled. Format 1 is what the second
release's ``LexicalIndex.save`` wrote: the same files plus ``live.npy`` (that index's own
deletions, which postings do not hold: the segment's deletion file does) and the BM25
parameters in ``config.json``; it is read, ``live.npy`` and the parameters ignored. Format 3
is format 2 plus ``leads.npy`` (where each row's document terms are held: postings that score
long documents whole); postings without leads are still written as format 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from flowsearch.errors import BadInput, IndexDamaged, NotFound

__all__ = ["ARRAYS", "FILES", "FORMAT", "FORMAT_VERSION", "LEGACY_FILES", "read", "write"]

FORMAT = "flowsearch-lexical"
FORMAT_VERSION = 3
#: The file of format 3's ``leads`` array.
LEADS_FILE = "leads.npy"
#: The arrays, by :class:`~flowsearch.lexical.postings.Postings` field, and their files.
ARRAYS = {
    "indptr": "indptr.npy",
    "rows": "postings_rows.npy",
    "tf": "postings_tf.npy",
    "lengths": "doc_lengths.npy",
}
#: Every file of format 2 (:func:`write` without leads); format 3 adds :data:`LEADS_FILE`.
FILES = ("config.json", "vocab.json", *ARRAYS.values())
#: The files of format 1 (the second release); its ``live.npy`` is not read.
LEGACY_FILES = (*FILES, "live.npy")
_INT32_MAX = int(np.iinfo(np.int32).max)


def write(
    directory: Path, vocab: list[str], arrays: dict[str, np.ndarray], counts: dict[str, int]
) -> None:
    """Write :data:`FILES` (and :data:`LEADS_FILE` when ``arrays`` holds ``leads``: format 3)
    into ``directory`` (created if needed); ``counts`` go to the config.

    Raises:
        BadInput: when ``directory`` holds any other file.
    """
    directory.mkdir(parents=True, exist_ok=True)
    leads = arrays.get("leads")
    names = (*FILES, LEADS_FILE) if leads is not None else FILES
    strangers = sorted(p.name for p in directory.iterdir() if p.name not in names)
    if strangers:
        raise BadInput(
            f"{directory} holds {', '.join(strangers[:5])}, which are not postings files",
            "save postings into an empty directory",
        )
    config = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION if leads is not None else 2,
        "tokenizer": {"stemmer": "english", "stopwords": "bm25s.STOPWORDS_EN"},
        **counts,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    for name, file in ARRAYS.items():
        np.save(directory / file, arrays[name], allow_pickle=False)
    if leads is not None:
        np.save(directory / LEADS_FILE, leads, allow_pickle=False)


def read(directory: Path, mmap: bool) -> tuple[list[str], dict[str, Any]]:
    """(vocab, arrays by field) of a postings directory of format 1, 2 or 3, checked.

    With ``mmap`` the arrays are memory-mapped read-only, and the checks that would read every
    page or hash every term are left to the first query that needs them.

    Raises:
        NotFound: no directory there.
        IndexDamaged: a missing or unreadable file, another format, or arrays that do not fit
            together (a file beside them is a stray of the index: ignored).
    """
    if not directory.is_dir():
        raise NotFound(f"no postings at {directory}", "rebuild the index")
    config = _read_json(directory / "config.json")
    version = config.get("format_version") if isinstance(config, dict) else None
    if not isinstance(config, dict) or config.get("format") != FORMAT or version not in (1, 2, 3):
        raise IndexDamaged(f"{directory} is not a {FORMAT} directory", "rebuild the index")
    expected = {1: LEGACY_FILES, 2: FILES, 3: (*FILES, LEADS_FILE)}[version]
    # a file beside them is a stray of the index (info --verify lists it, the next write
    # removes it): not read, not refused
    missing = [f for f in expected if not (directory / f).is_file()]
    if missing:
        shown = ", ".join(f"no {f}" for f in missing[:5])
        raise IndexDamaged(f"postings {directory} are incomplete ({shown})", "rebuild the index")
    vocab = _read_json(directory / "vocab.json")
    arrays = {name: _read_array(directory / file, mmap) for name, file in ARRAYS.items()}
    if version == 3:
        arrays["leads"] = _read_array(directory / LEADS_FILE, mmap)
    problem = _problem(vocab, arrays, full=not mmap)
    if problem:
        raise IndexDamaged(f"postings {directory} are damaged ({problem})", "rebuild the index")
    return vocab, arrays


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise IndexDamaged(f"cannot read {path} ({exc})", "rebuild the index") from None


def _read_array(path: Path, mmap: bool) -> Any:
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise IndexDamaged(f"cannot read {path} ({exc})", "rebuild the index") from None


def _problem(vocab: Any, arrays: dict[str, Any], full: bool) -> str | None:
    """What is wrong with loaded files: kinds and shapes always; when ``full``, value ranges
    (O(nnz)) and repeated terms (a hash of every term)."""
    if not (isinstance(vocab, list) and all(isinstance(t, str) for t in vocab)):
        return "vocab.json is not a list of strings"
    if full and len(set(vocab)) != len(vocab):  # else found when the term index is built
        return "vocab.json repeats a term"
    if any(not isinstance(a, np.ndarray) or a.ndim != 1 for a in arrays.values()):
        return "an array is not 1-D"
    if any(a.dtype.kind not in "iu" for a in arrays.values()):
        return "an array is not of integers"
    indptr, rows, tf, lengths = (arrays[n] for n in ("indptr", "rows", "tf", "lengths"))
    if indptr.shape != (len(vocab) + 1,) or indptr[0] != 0 or indptr[-1] != len(rows):
        return "indptr does not match the vocabulary and the postings"
    if np.any(np.diff(indptr) < 0) or rows.shape != tf.shape:
        return "indptr is not an offset array"
    if len(lengths) > _INT32_MAX:
        return "more than 2**31 - 1 rows"
    if full and len(rows) and (rows.min() < 0 or rows.max() >= len(lengths) or tf.min() < 1):
        return "a posting is out of range"
    if full and len(lengths) and (lengths.min() < 0 or lengths.max() > _INT32_MAX):
        return "a row length is out of range"
    leads = arrays.get("leads")
    if leads is not None and leads.shape != lengths.shape:
        return "leads do not match the rows"
    if full and leads is not None and len(leads):
        back = np.arange(len(leads)) - leads
        if leads.min() < 0 or back.min() < 0 or np.any(leads[back] != 0):
            return "a lead is out of range"
    return None
