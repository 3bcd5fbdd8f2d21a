"""Evaluation: loaders on synthetic files with each format's quirks, metrics against hand-computed
values, the vector cache, and the runner's JSON shape with a tiny model."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from flowsearch.calibration import make_calibrator
from flowsearch.encode.encoder import Encoder
from flowsearch.errors import FlowsearchError
from flowsearch.evaluation import (
    STS_TASKS,
    PairSet,
    VectorCache,
    auc100,
    cosine_pairs,
    load_qnli,
    load_sick,
    load_snli_sentences,
    load_sts_year,
    load_stsb,
    resolve_data_dir,
    run_qnli,
    run_sts,
    spearman100,
    sts_correlations,
)
from flowsearch.evaluation.datasets import STS_YEARS, unique_texts

WORDS = [
    "a", "the", "man", "woman", "dog", "cat", "is", "are", "playing", "running", "eating",
    "reading", "guitar", "ball", "book", "food", "on", "in", "with", "park", "street", "house",
    "red", "blue", "big", "small", "two", "three", "quickly", "slowly",
]  # fmt: skip

# -- synthetic data folder --------------------------------------------------------------------


def _sentence(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(3, 9))))


def _write(path: Path, lines: list[str], newline: str = "\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes("".join(line + newline for line in lines).encode("utf-8"))


def make_data_dir(root: Path, seed: int = 0, pairs: int = 24) -> Path:
    """A miniature ../shared/data: every file the loaders read, with the real files' quirks."""
    rng = np.random.default_rng(seed)

    def pair_rows(n: int) -> list[tuple[str, str, float]]:
        return [
            (_sentence(rng), _sentence(rng), round(float(rng.uniform(0, 5)), 2)) for _ in range(n)
        ]

    for variant in ("", "senteval/"):
        for split in ("train", "dev", "test"):
            lines = []
            for i, (a, b, s) in enumerate(pair_rows(pairs)):
                row = ["main-captions", "MSRvid", "2012test", f"{i:04d}", f"{s:.3f}", a, b]
                if i % 3 == 0:  # some rows carry two extra source columns
                    row += ["src-a", "src-b"]
                lines.append("\t".join(row))
            _write(root / "stsb" / f"{variant}sts-{split}.csv", lines)
        for split, fname in (
            ("train", "SICK_train.txt"),
            ("trial", "SICK_trial.txt"),
            ("test", "SICK_test_annotated.txt"),
        ):
            lines = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"]
            for i, (a, b, s) in enumerate(pair_rows(pairs)):
                lines.append(f"{i}\t{a}\t{b}\t{1 + s * 0.8:.1f}\tNEUTRAL")
            _write(root / "sick" / f"{variant}{fname}", lines, "\r\n" if split == "test" else "\n")
    for year, subsets in STS_YEARS.items():
        for folder, ncols in ((root / f"sts{year}", 2), (root / "sts_raw" / f"sts{year}", 4)):
            if year != 16:
                ncols = 2
            for subset in subsets:
                gold, inputs = [], []
                for i, (a, b, s) in enumerate(pair_rows(12)):
                    gold.append("" if i % 4 == 3 else f"{s:.2f}")  # unscored pairs
                    inputs.append("\t".join([a, b, "source one", "source two"][:ncols]))
                _write(folder / f"STS.gs.{subset}.txt", gold)
                _write(folder / f"STS.input.{subset}.txt", inputs)
    qnli = ["index\tquestion\tsentence\tlabel"]
    for i in range(pairs * 2):
        label = "entailment" if i % 2 else "not_entailment"
        # An unbalanced quote: csv's default quoting would swallow the following rows.
        qnli.append(f'{i}\twhat is "{_sentence(rng)}?\t{_sentence(rng)}\t{label}')
    _write(root / "qnli" / "dev.tsv", qnli)
    for split in ("dev", "test"):
        premises = [_sentence(rng) for _ in range(pairs)]
        _write(root / "snli" / f"s1.{split}", [p + " " for p in premises for _ in range(3)])
        _write(root / "snli" / f"s2.{split}", [_sentence(rng) for _ in range(pairs * 3)])
        _write(root / "snli" / f"labels.{split}", ["neutral"] * pairs * 3)
    return root


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_data_dir(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def tiny_bert(tiny_model_dir: Path) -> Path:
    """The shared tiny random BERT (hidden 32) from conftest."""
    return tiny_model_dir


# -- loaders ----------------------------------------------------------------------------------


def test_stsb_takes_score_and_sentences_from_seven_or_nine_columns(tmp_path: Path) -> None:
    rows = [
        'g\tf\t2012\t0001\t2.500\tHe said "hi.\tShe said "bye".',
        "g\tf\t2012\t0002\t4.000\tA dog runs.\tA dog is running.\tsrc1\tsrc2",
        "",
    ]
    _write(tmp_path / "stsb" / "sts-test.csv", rows)
    pairs = load_stsb(tmp_path, "test")
    assert len(pairs) == 2
    assert pairs.s1 == ['He said "hi.', "A dog runs."]
    assert pairs.s2 == ['She said "bye".', "A dog is running."]
    np.testing.assert_array_equal(pairs.scores, [2.5, 4.0])
    assert pairs.sentences() == [
        'He said "hi.',
        "A dog runs.",
        'She said "bye".',
        "A dog is running.",
    ]


def test_sick_skips_header_and_strips_crlf(tmp_path: Path) -> None:
    rows = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"]
    rows += ["6\tA boy plays\tKids play\t3.3\tNEUTRAL", "7\tA man\tThe man\t4.7\tENTAILMENT"]
    _write(tmp_path / "sick" / "SICK_test_annotated.txt", rows, "\r\n")
    pairs = load_sick(tmp_path, "test")
    assert pairs.s2 == ["Kids play", "The man"]
    np.testing.assert_array_equal(pairs.scores, [3.3, 4.7])
    assert not any("\r" in s for s in pairs.s1 + pairs.s2)


def test_sts_year_skips_unscored_pairs_and_extra_columns(data_dir: Path) -> None:
    for variant in ("senteval", "raw"):
        pairs = load_sts_year(data_dir, 16, variant)
        # 5 subsets x 12 pairs, every 4th unscored
        assert len(pairs) == 5 * 9
        assert pairs.subsets[:9] == ["answer-answer"] * 9
        assert not any("source" in s for s in pairs.s2)
    year13 = load_sts_year(data_dir, 13)
    assert sorted(set(year13.subsets)) == ["FNWN", "OnWN", "headlines"]


def test_sts_year_gold_and_input_out_of_step(tmp_path: Path) -> None:
    make_data_dir(tmp_path)
    _write(tmp_path / "sts12" / "STS.gs.MSRpar.txt", ["1.0"])
    with pytest.raises(FlowsearchError, match="out of step"):
        load_sts_year(tmp_path, 12, "senteval")


def test_qnli_keeps_rows_with_stray_quotes(data_dir: Path) -> None:
    pairs = load_qnli(data_dir)
    assert len(pairs) == 48
    assert pairs.s1[0].startswith('what is "')
    assert pairs.scores.tolist()[:4] == [0.0, 1.0, 0.0, 1.0]


def test_snli_sentences_are_distinct_and_stripped(data_dir: Path) -> None:
    texts = load_snli_sentences(data_dir)
    assert len(texts) == len(set(texts))
    assert all(t == t.strip() and t for t in texts)


def test_missing_file_and_folder_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FlowsearchError, match=r"sts-test\.csv"):
        load_stsb(tmp_path, "test")
    with pytest.raises(FlowsearchError, match="does not exist"):
        resolve_data_dir(tmp_path / "nowhere")
    monkeypatch.delenv("FLOWSEARCH_DATA", raising=False)
    with pytest.raises(FlowsearchError, match="FLOWSEARCH_DATA"):
        resolve_data_dir(None)
    monkeypatch.setenv("FLOWSEARCH_DATA", str(tmp_path))
    assert resolve_data_dir(None) == tmp_path


def test_too_few_columns_is_a_clear_error(tmp_path: Path) -> None:
    _write(tmp_path / "stsb" / "sts-dev.csv", ["g,f,2012,1,2.5,a,b"])  # commas, not tabs
    with pytest.raises(FlowsearchError, match="columns"):
        load_stsb(tmp_path, "dev")


# -- metrics ----------------------------------------------------------------------------------


def test_spearman_matches_hand_computation() -> None:
    # ranks differ by one swap: rho = 1 - 6 * 2 / (4 * 15) = 0.8
    assert spearman100(np.array([1.0, 2, 3, 4]), np.array([1.0, 3, 2, 4])) == pytest.approx(80.0)
    assert spearman100(np.array([3.0, 2, 1]), np.array([1.0, 2, 3])) == pytest.approx(-100.0)


def test_sts_all_and_wmean() -> None:
    pred = np.array([1.0, 2, 3, 4, 1, 2, 3])
    gold = np.array([1.0, 3, 2, 4, 3, 2, 1])
    subsets = ["a"] * 4 + ["b"] * 3
    out = sts_correlations(pred, gold, subsets)
    # subset a: 80, subset b: -100 -> weighted (4 * 80 + 3 * -100) / 7
    assert out["wmean"] == pytest.approx((4 * 80.0 - 300.0) / 7)
    assert out["spearman"] == pytest.approx(spearman100(pred, gold))
    single = sts_correlations(pred, gold)
    assert single["spearman"] == single["wmean"]


def test_auc_matches_hand_computation() -> None:
    # positive/negative pairs: (0.35 > 0.1), (0.35 < 0.4), (0.8 > both) -> 3 of 4
    assert auc100(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == pytest.approx(75.0)
    # a tie counts one half
    assert auc100(np.array([0.5, 0.5]), np.array([1, 0])) == pytest.approx(50.0)
    with pytest.raises(ValueError):
        auc100(np.array([0.1, 0.2]), np.array([1, 1]))


def test_cosine_pairs() -> None:
    a = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    b = np.array([[0.0, 2.0], [2.0, 2.0], [1.0, 0.0]])
    np.testing.assert_allclose(cosine_pairs(a, b), [0.0, 1.0, 0.0])


# -- cache ------------------------------------------------------------------------------------


class CountingEncoder:
    """A fake encoder: deterministic vectors from text hashes, counting its calls."""

    def __init__(self, dim: int = 8, pooling: str = "mean") -> None:
        self.calls = 0
        self.dim = dim
        self.pooling = pooling

    def describe(self) -> dict[str, object]:
        return {"model": "fake/model", "revision": "r1", "pooling": self.pooling,
                "max_length": 16, "dim": self.dim}  # fmt: skip

    def encode(self, texts, batch_size: int = 64, progress: bool | None = None) -> np.ndarray:
        self.calls += 1
        rows = [
            np.random.default_rng(abs(hash(t)) % 2**32).standard_normal(self.dim) for t in texts
        ]
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dim)


def test_cache_hit_avoids_reencoding(tmp_path: Path) -> None:
    cache = VectorCache(tmp_path)
    enc = CountingEncoder()
    first = cache.encode(enc, ["a b", "c d"], "toy")
    second = cache.encode(enc, ["a b", "c d"], "toy")
    assert enc.calls == 1 and (cache.hits, cache.misses) == (1, 1)
    np.testing.assert_array_equal(first, second)
    assert second.dtype == np.float32
    # other texts, other pooling: new keys
    cache.encode(enc, ["a b", "x"], "toy")
    cache.encode(CountingEncoder(pooling="cls"), ["a b", "c d"], "toy")
    assert cache.misses == 3
    files = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert len(files) == 3 and all(f.endswith(".npy") for f in files)  # no temp files left


def test_cache_rewrites_a_corrupt_file(tmp_path: Path) -> None:
    cache = VectorCache(tmp_path)
    enc = CountingEncoder()
    cache.encode(enc, ["a", "b"], "toy")
    path = cache.path_for(enc.describe(), "toy", ["a", "b"])
    path.write_bytes(b"not a numpy file")
    out = cache.encode(enc, ["a", "b"], "toy")
    assert enc.calls == 2 and out.shape == (2, 8)
    assert np.load(path).shape == (2, 8)


def test_cache_dir_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWSEARCH_CACHE", str(tmp_path))
    assert VectorCache().root == tmp_path


# -- runner: hand-computed cases ------------------------------------------------------------


class TableEncoder:
    """A fake encoder that looks every text up in a table (an unknown text is a KeyError)."""

    def __init__(self, table: dict[str, list[float]]) -> None:
        self.table = table

    def describe(self) -> dict[str, object]:
        return {"model": "table", "revision": "r", "pooling": "mean", "max_length": 8, "dim": 2}

    def encode(self, texts, batch_size: int = 64, progress: bool | None = None) -> np.ndarray:
        return np.array([self.table[t] for t in texts], dtype=np.float32)


def _angle(degrees: float) -> list[float]:
    return [math.cos(math.radians(degrees)), math.sin(math.radians(degrees))]


def _hand_pairs(tag: str, angles: list[float], table: dict[str, list[float]]) -> list[str]:
    """Pairs whose cosines are cos(angle): s1 along x, s2 at the angle; their lines' texts."""
    s1 = [f"{tag} first {i}" for i in range(len(angles))]
    s2 = [f"{tag} second {i}" for i in range(len(angles))]
    for a, b, deg in zip(s1, s2, angles, strict=True):
        table[a], table[b] = [1.0, 0.0], _angle(deg)
    return [f"{a}\t{b}" for a, b in zip(s1, s2, strict=True)]


def hand_data_dir(root: Path) -> tuple[Path, TableEncoder]:
    """STS-B, STS13 and QNLI files whose cosines and gold scores give known correlations."""
    table: dict[str, list[float]] = {}
    # STS-B: cosines 1, .87, .5, 0 against gold 4, 5, 2, 1: one swap, rho = 1 - 6*2/(4*15) = 0.8
    rows = _hand_pairs("stsb", [0, 30, 60, 90], table)
    lines = [f"g\tf\t2012\t{i}\t{g}\t{r}" for i, (g, r) in enumerate(zip([4, 5, 2, 1], rows))]
    for split in ("train", "dev", "test"):
        _write(root / "stsb" / f"sts-{split}.csv", lines)
    # STS13 (raw text): FNWN rho 0.8 (as STS-B), headlines -1, OnWN +1
    subsets = {
        "FNWN": ([0, 30, 60, 90], ["4", "5", "2", "1"]),
        "headlines": ([0, 45, 80], ["1", "2", "3"]),
        "OnWN": ([10, 50, 70], ["5", "3", "2"]),
    }
    for name, (angles, gold) in subsets.items():
        folder = root / "sts_raw" / "sts13"
        _write(folder / f"STS.input.{name}.txt", _hand_pairs(name, angles, table))
        _write(folder / f"STS.gs.{name}.txt", gold)
    # QNLI: cosines .1, .4, .35, .8 for labels 0, 0, 1, 1: 3 of 4 positive-negative pairs
    # ordered right, AUC 75
    qnli = ["index\tquestion\tsentence\tlabel"]
    for i, (cos, label) in enumerate(
        zip([0.1, 0.4, 0.35, 0.8], ["not_entailment"] * 2 + ["entailment"] * 2)
    ):
        question, sentence = f"question {i}", f"sentence {i}"
        table[question], table[sentence] = [1.0, 0.0], [cos, math.sqrt(1 - cos**2)]
        qnli.append(f"{i}\t{question}\t{sentence}\t{label}")
    _write(root / "qnli" / "dev.tsv", qnli)
    return root, TableEncoder(table)


def test_run_sts_and_qnli_by_hand(tmp_path: Path) -> None:
    data, encoder = hand_data_dir(tmp_path / "data")
    out = run_sts(data_dir=data, tasks=["STSB", "STS13"], encoder=encoder, cache_dir=tmp_path)
    assert set(out) == {"model", "pooling", "calibration", "max_length", "results", "avg"}
    assert (out["model"], out["pooling"], out["calibration"]) == ("table", "mean", "none")
    assert out["results"]["STSB"] == {"spearman": pytest.approx(80.0)}
    sts13 = out["results"]["STS13"]
    # wmean: subsets weighted by size, (4 * 80 + 3 * -100 + 3 * 100) / 10
    assert sts13["wmean"] == pytest.approx(32.0)
    # all: one rho over the ten pairs pooled (scipy's, the reference)
    cos = [math.cos(math.radians(d)) for d in [0, 30, 60, 90, 0, 45, 80, 10, 50, 70]]
    gold = [4, 5, 2, 1, 1, 2, 3, 5, 3, 2]
    assert sts13["spearman"] == pytest.approx(100 * scipy.stats.spearmanr(cos, gold).statistic)
    assert out["avg"] == pytest.approx((80.0 + sts13["spearman"]) / 2)
    qnli = run_qnli(data_dir=data, encoder=encoder, cache_dir=tmp_path)
    assert qnli["results"] == {"QNLI": {"auc": pytest.approx(75.0)}}


# -- runner: the tiny model against an independent computation ------------------------------


def _vectors(encoder: Encoder, texts: list[str]) -> dict[str, np.ndarray]:
    """Each text's vector, encoded as the session encodes a set (one call, batches of 64)."""
    return dict(zip(texts, encoder.encode(texts, batch_size=64, progress=False), strict=True))


def _fit_texts(data: Path, task: str) -> list[str]:
    """The sentences a task's calibrators are fitted on: every split's, first seen first."""
    if task == "STSB":
        return unique_texts(
            [t for s in ("train", "dev", "test") for t in load_stsb(data, s).sentences()]
        )
    return load_sts_year(data, int(task[3:])).sentences()


def _expected(pairs: PairSet, vec: dict[str, np.ndarray], transform=None) -> dict[str, float]:
    """Spearman x 100 (pooled, and per-subset size-weighted) of cosine after ``transform``,
    computed with numpy and scipy apart from the package's code."""
    a = np.array([vec[t] for t in pairs.s1], dtype=np.float64)
    b = np.array([vec[t] for t in pairs.s2], dtype=np.float64)
    if transform is not None:
        a, b = transform(a), transform(b)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    rho = lambda m: 100 * scipy.stats.spearmanr(cos[m], pairs.scores[m]).statistic  # noqa: E731
    labels = np.array(pairs.subsets)
    wmean = sum(rho(labels == n) * (labels == n).sum() for n in set(pairs.subsets)) / len(labels)
    return {"spearman": rho(np.ones(len(cos), bool)), "wmean": wmean}


def test_run_sts_with_tiny_model_is_the_direct_computation(
    data_dir: Path, tiny_bert: Path, tmp_path: Path
) -> None:
    out = run_sts(str(tiny_bert), pooling="mean", data_dir=data_dir, cache_dir=tmp_path)
    assert set(out) == {"model", "pooling", "calibration", "max_length", "results", "avg"}
    assert list(out["results"]) == list(STS_TASKS)
    assert Path(out["model"]).resolve() == tiny_bert.resolve()
    assert (out["pooling"], out["calibration"], out["max_length"]) == ("mean", "none", 128)
    encoder = Encoder(str(tiny_bert), pooling="mean")
    for task, pairs in (
        ("STSB", load_stsb(data_dir, "test")),
        ("STS12", load_sts_year(data_dir, 12)),
    ):
        want = _expected(pairs, _vectors(encoder, _fit_texts(data_dir, task)))
        got = out["results"][task]
        assert got["spearman"] == pytest.approx(want["spearman"], abs=1e-6), task
        if task == "STS12":
            assert got["wmean"] == pytest.approx(want["wmean"], abs=1e-6)
    assert set(out["results"]["STSB"]) == {"spearman"}
    assert set(out["results"]["STS16"]) == {"spearman", "wmean"}
    expected_avg = sum(r["spearman"] for r in out["results"].values()) / len(STS_TASKS)
    assert out["avg"] == pytest.approx(expected_avg)


def _natsv_k(setting: str, vec: dict[str, np.ndarray], fit: np.ndarray, dev: PairSet) -> int:
    """The paper's choice of k: best STS-B dev Spearman over 1..20, each k fitted on its own."""
    scores = {}
    for k in range(1, min(20, fit.shape[1] - 1, len(fit) - 1) + 1):
        cal = make_calibrator(setting, k=k).fit(fit)
        scores[k] = _expected(dev, vec, cal.transform)["spearman"]
    return max(scores, key=lambda k: (scores[k], -k))


def _calibrator(setting: str, fit: np.ndarray, snli: np.ndarray | None, natsv_k: int):
    """The calibrator each setting names, fitted as session.py's docstring says."""
    if setting in ("flow", "whitening-flow"):
        return make_calibrator(setting, seed=0).fit(fit)
    if setting == "flow-nli":
        return make_calibrator("flow", seed=0).fit(snli)
    if setting == "whitening-k":
        return make_calibrator("whitening", k=16).fit(fit)  # half the tiny model's 32 dims
    if setting in ("natsv", "sn-natsv"):
        return make_calibrator(setting, k=natsv_k).fit(fit)
    return make_calibrator(setting).fit(fit)


@pytest.mark.parametrize(
    "calibration",
    ["sn", "natsv", "sn-natsv", "whitening", "whitening-k", "flow", "whitening-flow", "flow-nli"],
)
def test_run_sts_every_calibration(
    calibration: str, data_dir: Path, tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cache = tmp_path_factory.getbasetemp() / "shared-cache"
    out = run_sts(
        str(tiny_bert), pooling="cls", calibration=calibration, data_dir=data_dir,
        tasks=["STSB", "STS13"], cache_dir=cache,
    )  # fmt: skip
    assert out["calibration"] == calibration and list(out["results"]) == ["STS13", "STSB"]
    encoder = Encoder(str(tiny_bert), pooling="cls")  # the backend run_sts runs (auto)
    snli = None  # flow-nli's fit set: every SNLI sentence, as the session encodes it
    if calibration == "flow-nli":
        snli = encoder.encode(load_snli_sentences(data_dir), batch_size=64, progress=False)
    stsb_vec = _vectors(encoder, _fit_texts(data_dir, "STSB"))
    stsb_fit = np.array(list(stsb_vec.values()))
    k = (
        _natsv_k(calibration, stsb_vec, stsb_fit, load_stsb(data_dir, "dev"))
        if "natsv" in calibration
        else 0
    )
    for task, pairs in (
        ("STSB", load_stsb(data_dir, "test")),
        ("STS13", load_sts_year(data_dir, 13)),
    ):
        vec = _vectors(encoder, _fit_texts(data_dir, task))
        cal = _calibrator(calibration, np.array(list(vec.values())), snli, k)
        want = _expected(pairs, vec, cal.transform)
        got = out["results"][task]
        assert got["spearman"] == pytest.approx(want["spearman"], abs=1e-6), task
        if task == "STS13":
            assert got["wmean"] == pytest.approx(want["wmean"], abs=1e-6)


def test_run_sts_encodes_once_per_dataset(data_dir: Path, tmp_path: Path) -> None:
    from flowsearch.evaluation import EvalSession

    enc = CountingEncoder(dim=16)
    session = EvalSession(enc, data_dir, VectorCache(tmp_path))
    for calibration in ("none", "sn", "whitening", "natsv"):
        session.sts("SICKR", calibration)
    assert enc.calls == 2  # SICK-R, and STS-B for natsv's choice of k on its dev split
    again = EvalSession(enc, data_dir, VectorCache(tmp_path))
    again.sts("SICKR", "none")
    assert enc.calls == 2  # served from disk


def test_whitening_flow_setting_is_the_flow_behind_whitening(
    data_dir: Path, tmp_path: Path
) -> None:
    from flowsearch.evaluation import EvalSession

    config = {"levels": 2, "depth": 1, "width": 8}
    session = EvalSession(CountingEncoder(dim=8), data_dir, VectorCache(tmp_path), seed=3,
                          flow_config=config)  # fmt: skip
    flow = session.calibrator("flow", "SICKR")
    wflow = session.calibrator("whitening-flow", "SICKR")
    assert wflow is not flow and wflow.config["prewhiten"] and not flow.config["prewhiten"]
    for key, value in {**config, "seed": 3}.items():  # same flow settings as "flow"
        assert wflow.config[key] == flow.config[key] == value
    assert session.calibrator("whitening-flow", "SICKR") is wflow  # fitted once per session
    # fitted on the task's own sentences: whitened, the fit set is decorrelated
    U = session.fit_vectors("SICKR")
    assert wflow.fit_stats["rows"] == len(U)
    W = wflow.whitening._transform(U[:, wflow.active])
    np.testing.assert_allclose(np.cov(W, rowvar=False, bias=True), np.eye(W.shape[1]), atol=1e-6)
    # scored on the SICK test pairs, through that calibrator
    enc = session.encoder
    pairs = load_sick(data_dir, "test")
    a, b = wflow.transform(enc.encode(pairs.s1)), wflow.transform(enc.encode(pairs.s2))
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    want = 100 * scipy.stats.spearmanr(cos, pairs.scores).statistic
    assert session.sts("SICKR", "whitening-flow") == {"spearman": pytest.approx(want, abs=1e-6)}


def test_run_qnli_with_tiny_model_is_the_direct_computation(
    data_dir: Path, tiny_bert: Path, tmp_path: Path
) -> None:
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    out = run_qnli(str(tiny_bert), data_dir=data_dir, cache_dir=tmp_path, calibration="whitening")
    assert set(out) == {"model", "pooling", "calibration", "results"}
    pairs = load_qnli(data_dir)
    vec = _vectors(Encoder(str(tiny_bert), pooling="mean"), pairs.sentences())
    cal = make_calibrator("whitening").fit(np.array(list(vec.values())))
    a = cal.transform(np.array([vec[t] for t in pairs.s1]))
    b = cal.transform(np.array([vec[t] for t in pairs.s2]))
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    want = 100 * sklearn_metrics.roc_auc_score(pairs.scores, cos)
    assert out["results"] == {"QNLI": {"auc": pytest.approx(want, abs=1e-6)}}


def test_runner_errors_name_the_problem(data_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(FlowsearchError, match="unknown STS task"):
        run_sts(tasks=["STS99"], data_dir=data_dir)
    with pytest.raises(FlowsearchError, match="unknown calibration"):
        run_sts(calibration="magic", data_dir=data_dir, encoder=CountingEncoder())
    with pytest.raises(FlowsearchError, match=r"stsb.*sts-train\.csv"):
        run_sts(tasks=["STSB"], data_dir=tmp_path, encoder=CountingEncoder())


# -- against the real data and model (slow) ---------------------------------------------------

SHARED_DATA = Path(
    os.environ.get("FLOWSEARCH_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED_DATA / "stsb").is_dir(), reason="needs ../shared/data")
def test_minilm_mean_matches_mteb_stsb() -> None:
    """all-MiniLM-L6-v2, mean pooling, raw text, max_length 256: MTEB reports STS-B 82.03."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = run_sts(pooling="mean", calibration="none", data_dir=SHARED_DATA, tasks=["STSB"])
    assert out["max_length"] == 256
    assert out["results"]["STSB"]["spearman"] == pytest.approx(82.03, abs=0.5)


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED_DATA / "stsb").is_dir(), reason="needs ../shared/data")
def test_real_files_have_the_documented_sizes() -> None:
    assert len(load_stsb(SHARED_DATA, "test")) == 1379
    assert len(load_stsb(SHARED_DATA, "dev")) == 1500
    assert len(load_sick(SHARED_DATA, "test")) == 4927
    sizes = {y: len(load_sts_year(SHARED_DATA, y)) for y in STS_YEARS}
    assert sizes == {12: 3108, 13: 1500, 14: 3750, 15: 3000, 16: 1186}
    qnli = load_qnli(SHARED_DATA)
    assert len(qnli) == 5463 and int(qnli.scores.sum()) == 2702


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED_DATA / "stsb").is_dir(), reason="needs ../shared/data")
@pytest.mark.parametrize("quantize", [None, "int8"])
def test_onnx_backends_keep_stsb_within_half_a_point(tmp_path, quantize) -> None:
    """Issue 10's quality bound: every ONNX backend offered scores STS-B test within 0.5
    Spearman points of the torch path (bundled model, mean pooling; torch gives 82.03)."""
    pytest.importorskip("onnxruntime")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "cache"  # vectors of each backend encoded afresh
    torch_out = run_sts(data_dir=SHARED_DATA, tasks=["STSB"], cache_dir=cache)
    onnx_out = run_sts(
        data_dir=SHARED_DATA, tasks=["STSB"], cache_dir=cache, backend="onnx", quantize=quantize
    )
    gap = onnx_out["results"]["STSB"]["spearman"] - torch_out["results"]["STSB"]["spearman"]
    assert abs(gap) <= 0.5, gap
