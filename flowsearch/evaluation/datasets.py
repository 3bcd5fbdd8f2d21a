r"""Loaders for the STS, SICK-R, QNLI and SNLI files laid out as in ``../shared/data``.

Every loader reads with plain ``str.split("\t")``: the STS-B and QNLI files carry quotes inside
their text and have no CSV quoting, so Python's ``csv`` module silently merges or drops rows.
Line ends are stripped of both ``\n`` and ``\r`` (the SICK test file is CRLF), trailing extra
columns are ignored (some STS-B rows have 9 columns, STS16 raw inputs have 4), and STS12-16 pairs
whose gold line is empty are unscored and skipped, as SentEval does.

Two text variants exist for the STS sets: ``"raw"`` (the original sentences, what MTEB and a user's
own data look like) and ``"senteval"`` (Moses-tokenised and, except SICK, lowercased: what the
BERT-flow and BERT-whitening papers evaluated).

Example:
    >>> pairs = load_stsb("../shared/data", split="test")  # doctest: +SKIP
    >>> len(pairs), pairs.scores.max()  # doctest: +SKIP
    (1379, 5.0)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from flowsearch.errors import BadInput, NotFound

__all__ = [
    "STS_YEARS",
    "PairSet",
    "TextVariant",
    "load_qnli",
    "load_sick",
    "load_snli_sentences",
    "load_sts_year",
    "load_stsb",
    "resolve_data_dir",
    "unique_texts",
]

LOG = logging.getLogger(__name__)

TextVariant = Literal["raw", "senteval"]

#: SentEval's subset names for each STS year (STS13 has no SMT subset: it is LDC-licensed).
STS_YEARS: dict[int, tuple[str, ...]] = {
    12: ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    13: ("FNWN", "headlines", "OnWN"),
    14: ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    15: ("answers-forums", "answers-students", "belief", "headlines", "images"),
    16: ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}


@dataclass(frozen=True)
class PairSet:
    r"""Sentence pairs with a gold score each.

    Attributes:
        name: dataset name, e.g. ``"STSB-test"``.
        s1: first sentences, length n.
        s2: second sentences, length n.
        scores: gold scores, float64 of shape (n,); for QNLI 1.0 = entailment, 0.0 = not.
        subsets: subset name of every pair (STS12-16), length n; a single name elsewhere.
    """

    name: str
    s1: list[str]
    s2: list[str]
    scores: np.ndarray
    subsets: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.s1)

    def sentences(self) -> list[str]:
        """Every distinct sentence of the pairs, in first-seen order."""
        return unique_texts(self.s1 + self.s2)


def unique_texts(texts: list[str]) -> list[str]:
    """Distinct texts in first-seen order (encoding duplicates would only cost time)."""
    return list(dict.fromkeys(texts))


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """The evaluation data folder: ``data_dir``, else ``$FLOWSEARCH_DATA``.

    Raises:
        NotFound: when neither is given or the folder does not exist.
    """
    if data_dir is None:
        env = os.environ.get("FLOWSEARCH_DATA")
        if not env:
            raise NotFound(
                "no evaluation data folder given: pass --data DIR or set FLOWSEARCH_DATA "
                "(the folder holding stsb/, sick/, sts12/ ... qnli/, snli/)"
            )
        data_dir = env
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise NotFound(
            f"evaluation data folder {path} does not exist: pass --data DIR or set FLOWSEARCH_DATA"
        )
    return path


def _read_lines(path: Path) -> list[str]:
    """Lines of a UTF-8 file without their ``\n`` / ``\r\n`` ends; a missing file is named."""
    if not path.is_file():
        raise NotFound(
            f"evaluation file {path} is missing: check --data / FLOWSEARCH_DATA points at the "
            "folder described in shared/data/README.md"
        )
    # newline="" keeps "\r" so that we strip exactly the line end and nothing inside the text.
    with path.open(encoding="utf-8", newline="") as handle:
        return [line.rstrip("\r\n") for line in handle]


def _columns(line: str, needed: int, path: Path, lineno: int) -> list[str]:
    cols = line.split("\t")
    if len(cols) < needed:
        raise BadInput(
            f"{path}:{lineno} has {len(cols)} tab-separated columns, expected at least {needed}: "
            "the file is not in the format shared/data/README.md describes"
        )
    return cols


def load_stsb(
    data_dir: str | Path | None = None, split: str = "test", variant: TextVariant = "raw"
) -> PairSet:
    """STS Benchmark pairs of one split (``train``, ``dev``, ``test``), gold scores 0-5.

    Args:
        data_dir: evaluation data folder (see :func:`resolve_data_dir`).
        split: ``"train"``, ``"dev"`` or ``"test"``.
        variant: ``"raw"`` (``stsb/``) or ``"senteval"`` (``stsb/senteval/``).
    """
    root = resolve_data_dir(data_dir) / "stsb"
    if variant == "senteval":
        root = root / "senteval"
    path = root / f"sts-{split}.csv"
    s1: list[str] = []
    s2: list[str] = []
    scores: list[float] = []
    for lineno, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        # genre, file, year, id, score, s1, s2 [, source1, source2]
        cols = _columns(line, 7, path, lineno)
        scores.append(float(cols[4]))
        s1.append(cols[5])
        s2.append(cols[6])
    name = f"STSB-{split}"
    return PairSet(name, s1, s2, np.asarray(scores, dtype=np.float64), [name] * len(s1))


def load_sick(
    data_dir: str | Path | None = None, split: str = "test", variant: TextVariant = "raw"
) -> PairSet:
    """SICK relatedness pairs of one split (``train``, ``trial``, ``test``), gold scores 1-5.

    The files have a header row; the test file has CRLF line ends.
    """
    root = resolve_data_dir(data_dir) / "sick"
    if variant == "senteval":
        root = root / "senteval"
    fname = {
        "train": "SICK_train.txt",
        "trial": "SICK_trial.txt",
        "test": "SICK_test_annotated.txt",
    }
    if split not in fname:
        raise BadInput(f"unknown SICK split {split!r}: use one of {sorted(fname)}")
    # pair_ID, sentence_A, sentence_B, relatedness_score, entailment_judgment
    return _headed_pairs(root / fname[split], f"SICKR-{split}", float)


def load_sts_year(
    data_dir: str | Path | None = None, year: int = 12, variant: TextVariant = "raw"
) -> PairSet:
    """All scored pairs of STS20``year`` (12-16), every subset, with each pair's subset name.

    ``"senteval"`` reads ``stsYY/`` (tokenised, lowercased), ``"raw"`` reads ``sts_raw/stsYY/``.
    A pair whose gold line is empty is unscored and skipped.
    """
    if year not in STS_YEARS:
        raise BadInput(f"unknown STS year {year}: use one of {sorted(STS_YEARS)}")
    base = resolve_data_dir(data_dir)
    root = base / f"sts{year}" if variant == "senteval" else base / "sts_raw" / f"sts{year}"
    s1: list[str] = []
    s2: list[str] = []
    scores: list[float] = []
    subsets: list[str] = []
    for subset in STS_YEARS[year]:
        gold_path = root / f"STS.gs.{subset}.txt"
        input_path = root / f"STS.input.{subset}.txt"
        gold = _read_lines(gold_path)
        inputs = _read_lines(input_path)
        if len(gold) != len(inputs):
            raise BadInput(
                f"{gold_path} has {len(gold)} lines but {input_path} has {len(inputs)}: "
                "the STS files are out of step"
            )
        for lineno, (score, line) in enumerate(zip(gold, inputs, strict=True), start=1):
            if not score.strip():
                continue
            cols = _columns(line, 2, input_path, lineno)
            s1.append(cols[0])
            s2.append(cols[1])
            scores.append(float(score))
            subsets.append(subset)
    return PairSet(f"STS{year}", s1, s2, np.asarray(scores, dtype=np.float64), subsets)


def load_qnli(data_dir: str | Path | None = None, split: str = "dev") -> PairSet:
    """GLUE QNLI (question, sentence) pairs; ``scores`` is 1.0 for entailment, else 0.0.

    Only ``dev`` is labelled. Parsed by splitting on tabs: the csv module drops ~65 rows.
    """
    # index, question, sentence, label
    path = resolve_data_dir(data_dir) / "qnli" / f"{split}.tsv"
    return _headed_pairs(path, f"QNLI-{split}", lambda v: 1.0 if v.strip() == "entailment" else 0.0)


def _headed_pairs(path: Path, name: str, score: Callable[[str], float]) -> PairSet:
    """Pairs from a tab-separated file with a header row: texts in columns 1 and 2, the gold
    value in column 3 (read by ``score``); blank lines skipped."""
    s1: list[str] = []
    s2: list[str] = []
    gold: list[float] = []
    for lineno, line in enumerate(_read_lines(path)[1:], start=2):
        if not line.strip():
            continue
        cols = _columns(line, 4, path, lineno)
        s1.append(cols[1])
        s2.append(cols[2])
        gold.append(score(cols[3]))
    return PairSet(name, s1, s2, np.asarray(gold, dtype=np.float64), [name] * len(s1))


def load_snli_sentences(
    data_dir: str | Path | None = None, splits: tuple[str, ...] = ("dev", "test")
) -> list[str]:
    """Distinct SNLI sentences (premises and hypotheses) of ``splits``, labels unused.

    This is the text the "flow (NLI)" setting fits on; the train split is not shipped.
    """
    root = resolve_data_dir(data_dir) / "snli"
    texts: list[str] = []
    for split in splits:
        for side in ("s1", "s2"):
            texts.extend(line.strip() for line in _read_lines(root / f"{side}.{split}"))
    return unique_texts([t for t in texts if t])
