r"""The index-type half of ``bench_speed.py``'s report: exact scan by size, ANN per space,
re-scoring raw candidates, and where ``auto`` should switch; with the formatting helpers both
halves share. Every figure is read from the stage JSONs (see :mod:`speed_report`).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "GB",
    "MB",
    "TARGET_RATIO",
    "TARGET_RECALL",
    "ann_section",
    "auto_section",
    "first_at",
    "load_text",
    "measured",
    "met",
    "rescore_section",
    "scan_section",
]

GB = 1e9
MB = 2**20
TARGET_RATIO = 1.2  # search p50 / encoder p50
TARGET_RECALL = 0.95


def measured(results: dict[str, Any]) -> list[tuple[str, Any]]:
    """The entries of a stage's results, without its ``_``-prefixed bookkeeping keys."""
    return [(name, value) for name, value in results.items() if not name.startswith("_")]


def met(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def load_text(x: Any) -> str:
    """A load average (the 1-minute figure of a ``getloadavg`` triple, or of [before, after])."""
    if isinstance(x, (list, tuple)) and x and isinstance(x[0], (list, tuple)):
        return "-".join(f"{t[0]:.1f}" for t in x)
    return f"{x[0]:.1f}"


def first_at(points: list[dict[str, Any]], target: float = TARGET_RECALL) -> dict[str, Any] | None:
    return next((p for p in points if p["recall"] >= target), None)


def scan_section(scan: dict[str, Any], qry: dict[str, Any]) -> list[str]:
    out = ["", "### Exact scan cost by rows, and the tuning queries `auto` relies on", ""]
    sizes = list(scan["flat_p50_ms"])
    out += [
        f"`IndexFlatIP` single-query p50 (ms) over prefixes of the static 200k searched vectors "
        f"(200 real queries; load {load_text(scan['load_start'])}-{load_text(scan['load_end'])}):",
        "",
        "| rows | " + " | ".join(f"{int(n):,}" for n in sizes) + " |",
        "|---|" + "---:|" * len(sizes),
        "| Flat p50 ms | " + " | ".join(f"{scan['flat_p50_ms'][n]:.2f}" for n in sizes) + " |",
    ]
    for name in ("static_200k", "mean_200k"):
        r = scan.get(name)
        if not r:
            continue
        if "_skipped" in r:
            out += ["", f"{name}: {r['factory']}, {r['_skipped']}."]
            continue
        out += [
            "",
            f"**{name}** as ingest built it: `{r['factory']}` in the {r['calibrator']} / "
            f"{r['space']} space, `auto` chose `{r['params']}` (tuning-query noise "
            f"{r['auto_noise']}). recall@10 by {r['knob']}, real queries vs tuning queries; "
            "p50 of one real query:",
            "",
            "| queries | " + " | ".join(str(v) for v in r["values"]) + " |",
            "|---|" + "---:|" * len(r["values"]),
        ]
        for label, curve in r["curves"].items():
            out.append(f"| {label} | " + " | ".join(f"{x:.3f}" for x in curve) + " |")
        out.append("| p50 ms | " + " | ".join(f"{x:.2f}" for x in r["p50_ms"]) + " |")
        real = r["curves"]["real"]
        tune = r["curves"][f"tuning queries, noise {r['auto_noise']}"]
        gap = max(abs(a - b) for a, b in zip(real, tune, strict=True))
        v_real = next((v for v, x in zip(r["values"], real, strict=True) if x >= 0.95), None)
        v_tune = next((v for v, x in zip(r["values"], tune, strict=True) if x >= 0.95), None)
        out.append(
            f"\nLargest gap between real and tuning-query recall: {gap:.3f}. Smallest "
            f"{r['knob']} reaching 0.95: real queries {v_real}, tuning queries {v_tune}."
        )
    return out


def ann_section(ann: dict[str, Any]) -> list[str]:
    out = ["", "### Index types on the same vectors (static corpus)", ""]
    out.append(
        f"Spaces: `raw` (the encoder's vectors, normalised), **{ann['index_space']}** (the space "
        "the 200k index's manifest says it searched, its own stored vectors and fitted "
        "calibrator), and full `whitening` fitted on the raw vectors. Recall@10 against exact "
        "(`Flat`) search in the same space, on the 2,000 real queries; QPS: all queries in one "
        "call (2 threads); p50: one query at a time (200 queries). Build: wall seconds from the "
        "vectors (IVF: 10 spherical k-means iterations on 64 (200k) or 32 (1M) rows per list; "
        "IVF-Flat and IVF-PQ each charged the shared quantizer). Memory: serialized index bytes. "
        "`@0.95`: the cheapest swept setting reaching recall@10 >= 0.95 (nprobe / efSearch; "
        "no target is set on index types: this is the study `auto` is tuned from)."
    )
    for size, by_space in ann["sizes"].items():
        if "_skipped" in by_space:
            out += ["", f"**{size}: not measured** ({by_space['_skipped']})."]
            continue
        extra = ""
        if size != str(ann["rows"]):
            shares = ", ".join(
                f"{sp} {r['top10_jittered_share']:.2f}"
                for sp, r in by_space.items()
                if not sp.startswith("_") and "top10_jittered_share" in r
            )
            extra = (
                f": synthetic, the real 200k rows plus {by_space['_copies']} jittered copies "
                f"of each (noise N(0, s^2 Cov(raw)), s = {by_space['_jitter_scale']:.3f}: half "
                "the median distance to a row's 10th neighbour in the whitened metric); share of "
                f"exact top-10 that are copies: {shares}"
                + ("" if by_space["_hnsw"] else "; HNSW not built (CPU budget)")
            )
        out += [
            "",
            f"**{int(size):,} rows{extra}**",
            "",
            "| space | index | build s | MiB | @0.95: setting, QPS, p50 ms | sweep (setting: "
            "recall) | load |",
            "|---|---|---:|---:|---|---|---|",
        ]
        for space, r in measured(by_space):
            if "_skipped" in r:
                out.append(f"| {space} | not measured ({r['_skipped']}) | | | | | |")
                continue
            for name, t in r["types"].items():
                pts = t["points"]
                at = first_at(pts)
                at_s = (
                    f"{at['param']}, {at['qps']:,.0f}, "
                    + (f"{at['p50_ms']:.2f}" if "p50_ms" in at else "-")
                    if at
                    else "not reached"
                )
                sweep = " ".join(f"{p['param']}:{p['recall']:.3f}" for p in pts)
                out.append(
                    f"| {space} | {name} | {t['build_s']:.1f} | {t['bytes'] / MB:,.0f} | {at_s} | "
                    f"{sweep} | {load_text(r['load'])} |"
                )
    out += _proxy(ann)
    return out


def _proxy(ann: dict[str, Any]) -> list[str]:
    out = ["", "`auto`'s tuning queries vs real queries on the IVF-Flat above (200k):", ""]
    for space, pr in ann.get("proxy", {}).items():
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


def _best(points: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """The point reaching recall 0.95 with the highest ``key`` throughput (lowest p50 if key is
    p50)."""
    ok = [p for p in points if p["recall"] >= TARGET_RECALL and key in p]
    if not ok:
        return None
    return min(ok, key=lambda p: p[key]) if key == "p50_ms" else max(ok, key=lambda p: p[key])


def rescore_section(ann: dict[str, Any]) -> list[str]:
    rs = ann.get("rescored")
    if not rs:
        return ["", "### Re-scoring raw candidates: not measured", ""]
    space = rs["space"]
    cands = rs["candidates"]
    depths = [p["depth"] for p in next(iter(cands.values()))]
    out = ["", f"### Candidates from raw vectors, re-scored exactly in {space}", ""]
    out += [
        f"Recall@10 against exact search in {space} (the index's searched space), by candidate "
        "depth; batch QPS (2,000 queries in one call) and single-query p50 ms of candidate search "
        f"+ exact re-scoring (load {load_text(rs['load'])}).",
        "",
        "| candidates from | " + " | ".join(f"depth {d}" for d in depths) + " |",
        "|---|" + "---:|" * len(depths),
    ]
    for name, pts in cands.items():
        cells = " | ".join(
            f"{p['recall']:.3f} ({p['qps']:,.0f}/s, {p['p50_ms']:.2f} ms)" for p in pts
        )
        out.append(f"| {name} | {cells} |")
    # the comparison the recommendation rests on: at recall >= 0.95, re-scored raw candidates
    # (approximate indexes only: the exact ceiling costs a full scan) vs the HNSW32 built on the
    # calibrated vectors themselves, by single-query p50 and by batch QPS
    own = ann["sizes"][str(ann["rows"])][space]["types"]["HNSW32"]["points"]
    resc = [
        {**p, "name": f"{n}, depth {p['depth']}"}
        for n, pts in cands.items()
        if "ceiling" not in n
        for p in pts
    ]
    h_lat, h_qps = _best(own, "p50_ms"), _best(own, "qps")
    r_lat, r_qps = _best(resc, "p50_ms"), _best(resc, "qps")
    ceiling = max(p["recall"] for p in cands["exact raw (ceiling)"])
    out += ["", "**Should flowsearch offer it?**", ""]
    if r_lat is None:
        out.append(
            f"- No re-scored configuration reached recall@10 0.95 in {space} (the exact raw "
            f"ceiling reached {ceiling:.3f} at the deepest depth)"
            + (
                f", while the calibrated-space HNSW32 did at efSearch {h_lat['param']} "
                f"({h_lat['p50_ms']:.2f} ms, {h_qps['qps']:,.0f} QPS)"
                if h_lat and h_qps
                else ""
            )
            + ". **Recommendation: do not offer it.**"
        )
        return out
    out.append(
        f"- Cheapest re-scored setting at recall >= 0.95 by latency: {r_lat['name']} "
        f"({r_lat['recall']:.3f}, {r_lat['p50_ms']:.2f} ms); by throughput: {r_qps['name']} "
        f"({r_qps['recall']:.3f}, {r_qps['qps']:,.0f} QPS)."
    )
    if h_lat is None or h_qps is None:
        out.append(
            "- The calibrated-space HNSW32 did not reach 0.95 in the sweep: re-scoring is the only "
            "measured way to 0.95 here. **Recommendation: offer it** (as an index option)."
        )
        return out
    out.append(
        f"- The calibrated-space HNSW32 at recall >= 0.95: efSearch {h_lat['param']} "
        f"({h_lat['recall']:.3f}, {h_lat['p50_ms']:.2f} ms); by throughput efSearch "
        f"{h_qps['param']} ({h_qps['qps']:,.0f} QPS)."
    )
    faster = r_lat["p50_ms"] < h_lat["p50_ms"] and r_qps["qps"] > h_qps["qps"]
    out.append(
        f"- Re-scoring is {h_lat['p50_ms'] / r_lat['p50_ms']:.2f}x the HNSW's speed by latency "
        f"and {r_qps['qps'] / h_qps['qps']:.2f}x by throughput at equal recall. "
        + (
            "**Recommendation: worth offering** (an index on raw vectors + exact re-scoring), "
            "if it stays ahead at 1M; it also keeps the index valid across a recalibration."
            if faster
            else "**Recommendation: do not offer it**: the HNSW on the calibrated vectors is at "
            "least as fast at equal recall, and re-scoring needs the calibrated vectors in memory "
            "beside a raw-space index."
        )
    )
    return out


def auto_section(scan: dict[str, Any], qry: dict[str, Any], ann: dict[str, Any]) -> list[str]:
    """Where ``auto`` should switch from Flat to HNSW32: the smallest measured row count where a
    Flat scan costs more than the tuned HNSW at 200k (the HNSW's cost grows ~log n, so a switch
    below that size costs recall for no latency gain), and where Flat exceeds the 1.2x budget of
    the ``mean`` encoder."""
    out = ["", "### `auto`'s choice of FAISS index (flowsearch/index.py)", ""]
    flat = {int(n): v for n, v in scan["flat_p50_ms"].items()}
    r = scan.get("static_200k", {})
    if "p50_ms" not in r:
        return out + ["Not measured: the 200k index is not approximate."]
    params = r["params"]
    tuned = int(params.split("=")[1]) if "=" in params else None
    hnsw_ms = r["p50_ms"][r["values"].index(tuned)] if tuned in r["values"] else float("nan")
    real_at_tuned = r["curves"]["real"][r["values"].index(tuned)] if tuned in r["values"] else 0
    cross = next((n for n in sorted(flat) if flat[n] > hnsw_ms), None)
    real = r["curves"]["real"]
    v_real = next((v for v, x in zip(r["values"], real, strict=True) if x >= TARGET_RECALL), None)
    real_ms = r["p50_ms"][r["values"].index(v_real)] if v_real is not None else float("nan")
    cross_real = next((n for n in sorted(flat) if flat[n] > real_ms), None)
    out.append(
        f"`auto` builds `Flat` up to 100,000 rows and `HNSW32` above, with efSearch tuned on noisy "
        f"self-queries. At 200k static it chose `{params}`: real-query recall@10 "
        f"{real_at_tuned:.3f} ({met(real_at_tuned >= TARGET_RECALL)} for 0.95), one query "
        f"{hnsw_ms:.2f} ms. Flat costs "
        + ", ".join(f"{flat[n]:.2f} ms at {n:,}" for n in sorted(flat))
        + "."
    )
    mean = qry.get("mean_200k", qry.get("mean_20k", {}))
    if "latency" in mean:
        budget = (TARGET_RATIO - 1) * mean["latency"]["encoder"]["p50"]
        over = next((n for n in sorted(flat) if flat[n] > budget), None)
        out.append(
            f"- With the default `mean` encoder the 1.2x target leaves {budget:.2f} ms beside the "
            "encoder; a Flat scan exceeds it from "
            + (f"{over:,} rows" if over else "no measured size (<= 200k)")
            + "."
        )
    out.append(
        f"- Flat (one query, one thread) is slower than this HNSW32 at `{params}` "
        f"({hnsw_ms:.2f} ms at 200k) from "
        + (f"{cross:,} rows" if cross else "no measured size (<= 200k)")
        + "; slower than HNSW32 at the smallest efSearch real queries need for 0.95 "
        + (
            f"({v_real}, {real_ms:.2f} ms) from "
            + (f"{cross_real:,} rows" if cross_real else "no measured size (<= 200k)")
            if v_real is not None
            else "(not reached)"
        )
        + " (measured sizes only; HNSW's cost grows slowly with rows, so its 200k cost bounds it "
        "below)."
    )
    if v_real is not None and tuned is not None and tuned > v_real:
        out.append(
            f"- The tuning queries are pessimistic here: `auto` set efSearch {tuned} where "
            f"{v_real} already gives real queries {real[r['values'].index(v_real)]:.3f}, so "
            f"its HNSW costs {hnsw_ms / real_ms:.1f}x the latency it needs."
        )
    return out
