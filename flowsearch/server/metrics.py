r"""``GET /metrics``: what the server did, in the Prometheus text format (``prometheus-client``).

Counted as requests are answered (a search pays a few counter and histogram updates, nothing
more: ``benchmarks/serving/bench_metrics.py`` measures it):

- ``flowsearch_searches_total{index, mode, status}``: search requests by HTTP status;
- ``flowsearch_writes_total{index, kind, status}``: upserts, deletes and builds (``create``);
- ``flowsearch_search_seconds{index, mode}``: a search request's time (histogram);
- ``flowsearch_stage_seconds{index, stage}``: its stages (``encode``, ``search``, ``fuse``,
  ``rows``, ``rerank``: what :mod:`flowsearch.search.timings` reports; histograms);
- ``flowsearch_write_seconds{index, kind}``: a write's time, its wait in the queue included;
- ``flowsearch_refreshes_total{index}``: moves to a newer version (the server's own writes and
  other processes').

Read when scraped, from each open index's pinned version (no work between scrapes):
``flowsearch_rows{index}`` (live rows), ``flowsearch_deleted_rows{index}``,
``flowsearch_documents{index}``, ``flowsearch_segments{index}``, ``flowsearch_version{index}``.

Each app has a registry of its own (not the process-wide default): several apps in one process
(tests, a server per index) never mix their counts.

Example:
    >>> m = Metrics(lambda: [])
    >>> with m.searching("idx", "dense"):
    ...     pass
    >>> b'flowsearch_searches_total{index="idx",mode="dense",status="200"} 1.0' in m.render()
    True
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from flowsearch.errors import FlowsearchError
from flowsearch.search.searcher import Searcher
from flowsearch.search.timings import collect

__all__ = ["CONTENT_TYPE", "Metrics"]

#: The Prometheus text format's media type.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Latency buckets, seconds (half a millisecond to ten seconds).
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: What the scrape-time gauges read: (index name, its open Searcher) for each open index.
OpenIndexes = Callable[[], Iterable[tuple[str, Searcher]]]


def _status(exc: BaseException) -> str:
    if isinstance(exc, FlowsearchError):
        return str(exc.http_status)
    return str(getattr(exc, "status_code", 500))


class _IndexGauges(Collector):
    """The open indexes' sizes, read from their pinned versions when scraped."""

    def __init__(self, indexes: OpenIndexes) -> None:
        self._indexes = indexes

    def collect(self) -> Iterator[Metric]:
        gauges = {
            "rows": ("flowsearch_rows", "Live rows of the served version."),
            "deleted": ("flowsearch_deleted_rows", "Deleted rows not yet compacted away."),
            "documents": ("flowsearch_documents", "Live documents of the served version."),
            "segments": ("flowsearch_segments", "Segments of the served version."),
            "version": ("flowsearch_version", "The served version's number."),
        }
        families = {k: GaugeMetricFamily(n, h, labels=["index"]) for k, (n, h) in gauges.items()}
        for name, searcher in self._indexes():
            version = searcher.version
            manifest = version.manifest
            values = {
                "rows": manifest.n_live,
                "deleted": manifest.n_deleted,
                "documents": version.n_documents,
                "segments": len(manifest.segments),
                "version": manifest.version,
            }
            for key, value in values.items():
                if value is not None:
                    families[key].add_metric([name], float(value))
        yield from families.values()

    def describe(self) -> Iterator[Metric]:
        return iter(())


class Metrics:
    """An app's counters and histograms (see the module docstring)."""

    def __init__(self, indexes: OpenIndexes) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.searches = Counter("flowsearch_searches", "Search requests answered.",
                                ["index", "mode", "status"], registry=r)  # fmt: skip
        self.writes = Counter("flowsearch_writes", "Write requests answered.",
                              ["index", "kind", "status"], registry=r)  # fmt: skip
        self.search_seconds = Histogram("flowsearch_search_seconds",
                                        "Time of a search request (all its queries).",
                                        ["index", "mode"], buckets=BUCKETS,
                                        registry=r)  # fmt: skip
        self.stage_seconds = Histogram("flowsearch_stage_seconds",
                                       "Time of a search request's stages.",
                                       ["index", "stage"], buckets=BUCKETS,
                                       registry=r)  # fmt: skip
        self.write_seconds = Histogram("flowsearch_write_seconds",
                                       "Time of a write request, its wait in the queue included.",
                                       ["index", "kind"], buckets=BUCKETS, registry=r)  # fmt: skip
        self.refreshes = Counter("flowsearch_refreshes", "Moves to a newer published version.",
                                 ["index"], registry=r)  # fmt: skip
        r.register(_IndexGauges(indexes))
        self._children: dict[tuple[object, ...], Any] = {}

    def _child(self, metric: Counter | Histogram, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once (a dict hit after the first)."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    @contextlib.contextmanager
    def _timed(self, count: Counter, seconds: Histogram, index: str, what: str) -> Iterator[None]:
        """Count the request run inside by its status; time it when it succeeded."""
        start = time.perf_counter()
        status = "200"
        try:
            yield
        except BaseException as exc:
            status = _status(exc)
            raise
        finally:
            self._child(count, index, what, status).inc()
            if status == "200":
                self._child(seconds, index, what).observe(time.perf_counter() - start)

    @contextlib.contextmanager
    def searching(self, index: str, mode: str) -> Iterator[None]:
        """Count and time the search requests run inside (their stages too, when answered)."""
        with collect() as stages, self._timed(self.searches, self.search_seconds, index, mode):
            yield
        for name, took in stages.items():  # reached only when the search answered
            self._child(self.stage_seconds, index, name).observe(took)

    def writing(self, index: str, kind: str) -> contextlib.AbstractContextManager[None]:
        """Count and time a write request."""
        return self._timed(self.writes, self.write_seconds, index, kind)

    def refreshed(self, index: str) -> None:
        """Count a move to a newer version."""
        self._child(self.refreshes, index).inc()

    def render(self) -> bytes:
        """Everything, in the Prometheus text format."""
        return generate_latest(self.registry)
