"""Published figures our benchmark numbers are compared with, with where they come from.

Column keys follow our result JSON: STS12 .. STS16, STSB, SICKR (Spearman x 100). STS12-16 in
both papers below are SentEval's ``wmean`` aggregation, on SentEval's tokenised text, BERT-base
uncased, max_length 64 (Li et al.) and the papers' own pooling names.
"""

from __future__ import annotations

__all__ = [
    "LI2020_TABLE2",
    "LI2020_TABLE4",
    "LI2020_TABLE5",
    "LI2020_TABLE6",
    "MTEB_MINILM",
    "SOURCES",
    "SU2021",
]

SOURCES = {
    "li2020": "Li et al. 2020, *On the Sentence Embeddings from Pre-trained Language Models*, "
    "EMNLP (BERT-flow)",
    "su2021": "Su et al. 2021, *Whitening Sentence Representations for Better Semantics and "
    "Faster Retrieval*, arXiv:2103.15316 - figures as reproduced in PyTorch by co-author W. Liu "
    "(github.com/autoliuweijie/BERT-whitening-pytorch, README)",
    "mteb": "MTEB leaderboard, sentence-transformers/all-MiniLM-L6-v2 (raw text, "
    "max_seq_length 256, pooled Spearman of cosine)",
}

_COLS = ("STSB", "SICKR", "STS12", "STS13", "STS14", "STS15", "STS16")


def _row(*values: float) -> dict[str, float]:
    return dict(zip(_COLS, values, strict=True))


#: Li et al. 2020, Table 2 (no NLI supervision), BERT-base rows. Their "last2avg" is, in their
#: code, the average of the first and last layers: our ``first_last_avg``.
LI2020_TABLE2: dict[str, dict[str, float]] = {
    "BERT-base CLS (Reimers & Gurevych 2019)": _row(
        16.50, 42.63, 20.16, 30.01, 20.09, 36.88, 38.03
    ),
    "BERT-base avg (Reimers & Gurevych 2019)": _row(
        46.35, 58.40, 38.78, 57.98, 57.98, 63.15, 61.06
    ),
    "BERT-base (last layer mean)": _row(47.29, 58.21, 49.07, 55.92, 54.75, 62.75, 65.19),
    "BERT-base-last2avg (= first_last_avg)": _row(59.04, 63.75, 57.84, 61.95, 62.48, 70.95, 69.81),
    "BERT-base-flow (NLI)": _row(58.56, 65.44, 59.54, 64.69, 64.66, 72.92, 71.84),
    "BERT-base-flow (target)": _row(70.72, 63.11, 63.48, 72.14, 68.42, 73.77, 75.37),
}

#: Su et al. 2021 (BERT-whitening), BERT-base rows, from the co-author's PyTorch reproduction.
SU2021: dict[str, dict[str, float]] = {
    "BERT-base first_last_avg": _row(59.04, 63.75, 57.85, 61.96, 62.50, 70.96, 69.79),
    "BERT-base whitening-256 (target)": _row(71.43, 62.23, 63.90, 73.75, 69.09, 74.59, 74.42),
    "BERT-base whitening (NLI)": _row(63.65, 68.29, 61.69, 65.71, 66.05, 75.16, 73.20),
    "BERT-base whitening-256 (NLI)": _row(64.96, 67.57, 61.48, 66.72, 66.22, 74.83, 72.22),
}

#: Li et al. 2020, Table 4: QNLI dev AUC (BERT-base fine-tuned on NLI, "-NLI" models).
LI2020_TABLE4 = {
    "BERT-base-NLI-last2avg": 70.30,
    "BERT-base-NLI-flow (NLI)": 72.52,
    "BERT-base-NLI-flow (target)": 76.17,
}

#: Li et al. 2020, Table 5: STS-B test Spearman, BERT-base (last layer mean), k tuned on dev.
LI2020_TABLE5 = {
    "none": 47.29,
    "sn": 55.46,
    "natsv (k=1)": 51.79,
    "natsv (k=10)": 60.40,
    "sn-natsv (k=1)": 56.02,
    "sn-natsv (k=6)": 63.51,
    "flow (target)": 65.62,
}

#: Li et al. 2020, Table 6: Spearman between similarities on STS-B dev (edit distance, gold).
LI2020_TABLE6 = {
    "gold": {"edit": -24.61, "gold": 100.0},
    "BERT-induced": {"edit": -50.49, "gold": 59.30},
    "flow-induced": {"edit": -28.01, "gold": 74.09},
}

#: MTEB figures for all-MiniLM-L6-v2 that our ``none`` / ``mean`` row must match within 0.5.
MTEB_MINILM = {"STSB": 82.03, "SICKR": (77.2, 77.6)}
