"""The GPU benchmark's CPU parts, run with its CPU substitutes (no CUDA in the default suite)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("faiss")
pytest.importorskip("onnxruntime")

from benchmarks.gpu import bench_gpu  # noqa: E402


def _data(root: Path) -> Path:
    """The few files the text pool reads, with a handful of sentences each."""
    words = ["the", "cat", "dog", "sat", "ran", "river", "music", "city", "tea", "piano", "sea"]
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(words, size=6)) + f" {i}" for i in range(160)]
    (root / "qnli").mkdir(parents=True)
    (root / "snli").mkdir()
    (root / "stsb").mkdir()
    (root / "retrieval" / "toy").mkdir(parents=True)
    rows = [f"{i}\t{a}\t{b}\tentailment" for i, (a, b) in enumerate(zip(sentences, sentences[1:]))]
    for split in ("dev", "test"):
        (root / "qnli" / f"{split}.tsv").write_text("index\tq\ts\tl\n" + "\n".join(rows[:40]))
        for side in ("s1", "s2"):
            (root / "snli" / f"{side}.{split}").write_text("\n".join(sentences[40:80]))
    for name in ("sts-train.csv", "sts-dev.csv", "sts-test.csv"):
        pairs = zip(sentences[80:120], sentences[81:])
        lines = [f"g\tf\t2012\t{i}\t1.0\t{a}\t{b}" for i, (a, b) in enumerate(pairs)]
        (root / "stsb" / name).write_text("\n".join(lines))
    docs = [json.dumps({"_id": str(i), "text": s}) for i, s in enumerate(sentences[120:])]
    (root / "retrieval" / "toy" / "corpus.jsonl").write_text("\n".join(docs))
    return root


def test_the_cpu_only_run_measures_every_cpu_part_and_skips_cuda(tmp_path, tiny_model_dir, capsys):
    data = _data(tmp_path / "data")
    report = bench_gpu.main(
        ["--cpu-only", "--data", str(data), "--model", str(tiny_model_dir), "--queries", "20",
         "--cpu-sample", "40", "--batch", "16", "--out", str(tmp_path / "bench_gpu")]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert report["cuda"] is False
    assert "GPU Flat: skipped (no CUDA: --cpu-only)" in out
    enc = report["encoding"]
    assert enc["rows"] == len(bench_gpu.text_pool(data)) - 20
    assert enc["agrees"] and enc["max_unit_difference"] < 1e-4  # torch and ONNX fp32 on the CPU
    assert "backend='onnx'" in enc["cpu_encoder"]
    ann = report["ann"]
    assert ann["gpu_flat"] is None and ann["cpu_flat"]["recall"] == 1.0
    for graph in ("cpu_hnsw", "cagra_hnsw"):
        recalls = [ann[graph]["search"][str(ef)]["recall"] for ef in bench_gpu.EF_SEARCH]
        assert 0.5 < recalls[-1] <= 1.0 and recalls[-1] >= recalls[0] - 0.05, recalls
    assert "substitute" in ann["cagra_hnsw"]["how"]
    # a CPU-only run never stands in for the recorded GPU report
    assert not (tmp_path / "bench_gpu.json").exists()


def test_without_cuda_a_full_run_says_so_in_one_line(monkeypatch):
    monkeypatch.setattr(bench_gpu, "cuda_ready", lambda: (False, "torch sees no CUDA device"))
    with pytest.raises(SystemExit, match="no CUDA here .*pass --cpu-only"):
        bench_gpu.main([])


def test_recall_and_the_gpu_extra():
    truth = np.arange(20).reshape(2, 10)
    found = truth.copy()
    found[0, :5] = -1
    assert bench_gpu.recall_at_k(found, truth) == pytest.approx(0.75)
    assert any(req.startswith("faiss-gpu") for req in bench_gpu.gpu_extra())
