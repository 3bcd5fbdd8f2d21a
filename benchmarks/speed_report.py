r"""Markdown for ``bench_speed.py``'s results: every figure with what it is, its target and met /
not met. The reading of the figures (``bench_speed_notes.md``, written by hand after a run) is
appended as is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["write_report"]

HERE = Path(__file__).resolve().parent
GB = 1e9
MB = 2**20


def _met(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def _first_at(points: list[dict[str, Any]], target: float = 0.95) -> dict[str, Any] | None:
    return next((p for p in points if p["recall"] >= target), None)


def _ingest(r: dict[str, Any]) -> list[str]:
    lines = [
        "| ingest (child process `flowsearch index`) | rows | wall s | rows/s | peak RSS | CPU s | "
        "stages (s) | chose |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for name, i in r.items():
        if name.startswith("_"):
            continue
        stages = ", ".join(f"{k} {v:.1f}" for k, v in i["seconds"].items() if k != "total")
        lines.append(
            f"| {name} | {i['rows']:,} | {i['wall_s']:.1f} | {i['rows'] / i['wall_s']:,.0f} | "
            f"{i['peak_rss_bytes'] / GB:.2f} GB | {i['cpu_s']:.0f} | {stages} | "
            f"{i['calibration']} / {i['space']}, {i['factory']} |"
        )
    return lines


def write_report(res: dict[str, Any]) -> str:
    ing, fit, qry, ann = res["ingest"], res["fit"], res["query"], res["ann"]
    c = res["corpus"]
    out = ["## Figures at 200k rows (`benchmarks/bench_speed.py`)", ""]
    out.append(
        f"x86_64, {res['machine']['cpus']} cores shared with other jobs (load average "
        f"{res['ingest']['_load'][0]:.1f} after ingest, {res['ann']['_load'][0]:.1f} after the "
        "ANN stage); 2 torch and 2 FAISS threads. Corpus: "
        f"{c['real_sentences']:,} distinct real sentences of `../shared/data` (STS-B, SICK, "
        "STS12-16, SNLI dev/test, QNLI dev and test answer sentences; QNLI's passages are single "
        f"sentences, so nothing to split) plus {c['splices']:,} splices (first half of one real "
        "sentence + second half of another, seeded, distinct) to reach 200,000 rows. Queries, "
        f"never in the corpus: {c['qnli_questions']:,} QNLI test questions and "
        f"{c['held_out_sentences']:,} real sentences held out of the corpus."
    )
    out += ["", "### Memory and ingest", ""] + _ingest(ing)
    s2 = ing["static_200k"]
    out += [
        "",
        f"- Peak RSS ingesting 200k rows with `--pooling static` (everything else default, BM25 "
        f"included): **{s2['peak_rss_bytes'] / GB:.2f} GB**; target < 3 GB: "
        f"{_met(s2['peak_rss_bytes'] < 3 * GB)}.",
        f"- Static ingest rate: **{s2['rows'] / s2['wall_s']:,.0f} rows/s** end to end "
        f"(encoding alone {s2['rows'] / s2['seconds']['encode']:,.0f} rows/s); no target.",
    ]
    enc = fit["mean_encode_200k_s_extrapolated"]
    out += ["", "### Calibrator fit on 200k x 384 vs encoding those rows with `mean`", ""]
    out += [
        "| calibrator | fit wall s (one run) | / `mean` encoding, wall | fit CPU s | "
        "/ `mean` encoding, CPU | target <= 10% |",
        "|---|---:|---:|---:|---:|---|",
    ]
    enc_cpu = fit["mean_encode_200k_cpu_s_extrapolated"]
    for name in ("whitening-flow", "flow", "whitening"):
        t, tc = fit[f"fit_s_{name}"], fit[f"fit_cpu_s_{name}"]
        note = " (what `auto` fits)" if name == fit["auto_chose"] else ""
        ok = max(t / enc, tc / enc_cpu) <= 0.10
        out.append(
            f"| {name}{note} | {t:.1f} | {t / enc:.1%} | {tc:.1f} | {tc / enc_cpu:.1%} | "
            f"{_met(ok)} |"
        )
    out += [
        "",
        f"Encoding with `mean`: a seeded 2,000-row sample of the corpus took "
        f"{fit['mean_encode_2k_s']:.1f} s wall, {fit['mean_encode_2k_cpu_s']:.1f} s CPU "
        f"({2000 / fit['mean_encode_2k_s']:.0f} rows/s); extrapolated linearly to 200k rows: "
        f"{enc:.0f} s wall, {enc_cpu:.0f} s CPU (not measured at 200k). Both ratios are given "
        "because the machine is shared: CPU seconds are the steadier measure.",
    ]
    out += ["", '### One query through `Searcher.search(q, k=10, mode="dense")`', ""]
    out += [
        f"p50 ms over {qry['latency_queries']} queries x {qry['rounds']} rounds, one at a time, "
        "after a warm-up; "
        "each step timed on the same query in the same iteration (pieces called directly). "
        f"Recall@10 of the index as `auto` built it against exact search, {qry['all_queries']:,} "
        "real queries (questions / sentences). Batch: 64 queries per call.",
        "",
        "| index | FAISS (auto) | search p50 | encoder p50 | ratio (target <= 1.2) | calibrator | "
        "density | FAISS | join | recall@10 (q / s) | target >= 0.95 | batch QPS |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name in ("static_20k", "static_200k", "mean_20k"):
        r = qry[name]
        lat = r["latency"]
        ratio = lat["search"]["p50"] / lat["encoder"]["p50"]
        params = f" {r['params']}" if r["params"] else ""
        out.append(
            f"| {name} ({r['space']}) | {r['factory']}{params} | {lat['search']['p50']:.2f} | "
            f"{lat['encoder']['p50']:.3f} | {ratio:.2f} {_met(ratio <= 1.2)} | "
            f"{lat['calibrator']['p50']:.3f} | {lat['density']['p50']:.3f} | "
            f"{lat['faiss']['p50']:.3f} | {lat['join']['p50']:.3f} | {r['recall']:.3f} "
            f"({r['recall_questions']:.3f} / {r['recall_sentences']:.3f}) | "
            f"{_met(r['recall'] >= 0.95)} | {r['batch_qps']:,.0f} |"
        )
    m = qry["mean_20k"]["latency"]
    out += [
        "",
        f"- Peer at 20k (`mean`; sentence-transformers `encode` + `IndexFlatIP` over the same "
        f"stored vectors + a dict row -> text): p50 **{m['peer']['p50']:.2f} ms** (p95 "
        f"{m['peer']['p95']:.2f}); flowsearch p50 **{m['search']['p50']:.2f} ms** (p95 "
        f"{m['search']['p95']:.2f}): ratio {m['search']['p50'] / m['peer']['p50']:.2f}; target "
        f"flowsearch <= peer: {_met(m['search']['p50'] <= m['peer']['p50'])}.",
    ]
    s200 = qry["static_200k"]["latency"]
    composed = (
        sum(s200[k]["p50"] for k in ("faiss", "join"))
        + m["encoder"]["p50"]
        + m["calibrator"]["p50"]
        + m["density"]["p50"]
    )
    out.append(
        f"- `mean` at 200k, composed (not measured end to end: no 200k `mean` index was built): "
        f"`mean` encoder {m['encoder']['p50']:.2f} + its calibrator/density "
        f"{m['calibrator']['p50'] + m['density']['p50']:.2f} + 200k FAISS "
        f"{s200['faiss']['p50']:.2f} + join {s200['join']['p50']:.2f} = {composed:.2f} ms, "
        f"{composed / m['encoder']['p50']:.2f}x the encoder (target <= 1.2: "
        f"{_met(composed / m['encoder']['p50'] <= 1.2)})."
    )
    out += _ann(ann)
    notes = HERE / "bench_speed_notes.md"
    if notes.exists():
        out += ["", notes.read_text().strip()]
    out += [
        "",
        "Regenerate with `PYTHONPATH=. nice python benchmarks/bench_speed.py --fresh` "
        "(about 30 CPU-minutes here); every number is in `benchmarks/bench_speed.json`.",
    ]
    return "\n".join(out) + "\n"


def _ann(ann: dict[str, Any]) -> list[str]:
    out = ["", "### Index types on the same vectors (static corpus)", ""]
    out.append(
        "Recall@10 against exact (`Flat`) search in the same space, on the real queries; QPS: all "
        "queries in one call (2 threads); p50: one query at a time. Build: seconds from the "
        "vectors (IVF: 10 k-means iterations on 64 (200k) or 32 (1M) rows per list, spherical). "
        "Memory: bytes of the serialized index. `@0.95`: the cheapest setting reaching "
        "recall@10 >= 0.95 (nprobe / efSearch); `ref`: recall at a fixed setting (IVF nprobe 32, "
        "HNSW efSearch 64, IVF-PQ nprobe 64) to compare spaces."
    )
    for size, by_space in ann["sizes"].items():
        if "_skipped" in by_space:
            out += ["", f"**{size}: not measured** ({by_space['_skipped']})."]
            continue
        extra = ""
        if size != str(ann["rows"]):
            extra = (
                f" ({by_space['_copies']} jittered copies of every real row, noise N(0, s^2 Cov), "
                f"s = {by_space['_jitter_scale']:.3f}: half the median distance to a row's 10th "
                "neighbour in the whitened metric; share of exact top-10 that are copies: "
                + ", ".join(
                    f"{sp} {r['top10_jittered_share']:.2f}"
                    for sp, r in by_space.items()
                    if not sp.startswith("_")
                )
                + ")"
            )
        out += [
            "",
            f"**{int(size):,} rows{extra}**",
            "",
            "| space | index | build s | MiB | @0.95: setting, QPS, p50 ms | ref recall | "
            "sweep (setting: recall) |",
            "|---|---|---:|---:|---|---:|---|",
        ]
        for space, r in by_space.items():
            if space.startswith("_"):
                continue
            if "_skipped" in r:
                out.append(f"| {space} | not measured ({r['_skipped']}) | | | | | |")
                continue
            for name, t in r["types"].items():
                pts = t["points"]
                at = _first_at(pts)
                at_s = (
                    f"{at['param']}, {at['qps']:,.0f}, {at.get('p50_ms', float('nan')):.2f}"
                    if at
                    else "not reached"
                )
                ref_param = 32 if name.endswith(",Flat") else 64
                ref = next((p["recall"] for p in pts if p["param"] == ref_param), pts[0]["recall"])
                sweep = " ".join(f"{p['param']}:{p['recall']:.3f}" for p in pts)
                out.append(
                    f"| {space} | {name} | {t['build_s']:.1f} | {t['bytes'] / MB:,.0f} | {at_s} | "
                    f"{ref:.3f} | {sweep} |"
                )
    out += [
        "",
        "### Candidates from raw vectors, re-scored exactly in the whitening-flow space",
        "",
    ]
    out += [
        "Recall@10 against exact whitening-flow search (the index's own space), by candidate "
        "depth; QPS of candidate search + re-scoring (2,000 queries in one call).",
        "",
        "| candidates from | "
        + " | ".join(
            f"depth {p['depth']}" for p in next(iter(ann["rescored_in_whitening_flow"].values()))
        )
        + " |",
        "|---|" + "---:|" * len(next(iter(ann["rescored_in_whitening_flow"].values()))),
    ]
    for name, pts in ann["rescored_in_whitening_flow"].items():
        cells = " | ".join(f"{p['recall']:.3f} ({p['qps']:,.0f}/s)" for p in pts)
        out.append(f"| {name} | {cells} |")
    out += ["", "### `auto`'s tuning queries vs real queries (IVF, 200k)", ""]
    for space, pr in ann["proxy"].items():
        out += [
            f"**{space}**: recall@10 by nprobe",
            "",
            "| queries | " + " | ".join(str(p) for p in pr["nprobe"]) + " |",
            "|---|" + "---:|" * len(pr["nprobe"]),
        ]
        for name, curve in pr["curves"].items():
            out.append(f"| {name} | " + " | ".join(f"{r:.3f}" for r in curve) + " |")
        out.append("")
    return out
