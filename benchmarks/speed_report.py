r"""Markdown for ``bench_speed.py``'s results (performance issue 10).

Every figure is read from the stage JSONs of one run (nothing typed in by hand) and is shown with
what it is, its target (or "no target") with **met** / **not met**, and the load average (1-minute
``os.getloadavg``) of the machine when it was measured: the machine is shared, so a wall-clock
figure is only as good as the load beside it. Latency targets are ratios inside one loop (ours
and the encoder's or the peer's time on the same query in the same iteration), so they are
steadier than the absolute milliseconds.

The conclusions (is the latency target met and what bounds it, whether to offer re-scoring of
raw-space candidates, where ``auto`` should switch from ``Flat`` to ``HNSW32``) are derived from
the figures by the rules written next to them below, so they follow the data of a rerun.
"""

from __future__ import annotations

from typing import Any

__all__ = ["write_report"]

GB = 1e9
MB = 2**20
TARGET_RATIO = 1.2  # search p50 / encoder p50
TARGET_RECALL = 0.95


def _met(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def _load(x: Any) -> str:
    """A load average (the 1-minute figure of a ``getloadavg`` triple, or of [before, after])."""
    if isinstance(x, (list, tuple)) and x and isinstance(x[0], (list, tuple)):
        return "-".join(f"{t[0]:.1f}" for t in x)
    return f"{x[0]:.1f}"


def _first_at(points: list[dict[str, Any]], target: float = TARGET_RECALL) -> dict[str, Any] | None:
    return next((p for p in points if p["recall"] >= target), None)


def _stage_load(r: dict[str, Any]) -> str:
    start = r.get("_load_start")
    return f"{_load(start)} at start, {_load(r['_load'])} at end" if start else _load(r["_load"])


def _ingest(r: dict[str, Any]) -> list[str]:
    lines = [
        "| ingest (child process `flowsearch index`) | rows | wall s | rows/s | peak RSS | CPU s | "
        "stages (wall s) | chose |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for name, i in r.items():
        if name.startswith("_"):
            continue
        if "_stopped" in i:
            st = i["_stopped"]
            lines.append(
                f"| {name} | stopped after {st['rows_encoded']:,} of {st['rows']:,} rows | "
                f"{st['wall_s']:.0f} | {st['rows_encoded'] / st['wall_s']:,.0f} | | "
                f"{st['cpu_s']:.0f} | {st['cpu_s_per_row'] * 1e3:.1f} CPU-ms per row; load "
                f"{_load(st['load'])} | not built |"
            )
            continue
        stages = ", ".join(f"{k} {v:.1f}" for k, v in i["seconds"].items() if k != "total")
        lines.append(
            f"| {name} | {i['rows']:,} | {i['wall_s']:.1f} | {i['rows'] / i['wall_s']:,.0f} | "
            f"{i['peak_rss_bytes'] / GB:.2f} GB | {i['cpu_s']:.0f} | {stages} | "
            f"{i['calibration']} / {i['space']}, {i['factory']} |"
        )
    return lines


def write_report(res: dict[str, Any]) -> str:
    ing, fit, qry, scan, ann = (res[k] for k in ("ingest", "fit", "query", "scan", "ann"))
    ing_mean = res.get("ingest_mean", {})
    c = res["corpus"]
    out = ["## Figures at 200k rows (`benchmarks/bench_speed.py`, issue 10)", ""]
    out.append(
        f"x86_64, {res['machine']['cpus']} cores shared with other engineers' jobs; stages ran at "
        "nice 0-5 (the ingests at 0 after nice 10 starved them), 2 torch and 2 FAISS threads. "
        "Load averages (1 min) per stage: "
        + "; ".join(
            f"{name} {_stage_load(res[name])}"
            for name in ("ingest", "ingest_mean", "fit", "query", "scan", "ann")
            if name in res
        )
        + ". Corpus: "
        f"{c['real_sentences']:,} distinct real sentences of `../shared/data` (STS-B, SICK, "
        "STS12-16, SNLI dev/test, QNLI dev and test answer sentences; QNLI's passages are single "
        f"sentences, so nothing to split) plus {c['splices']:,} splices (first half of one real "
        "sentence + second half of another, seeded, distinct) to reach 200,000 rows; the 20k "
        "indexes use its first 20,000 rows. Queries, never in the corpus: "
        f"{c['qnli_questions']:,} QNLI test questions and {c['held_out_sentences']:,} real "
        "sentences held out of the corpus. No i.i.d. random vectors anywhere."
    )
    out += _summary(ing, ing_mean, fit, qry)
    out += ["", "### Memory and ingest", ""] + _ingest({**ing, **ing_mean})
    out += _fit(fit, ing_mean)
    out += _query(qry)
    out += _scan(scan, qry)
    out += _ann(ann)
    out += _rescore(ann)
    out += _auto(scan, qry, ann)
    out += [
        "",
        "Regenerate with `PYTHONPATH=. nice python benchmarks/bench_speed.py --fresh` (the "
        "`mean` 200k ingest alone is tens of CPU-minutes); `--only STAGE,...` reruns chosen "
        "stages; every number is in `benchmarks/bench_speed.json`.",
    ]
    return "\n".join(out) + "\n"


def _pair(lat: dict[str, Any]) -> tuple[float, float]:
    """(search p50, encoder p50) from the pass where they alternate who goes first (older runs:
    from the step loop, where the search always went first)."""
    search = lat.get("search, alternating", lat["search"])
    encoder = lat.get("encoder, alternating", lat["encoder"])
    return float(search["p50"]), float(encoder["p50"])


def _ratio(r: dict[str, Any]) -> float:
    search, encoder = _pair(r["latency"])
    return search / encoder


STEPS = ("calibrator", "density", "faiss", "join")


def _step_ratio(r: dict[str, Any], faiss_key: str = "faiss") -> float:
    """(encoder + each step beside it, p50s) / encoder: the overhead from the timed pieces,
    steadier than two end-to-end p50s when the encoder's own time swings with the load."""
    lat = r["latency"]
    enc = lat["encoder"]["p50"]
    rest = sum(max(lat[k if k != "faiss" else faiss_key]["p50"], 0.0) for k in STEPS)
    return float((enc + rest) / enc)


def _summary(
    ing: dict[str, Any], ing_mean: dict[str, Any], fit: dict[str, Any], qry: dict[str, Any]
) -> list[str]:
    out = [
        "",
        "### Targets",
        "",
        "| figure | measured | target | | load |",
        "|---|---|---|---|---|",
    ]
    s2 = ing["static_200k"]
    out.append(
        f"| peak RSS, `flowsearch index --pooling static`, 200k rows (child process, `wait4`) | "
        f"{s2['peak_rss_bytes'] / GB:.2f} GB | < 3 GB | {_met(s2['peak_rss_bytes'] < 3 * GB)} | "
        f"{_load(ing['_load'])} |"
    )
    if "peak_rss_bytes" in ing_mean.get("mean_200k", {}):
        m2 = ing_mean["mean_200k"]
        out.append(
            f"| peak RSS, `flowsearch index` (default `mean`), 200k rows | "
            f"{m2['peak_rss_bytes'] / GB:.2f} GB | < 3 GB | "
            f"{_met(m2['peak_rss_bytes'] < 3 * GB)} | {_load(ing_mean['_load'])} |"
        )
    enc_s, enc_what = _mean_encode_s(fit, ing_mean)
    auto = f"{fit['auto_chose']} (auto)"
    t = fit[f"fit_s_{auto}"]
    out.append(
        f"| fit of what `auto` fits for static ({_cfg(fit)}) on 200k x 384, / `mean` encoding "
        f"of 200k rows ({enc_what}) | {t:.1f} s wall = {t / enc_s:.2%} | <= 10% | "
        f"{_met(t / enc_s <= 0.10)} | {_load(fit['_load'])} |"
    )
    for name in ("static_20k", "static_200k", "mean_20k", "mean_200k"):
        r = qry.get(name, {})
        if "_skipped" in r or not r:
            out.append(
                f"| `Searcher.search` p50 / encoder p50, {name} | not measured | <= 1.2 | | |"
            )
            continue
        ratio = _ratio(r)
        paired = r["latency"].get("search/encoder", {}).get("p50", float("nan"))
        lat = r["latency"]
        out.append(
            f"| `Searcher.search` p50 / encoder p50, {name} ({r['factory']} "
            f"{r['params']}, {r['calibrator']} / {r['space']}) | {_pair(lat)[0]:.2f} / "
            f"{_pair(lat)[1]:.3f} ms = **{ratio:.2f}x** (per-query paired median "
            f"{paired:.2f}x; from the steps' p50s {_step_ratio(r):.2f}x) | <= {TARGET_RATIO} | "
            f"{_met(ratio <= TARGET_RATIO)} | "
            f"{_load([r['load_before'], r['load_after_latency']])} |"
        )
        out.append(
            f"| recall@10 of the `auto` index vs exact, {name} | {r['recall']:.3f} | >= 0.95 | "
            f"{_met(r['recall'] >= TARGET_RECALL)} | {_load(qry['_load'])} |"
        )
    m = qry.get("mean_20k", {})
    comp = _composed(m)
    if comp and "latency" not in qry.get("mean_200k", {}):
        out.append(
            f"| **composed** `mean` at 200k: the `mean` 20k search with its FAISS step swapped, "
            f"per query, for the {comp['index']} | {comp['ms']:.2f} ms / "
            f"encoder = **{comp['ratio']:.2f}x** (paired median; from the steps' p50s "
            f"{_step_ratio(m, comp['step']):.2f}x) | <= {TARGET_RATIO} | "
            f"{_met(comp['ratio'] <= TARGET_RATIO)} (composed, not end to end) | "
            f"{_load([m['load_before'], m['load_after_latency']])} |"
        )
    if "latency" in m:
        lat = m["latency"]
        ok = lat["search beside peer"]["p50"] <= lat["peer"]["p50"]
        out.append(
            f"| flowsearch p50 vs peer (sentence-transformers + `IndexFlatIP`), 20k `mean` | "
            f"{lat['search beside peer']['p50']:.2f} vs {lat['peer']['p50']:.2f} ms (paired "
            "median ratio "
            f"{lat['search/peer']['p50']:.2f}) | <= peer | {_met(ok)} | "
            f"{_load([m['load_before'], m['load_after_latency']])} |"
        )
    return out


def _composed(m: dict[str, Any]) -> dict[str, Any] | None:
    """The ``mean`` 20k loop's composed 200k search (see ``bench_speed._faiss_200k``)."""
    lat = m.get("latency", {})
    key = next((k for k in lat if k.startswith("search with ") and not k.endswith("/encoder")), "")
    if not key:
        return None
    step = key[len("search with ") :]
    return {
        "step": step,
        "index": step[step.find("(") + 1 : step.rfind(")")] if "(" in step else step,
        "faiss_ms": lat[step]["p50"],
        "ms": lat[key]["p50"],
        "ratio": lat[f"{key}/encoder"]["p50"],
    }


def _cfg(fit: dict[str, Any]) -> str:
    extra = ", ".join(f"{k}={v}" for k, v in fit.get("auto_config", {}).items() if v is not None)
    return f"`{fit['auto_chose']}`" + (f" {extra}" if extra else "")


def _mean_encode_s(fit: dict[str, Any], ing_mean: dict[str, Any]) -> tuple[float, str]:
    """Seconds to encode the 200k corpus with ``mean``: measured by the 200k ``mean`` ingest when
    it ran, else extrapolated from a 2k sample."""
    if "seconds" in ing_mean.get("mean_200k", {}):
        return float(ing_mean["mean_200k"]["seconds"]["encode"]), "measured, the 200k ingest"
    return float(fit["mean_encode_200k_s_extrapolated"]), "extrapolated from a 2k sample"


def _fit(fit: dict[str, Any], ing_mean: dict[str, Any]) -> list[str]:
    enc, what = _mean_encode_s(fit, ing_mean)
    out = ["", "### Calibrator fit on 200k x 384 static raw vectors vs encoding with `mean`", ""]
    out += [
        f"One fit each, in one process (load {_stage_load(fit)}). Encoding 200k rows with `mean`: "
        f"{enc:.0f} s wall ({what}); a seeded 2,000-row sample took "
        f"{fit['mean_encode_2k_s']:.1f} s wall, {fit['mean_encode_2k_cpu_s']:.1f} s CPU.",
        "",
        "| calibrator | fit wall s | / `mean` encoding | fit CPU s | peak RSS after (GB) | "
        "target <= 10% |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for label in fit["fits"]:
        t, tc = fit[f"fit_s_{label}"], fit[f"fit_cpu_s_{label}"]
        rss = fit["peak_rss_gb"].get(f"after fitting {label}", float("nan"))
        out.append(
            f"| {label} | {t:.1f} | {t / enc:.2%} | {tc:.1f} | {rss:.2f} | {_met(t / enc <= 0.1)} |"
        )
    return out


def _query(qry: dict[str, Any]) -> list[str]:
    out = ["", '### One query through `Searcher.search(q, k=10, mode="dense")`', ""]
    out += [
        f"p50 ms over {qry['latency_queries']} real queries x {qry['rounds']} rounds, one at a "
        "time, after a warm-up; each step timed on the same query in the same iteration (the "
        "pieces called directly: encoder, calibrator + normalise, the density, the FAISS search, "
        "the Parquet join of the hits). FAISS runs a single query on one OpenMP thread, as "
        "`Searcher` now does; the same search with FAISS's default 2 threads is beside it. "
        "Recall@10 of the index as `auto` built it against exact "
        f"search in the same space, {qry['all_queries']:,} real queries (questions / sentences). "
        "Batch: 64 queries per call. Search p50, encoder p50 and their ratio come from a pass "
        "of their own where the two alternate who goes first, query by query (in the step "
        "loop the search always ran first and its pieces after it, warm from it, which "
        "overstated the ratio). The row cache of the join is as the search met it. "
        "Overhead = search p50 - encoder p50. Density = (calibrator "
        "+ density) - calibrator, per query (`~0`: below the timer's noise, e.g. `gaussian` "
        "gives both in one pass).",
        "",
        "| index | space | FAISS (auto) | search p50 | encoder p50 | ratio (<= 1.2) | "
        "overhead | calibrator | density | FAISS | FAISS, all OpenMP threads | join | "
        "recall@10 (q / s) | batch QPS | load |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for name in ("static_20k", "static_200k", "mean_20k", "mean_200k"):
        r = qry.get(name)
        if not r or "_skipped" in r:
            out.append(f"| {name} | not measured | | | | | | | | | | | | | |")
            continue
        lat = r["latency"]
        ratio = _ratio(r)
        out.append(
            f"| {name} | {r['calibrator']} / {r['space']} | {r['factory']} {r['params']} | "
            f"{_pair(lat)[0]:.2f} | {_pair(lat)[1]:.3f} | {ratio:.2f} "
            f"{_met(ratio <= TARGET_RATIO)} | {_pair(lat)[0] - _pair(lat)[1]:.2f} | "
            f"{lat['calibrator']['p50']:.3f} | {_dens(lat)} | "
            f"{lat['faiss']['p50']:.3f} | "
            f"{lat.get('faiss, all OpenMP threads', {}).get('p50', float('nan')):.3f} | "
            f"{lat['join']['p50']:.3f} | {r['recall']:.3f} "
            f"({r['recall_questions']:.3f} / {r['recall_sentences']:.3f}) "
            f"{_met(r['recall'] >= TARGET_RECALL)} | {r['batch_qps']:,.0f} | "
            f"{_load([r['load_before'], r['load_after_latency']])} |"
        )
    for name in ("mean_20k", "mean_200k"):
        r = qry.get(name, {})
        if "latency" not in r or "peer" not in r["latency"]:
            continue
        lat = r["latency"]
        mine = lat["search beside peer"]
        target = " target flowsearch <= peer: " + _met(mine["p50"] <= lat["peer"]["p50"])
        out.append(
            f"\n- Peer at {name} (sentence-transformers `encode` + `IndexFlatIP` over the same "
            f"stored raw vectors + a dict row -> text), alternating with `Searcher.search` query "
            f"by query: p50 **{lat['peer']['p50']:.2f} ms** (p95 {lat['peer']['p95']:.2f}); "
            f"flowsearch **{mine['p50']:.2f} ms** (p95 {mine['p95']:.2f}); per-query "
            f"paired ratio median {lat['search/peer']['p50']:.2f}."
            + (target if name == "mean_20k" else " (no target at 200k; context)")
        )
    out += _latency_reading(qry)
    return out


def _dens(lat: dict[str, Any]) -> str:
    """The density's p50: a difference of two timings, so below the timer's noise it is ~0."""
    d = lat["density"]["p50"]
    return f"{d:.3f}" if d > 0 else "~0"


def _latency_reading(qry: dict[str, Any]) -> list[str]:
    """What bounds the 1.2x target, from the breakdown: the largest overhead step."""
    out = []
    for name in ("static_20k", "static_200k", "mean_20k", "mean_200k"):
        r = qry.get(name, {})
        if "latency" not in r:
            continue
        lat = r["latency"]
        enc = lat["encoder"]["p50"]
        steps = {k: lat[k]["p50"] for k in ("calibrator", "density", "faiss", "join")}
        worst = max(steps, key=lambda k: steps[k])
        budget = (TARGET_RATIO - 1) * enc
        verdict = "met" if _ratio(r) <= TARGET_RATIO else "not met"
        out.append(
            f"- {name}: target {verdict} (search p50 / encoder p50 {_ratio(r):.2f}x; per-query "
            f"paired median {lat['search/encoder']['p50']:.2f}x; from the steps' p50s "
            f"{_step_ratio(r):.2f}x; the encoder's own p95 / p50 is "
            f"{lat['encoder']['p95'] / lat['encoder']['p50']:.1f}, the swing the load puts on "
            "it). The budget beside the encoder is 0.2 x "
            f"{enc:.3f} = {budget:.3f} ms; the steps cost calibrator {steps['calibrator']:.3f}, "
            f"density {max(steps['density'], 0):.3f}, FAISS {steps['faiss']:.3f}, join "
            f"{steps['join']:.3f} ms (sum {sum(steps.values()):.3f}); the largest is **{worst}**."
            + (
                f" No index can meet it here: the calibrator and density alone "
                f"({steps['calibrator'] + steps['density']:.3f} ms) exceed the budget."
                if steps["calibrator"] + steps["density"] > budget
                else ""
            )
        )
    comp = _composed(qry.get("mean_20k", {}))
    if comp and "latency" not in qry.get("mean_200k", {}):
        lat = qry["mean_20k"]["latency"]
        enc = lat["encoder"]["p50"]
        budget = (TARGET_RATIO - 1) * enc
        rest = {k: lat[k]["p50"] for k in ("calibrator", "density", "join")}
        out.append(
            f"- `mean` at 200k (composed: no `mean` 200k index could be built in time, see the "
            f"ingest table): encoder {enc:.2f} ms, budget 0.2 x encoder = {budget:.2f} ms; "
            f"calibrator {rest['calibrator']:.3f}, density {rest['density']:.3f}, join "
            f"{rest['join']:.3f} (from the `mean` 20k index) and the 200k FAISS step "
            f"{comp['faiss_ms']:.3f} ms ({comp['index']}); paired ratio {comp['ratio']:.2f}x: "
            f"target {'met' if comp['ratio'] <= TARGET_RATIO else 'not met'}."
        )
    return ["", "**What bounds the latency target.**", ""] + out if out else []


def _scan(scan: dict[str, Any], qry: dict[str, Any]) -> list[str]:
    out = ["", "### Exact scan cost by rows, and the tuning queries `auto` relies on", ""]
    sizes = list(scan["flat_p50_ms"])
    out += [
        f"`IndexFlatIP` single-query p50 (ms) over prefixes of the static 200k searched vectors "
        f"(200 real queries; load {_load(scan['load_start'])}-{_load(scan['load_end'])}):",
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


def _ann(ann: dict[str, Any]) -> list[str]:
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
                    f"{at['param']}, {at['qps']:,.0f}, "
                    + (f"{at['p50_ms']:.2f}" if "p50_ms" in at else "-")
                    if at
                    else "not reached"
                )
                sweep = " ".join(f"{p['param']}:{p['recall']:.3f}" for p in pts)
                out.append(
                    f"| {space} | {name} | {t['build_s']:.1f} | {t['bytes'] / MB:,.0f} | {at_s} | "
                    f"{sweep} | {_load(r['load'])} |"
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


def _rescore(ann: dict[str, Any]) -> list[str]:
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
        f"+ exact re-scoring (load {_load(rs['load'])}).",
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


def _auto(scan: dict[str, Any], qry: dict[str, Any], ann: dict[str, Any]) -> list[str]:
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
        f"{real_at_tuned:.3f} ({_met(real_at_tuned >= TARGET_RECALL)} for 0.95), one query "
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
