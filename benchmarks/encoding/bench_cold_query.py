"""Cold single-query wall time of ``flowsearch query``, per encoder, beside txtai and Chroma.

A cold query is a new process that answers one query and exits, as a user running the command
line twice in a row sees it: Python starts, imports, loads the model and the index, encodes the
query, searches and prints; the operating system's file cache is warm (one untimed round first).

Measured on indexes of ``data/sample.parquet`` (300 passages), one per encoder: built with no
options (the default: ``mean`` on ONNX Runtime fp32 on a CPU), ``mean`` on torch and on ONNX int8,
and ``static``, each with the default ``auto`` calibration, and the
``static`` and ONNX int8 ones again with ``--calibration whitening`` (no flow: see below). Every
contender runs once per round, round-robin, the order rotated each round, so the shared machine's
load falls on all alike; the median of ``--repeats`` rounds is kept. ``--baseline DIR`` adds the
same commands run from another checkout (e.g. ``main`` before this work) to every round; the
peers are run by ``--peers-python`` (a separate virtualenv with txtai and chromadb).

Also written: a per-stage breakdown of our cold query (in one process: imports, model files,
encoder, first encode, calibrator, index, search), the import cost of each library alone, and the
modules outside ``flowsearch.encode`` that a query imports with what they pull in (``-X
importtime`` of one cold query), so they can be made lazy.

Writes ``benchmarks/encoding/bench_cold_query.json`` and ``.md``;
``--render`` only rewrites them from the saved JSON.

Usage:
    python -m benchmarks run cold_query [--repeats 5] [--baseline ../main]
        [--peers-python /tmp/peers-venv/bin/python] [--work /tmp/cold-query]
    python -m benchmarks run cold_query --smoke     # one round, figures untouched
    python -m benchmarks run cold_query --render
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import harness

ROOT = harness.ROOT
OUT = str(Path(__file__).resolve().with_suffix(""))
QUERY = "how do bees make honey"
#: name -> `flowsearch index` options
CONFIGS = {
    "default (no options)": [],
    "mean, torch": ["--pooling", "mean", "--backend", "torch"],
    "mean, onnx int8": ["--pooling", "mean", "--backend", "onnx", "--quantize", "int8"],
    "static": ["--pooling", "static"],
    "static, whitening": ["--pooling", "static", "--calibration", "whitening"],
    "mean, onnx int8, whitening": [
        *("--pooling", "mean", "--backend", "onnx", "--quantize", "int8"),
        *("--calibration", "whitening"),
    ],
}
LIBRARIES = [
    "numpy",
    "torch",
    "transformers",
    "transformers.models.bert.modeling_bert",
    "faiss",
    "duckdb",
    "pyarrow.parquet",
    "pydantic",
    "rich",
    "typer",
    "scipy.sparse",
    "bm25s",
    "onnxruntime",
    "tokenizers",
    "safetensors",
]
CLI = "import sys; from flowsearch.cli import main; sys.exit(main())"
STAGES = r"""
import json, sys, time
from pathlib import Path
index, query = Path(sys.argv[1]), sys.argv[2]
laps, t = {}, [time.perf_counter()]
def lap(name):
    now = time.perf_counter(); laps[name] = 1000 * (now - t[0]); t[0] = now
import flowsearch.cli
lap("import flowsearch.cli (typer, rich)")
from flowsearch.search.searcher import Searcher
lap("import the searcher (faiss, pyarrow, ...)")
from flowsearch.storage import manifest as mf
rec = mf.read(index).encoder
from flowsearch.encode.loading import load_parts
load_parts(rec.source, rec.max_length)
lap("model files: config, tokenizer, content hash")
from flowsearch.encode.encoder import open_encoder
enc = open_encoder(rec.identity(), rec.source)
lap("encoder: model, ONNX session or table")
enc.encode([query])
lap("first encode")
from flowsearch.calibration import load_calibrator
load_calibrator(index / mf.read(index).calibration.path)
lap("calibrator")
searcher = Searcher.open(index, encoder=enc)
lap("open the index (ann, rows, lexical)")
searcher.query(query, k=10)
lap("query: encode, search, join")
print(json.dumps(laps))
"""


def run(cmd: list[str], env: dict[str, str], cwd: Path = ROOT) -> tuple[float, str]:
    """Wall seconds of ``cmd`` and its stdout; fails loudly on a non-zero exit."""
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds, done.stdout


def env_for(checkout: Path, work: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(checkout),
        "HF_HUB_OFFLINE": "1",
        "FLOWSEARCH_CACHE": str(work / "cache"),
        "TOKENIZERS_PARALLELISM": "false",
    }


def build_indexes(work: Path) -> dict[str, Path]:
    """Our index per config (built once; an existing one is kept)."""
    out = {}
    for name, options in CONFIGS.items():
        index = work / re.sub(r"[^a-z0-9]+", "_", name)
        if not (index / "manifest.json").is_file():
            cmd = [sys.executable, "-c", CLI, "index", str(ROOT / "data/sample.parquet")]
            run(
                [*cmd, "--index", str(index), "--overwrite", "--json", *options],
                env_for(ROOT, work),
            )
        out[name] = index
    return out


def build_peers(python: str, work: Path, model: str) -> dict[str, list[str]]:
    """The peers' indexes (built once) and their cold-query commands."""
    peers = Path(__file__).resolve().parent / "cold_query_peers.py"
    corpus = str(ROOT / "data/sample.jsonl")
    commands = {}
    for peer in ("txtai", "chroma"):
        index = work / f"peer_{peer}"
        if not index.exists():
            run([python, str(peers), peer, "build", str(index), model, corpus], env_for(ROOT, work))
        commands[peer] = [python, str(peers), peer, "query", str(index), model, QUERY]
    return commands


Contender = tuple[list[str], dict[str, str], Path]


def contenders(
    indexes: dict[str, Path], baseline: Path | None, peers: dict[str, list[str]], work: Path
) -> dict[str, Contender]:
    """Every timed command, its environment and working directory: ours per config, the
    baseline's (run from its own checkout: ``python -c`` puts the working directory first on
    ``sys.path``), the peers'."""
    out = {}
    for name, index in indexes.items():
        cmd = [sys.executable, "-c", CLI, "query", QUERY, "--index", str(index), "--json"]
        out[f"ours | {name}"] = (cmd, env_for(ROOT, work), ROOT)
        if baseline is not None:
            out[f"baseline | {name}"] = (cmd, env_for(baseline, work), baseline)
    for peer, cmd in peers.items():
        out[f"peer | {peer}"] = (cmd, env_for(ROOT, work), work)
    return out


def time_rounds(timed: dict[str, Contender], repeats: int) -> dict[str, Any]:
    """Round-robin timing (one untimed warm-up round); each contender's seconds and top ids."""
    names = list(timed)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    top: dict[str, list[str]] = {}
    for round_no in range(repeats + 1):
        shift = round_no % len(names)
        for name in names[shift:] + names[:shift]:
            cmd, env, cwd = timed[name]
            wall, stdout = run(cmd, env, cwd)
            if round_no == 0:
                top[name] = _top_ids(stdout)
            else:
                seconds[name].append(wall)
        print(f"round {round_no}/{repeats} done", file=sys.stderr)
    return {"seconds": seconds, "top_ids": top}


def _top_ids(stdout: str) -> list[str]:
    """The hit ids a contender printed (our JSON, or a peer's one line of ids)."""
    text = stdout.strip().splitlines()[-1] if stdout.strip() else "[]"
    doc = json.loads(text) if text.startswith("[") else json.loads(stdout)
    return [str(h["id"]) for h in doc["hits"]] if isinstance(doc, dict) else [str(i) for i in doc]


def stage_breakdown(indexes: dict[str, Path], work: Path, repeats: int) -> dict[str, Any]:
    """Median milliseconds of each in-process stage of our cold query, per config."""
    out = {}
    for name, index in indexes.items():
        runs = [
            json.loads(
                run([sys.executable, "-c", STAGES, str(index), QUERY], env_for(ROOT, work))[1]
            )
            for _ in range(repeats)
        ]
        out[name] = {stage: statistics.median(r[stage] for r in runs) for stage in runs[0]}
    return out


def import_costs(work: Path, repeats: int) -> dict[str, float]:
    """Median milliseconds to import each library alone in a new process, Python's own start
    (``python -c pass``) subtracted."""

    def wall(code: str) -> float:
        return statistics.median(
            run([sys.executable, "-c", code], env_for(ROOT, work))[0] for _ in range(repeats)
        )

    start = wall("pass")
    costs = {"python -c pass (start-up)": 1000 * start}
    for lib in LIBRARIES:
        costs[lib] = 1000 * (wall(f"import {lib}") - start)
    return costs


LOADED = r"""
import atexit, json, os, sys
heavy = ("torch", "transformers", "onnxruntime", "model2vec")
atexit.register(lambda: open(os.environ["LOADED_OUT"], "w").write(
    json.dumps({m: m in sys.modules for m in heavy})))
from flowsearch.cli import main
sys.exit(main())
"""


def heavy_modules(indexes: dict[str, Path], work: Path) -> dict[str, dict[str, bool]]:
    """Per config, whether one cold ``flowsearch query`` left torch, transformers, onnxruntime
    or model2vec in ``sys.modules`` (imported at all, directly or not, on that path)."""
    out = {}
    target = work / "loaded.json"
    for name, index in indexes.items():
        cmd = [sys.executable, "-c", LOADED, "query", QUERY, "--index", str(index), "--json"]
        run(cmd, {**env_for(ROOT, work), "LOADED_OUT": str(target)})
        out[name] = json.loads(target.read_text())
    return out


PROBE = r"""
import json, os, sys, traceback
found, seen = [], set()
class Probe:
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in sys.modules or top in sys.stdlib_module_names or top in ("flowsearch", "site"):
            return None
        stack = [f for f in traceback.extract_stack()[:-1] if not f.filename.startswith("<")]
        if stack and "/flowsearch/" in stack[-1].filename and top not in seen:  # ours, directly
            seen.add(top)
            found.append({"package": top, "file": stack[-1].filename, "function": stack[-1].name})
        return None
sys.meta_path.insert(0, Probe())
import atexit
atexit.register(lambda: open(os.environ["PROBE_OUT"], "w").write(json.dumps(found)))
from flowsearch.cli import main
sys.exit(main())
"""


def eager_imports(index: Path, work: Path) -> list[dict[str, Any]]:
    """Which of our modules first imports each library on one cold query, from where (module
    level or a function), and the library's cumulative import ms (``-X importtime``)."""
    out = work / "probe.json"
    cmd = [sys.executable, "-X", "importtime", "-c", PROBE, "query", QUERY, "--index", str(index)]
    done = subprocess.run(
        [*cmd, "--json"],
        env={**env_for(ROOT, work), "PROBE_OUT": str(out)},
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    cost: dict[str, float] = {}
    for line in done.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| *(\S+)$", line)
        if m and "." not in m[2]:
            cost.setdefault(m[2], int(m[1]) / 1000)
    rows = []
    for hit in json.loads(out.read_text()):
        module = Path(hit["file"]).resolve().relative_to(ROOT).with_suffix("")
        rows.append(
            {
                "package": hit["package"],
                "module": ".".join(module.parts),
                "function": hit["function"],
                "ms": cost.get(hit["package"], 0.0),
            }
        )
    return sorted(rows, key=lambda r: -r["ms"])


def _commit(checkout: Path) -> str:
    """``branch@short-hash`` of a git checkout."""

    def git(*args: str) -> str:
        cmd = ["git", "-C", str(checkout), *args]
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()

    return f"{git('rev-parse', '--abbrev-ref', 'HEAD')}@{git('rev-parse', '--short', 'HEAD')}"


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "load_1_5_15": [round(x, 2) for x in os.getloadavg()]}


def render(report: dict[str, Any]) -> str:
    """The markdown section."""
    med = {k: statistics.median(v) for k, v in report["timing"]["seconds"].items()}
    top = report["timing"]["top_ids"]
    lines = [
        "## Cold single query (issue 24)",
        "",
        f"`{report['command']}`, {report['date']}; {report['machine_before']['cpus']} CPUs, load "
        f"(1/5/15 min) {report['machine_before']['load_1_5_15']} before and "
        f"{report['machine_after']['load_1_5_15']} after: a shared, busy machine, so compare "
        f"within a column. Query {QUERY!r}, `data/sample.parquet` (300 passages), median of "
        f"{report['repeats']} rounds (round-robin, warm file cache).",
        "",
        f"| encoder (index options) | {report.get('branch', 'this branch')}, s "
        f"| {report.get('baseline', 'baseline')}, s | ratio of medians "
        "| median of per-round ratios (range) | same top 10 |",
        "|---|---|---|---|---|---|",
    ]
    seconds = report["timing"]["seconds"]
    for name in CONFIGS:
        ours, base = med.get(f"ours | {name}"), med.get(f"baseline | {name}")
        same = top.get(f"ours | {name}") == top.get(f"baseline | {name}") if base else None
        ratio = f"{ours / base:.2f}" if ours and base else "-"
        paired = "-"
        if base:  # the two ran next to each other in every round: their ratio is steadier
            each = [a / b for a, b in zip(seconds[f"ours | {name}"], seconds[f"baseline | {name}"])]
            paired = f"{statistics.median(each):.2f} ({min(each):.2f}-{max(each):.2f})"
        shown = f"{base:.2f}" if base else "-"
        lines.append(
            f"| {name} | {ours:.2f} | {shown} | {ratio} | {paired} | "
            + ("-" if same is None else "yes" if same else "no")
            + " |"
        )
    if "baseline" in report:
        lines += [
            "",
            "Read the per-round ratios: each pair ran back to back, while the load of the shared "
            "machine moved absolute seconds by 2-3x between rounds.",
        ]
    else:
        lines += ["", "No baseline in this run (`--baseline` not given): absolute seconds only."]
    lines += _default_lines(seconds)
    lines += _loaded_lines(report.get("loaded"))
    lines += _peer_lines(med, seconds)
    lines += _stage_lines(report["stages"])
    lines += _import_lines(report["imports"], report["eager"])
    return "\n".join(lines) + "\n"


#: A cold query on an index built with no options, at most this many times one on ``static``.
DEFAULT_GOAL = 2.0


def _default_lines(seconds: dict[str, list[float]]) -> list[str]:
    """The default index's cold query against the ``static`` one's, per round (issue 44)."""
    default, static = seconds.get("ours | default (no options)"), seconds.get("ours | static")
    if not default or not static:
        return []
    each = [a / b for a, b in zip(default, static)]
    ratio = statistics.median(each)
    met = "met" if ratio <= DEFAULT_GOAL else "not met"
    return [
        "",
        f"Default index (built with no options) / `static` index, cold query, median of "
        f"per-round ratios: {ratio:.2f}x ({min(each):.2f}-{max(each):.2f}); goal <= "
        f"{DEFAULT_GOAL:g}x: {met}.",
    ]


def _loaded_lines(loaded: dict[str, dict[str, bool]] | None) -> list[str]:
    """Which heavy libraries one cold query imported, per config (measured, not assumed)."""
    if not loaded:
        return []
    libs = list(next(iter(loaded.values())))
    lines = [
        "",
        "Heavy libraries in `sys.modules` after one cold `flowsearch query` (imported at all, "
        "directly or through another library):",
        "",
        "| encoder (index options) | " + " | ".join(f"`{lib}`" for lib in libs) + " |",
        "|---|" + "---|" * len(libs),
    ]
    for name, mods in loaded.items():
        lines.append(f"| {name} | " + " | ".join("yes" if mods[x] else "no" for x in libs) + " |")
    return lines


_VERSUS = ("mean, torch", "mean, onnx int8", "static", "static, whitening")


def _peer_lines(med: dict[str, float], seconds: dict[str, list[float]]) -> list[str]:
    peers = [k for k in med if k.startswith("peer | ")]
    if not peers:
        return []
    lines = [
        "",
        "Peers, same corpus, same bundled model directory (sentence-transformers on torch), "
        "same machine and rounds. Each cold start includes Python, importing the library, "
        "loading the model, loading the index (txtai: FAISS Flat + SQLite content; Chroma: "
        "SQLite + HNSW), embedding the query and searching top 10. Ratios are medians of "
        "per-round ratios (ours / peer in the same round):",
        "",
        "| peer | cold query, s | " + " | ".join(f"ours ({c}) / peer" for c in _VERSUS) + " |",
        "|---|---|" + "---|" * len(_VERSUS),
    ]
    for peer in peers:
        cells = []
        for config in _VERSUS:
            each = [a / b for a, b in zip(seconds[f"ours | {config}"], seconds[peer])]
            cells.append(f"{statistics.median(each):.2f}")
        lines.append(f"| {peer[7:]} | {med[peer]:.2f} | {' | '.join(cells)} |")
    return lines


def _stage_lines(stages: dict[str, dict[str, float]]) -> list[str]:
    names = list(next(iter(stages.values())))
    lines = [
        "",
        "Where our cold query's time goes (this branch, one process, median ms; a stage includes "
        "the imports it triggers first, e.g. torch in `encoder` for the torch backend; the "
        "encoder stage repeats the model-file reads):",
        "",
        "| stage | " + " | ".join(stages) + " |",
        "|---|" + "---|" * len(stages),
    ]
    for stage in names:
        cells = " | ".join(f"{stages[c][stage]:.0f}" for c in stages)
        lines.append(f"| {stage} | {cells} |")
    totals = " | ".join(f"{sum(stages[c].values()):.0f}" for c in stages)
    return [*lines, f"| total | {totals} |"]


def _import_lines(imports: dict[str, float], eager: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "Import cost of each library alone (new process, median ms, start-up subtracted):",
        "",
    ]
    lines += ["| import | ms |", "|---|---|"]
    lines += [f"| `{lib}` | {ms:.0f} |" for lib, ms in imports.items()]
    lines += [
        "",
        "What a cold `static` query (default calibration) imports, by the module of ours that "
        "imports each library first: at its module level (so on every path through it) or "
        "inside a function (ms: the library's cumulative `-X importtime`, one run):",
        "",
        "| library | first imported by | where | ms |",
        "|---|---|---|---|",
    ]
    for row in eager:
        if row["ms"] >= 5:
            where = "module level" if row["function"] == "<module>" else f"`{row['function']}()`"
            lines.append(f"| `{row['package']}` | `{row['module']}` | {where} | {row['ms']:.0f} |")
    return lines


def main() -> None:
    parser = harness.arguments(__doc__, "one round", "cold-query", data=False)
    parser.set_defaults(out=OUT)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another checkout to time beside ours")
    parser.add_argument("--peers-python", help="a Python with txtai and chromadb installed")
    parser.add_argument("--work", type=Path, default=Path("/tmp/flowsearch-cold-query"))
    args = harness.parse(parser, repeats=1)
    if harness.rendered(args, render):
        return
    args.work = args.work.resolve()  # the peers run from inside it: a relative path breaks
    args.work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"command": harness.command_line(), "repeats": args.repeats}
    if args.baseline is not None:
        args.baseline = args.baseline.resolve()
        report["baseline"] = _commit(args.baseline)
    report["branch"] = _commit(ROOT)
    report["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    report["machine_before"] = machine()
    indexes = build_indexes(args.work)
    from flowsearch.encode.model_files import bundled_model_dir

    model = str(bundled_model_dir())
    peers = build_peers(args.peers_python, args.work, model) if args.peers_python else {}
    timed = contenders(indexes, args.baseline, peers, args.work)
    report["timing"] = time_rounds(timed, args.repeats)
    report["stages"] = stage_breakdown(indexes, args.work, max(3, args.repeats // 2))
    report["imports"] = import_costs(args.work, 3)
    report["eager"] = eager_imports(indexes["static"], args.work)
    report["loaded"] = heavy_modules(indexes, args.work)
    report["machine_after"] = machine()
    harness.finish(args, render, report)


if __name__ == "__main__":
    main()
