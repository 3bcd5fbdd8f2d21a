r"""Serving one index from Ray actors: ``Searcher.open(index_dir, engine="ray", shards=N)``.

The version's segments are spread over N actors, balanced by live rows (the largest first, each
to the lightest shard) and started on the cluster's live nodes in turn. Each actor opens its
segments from the index directory (a path every node reads: a shared filesystem) and answers as
a :class:`~flowsearch.search.shards.SegmentSet`; the driver (this process) holds the manifest,
the encoder and the calibrator, embeds the queries once, and runs the two phases of
:func:`flowsearch.search.shards.run`: the version's statistics (kept per version), then each
shard's top candidates scored with them, merged exactly. Same ids as one process, same scores
for exact segments.

**Versions.** Every call carries the shard's *spec* for the driver's pinned version (its version
number, its segments' records, their global first rows), put once per version in Ray's object
store. An actor behind the spec moves to it first (opening only segments it lacks: the
per-segment reuse of :func:`~flowsearch.search.version.load`), and keeps the previous version
too, so a query already running on it finishes on the version it started on. ``refresh()``
moves every actor before the searcher answers from the new version; segments keep their shard
across versions, new ones go to the lightest shard.

**Faults.** Actors are restarted by Ray when they die (:data:`SHARD_RESTARTS`; a restart
reopens its segments from its spec) and a call lost with its actor is retried. A call that
gets no answer within the searcher's ``SearchOptions.shard_timeout`` seconds raises
:class:`~flowsearch.errors.Unavailable` (HTTP 503): never a partial answer.

Example:
    >>> s = Searcher.open("idx", engine="ray", shards=2)  # doctest: +SKIP
    >>> s.search("a query", k=3)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flowsearch.encode.protocol import TextEncoder
from flowsearch.errors import BadInput, FlowsearchError, MissingExtra, Unavailable
from flowsearch.search import shards as sh
from flowsearch.search.dense import SegmentHelpers
from flowsearch.search.options import SearchOptions
from flowsearch.search.version import Opened, Version, live_documents, load, open_current
from flowsearch.space.search_space import SearchSpace
from flowsearch.storage import manifest as mf
from flowsearch.storage.rows import RowCache, RowRecord
from flowsearch.storage.verify import verify as check_files

if TYPE_CHECKING:
    from flowsearch.search.filters import MetadataFilter

__all__ = [
    "SHARD_RESTARTS",
    "RayBackend",
    "RayShards",
    "ShardServer",
    "ShardSpec",
    "assign",
    "connect",
]

LOG = logging.getLogger(__name__)

#: How often Ray restarts a lost shard actor, and retries a call it lost.
SHARD_RESTARTS = 3


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise MissingExtra(
            "engine='ray' needs Ray, which is not installed",
            "install the extra: pip install 'flowsearch[ray]'",
        ) from None
    return ray


def _reachable(address: str) -> None:
    """Refuse a ``host:port`` nothing listens on at once (Ray itself retries for a minute)."""
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise BadInput(f"address {address!r} is not host:port",
                       "give the {address} of a running Ray cluster, e.g. 10.0.0.5:6379",
                       param="address")  # fmt: skip
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except OSError as exc:
        raise BadInput(
            f"cannot reach Ray at address {address!r} ({exc.strerror or exc})",
            "check the {address} (a running cluster's), or leave it out for a local Ray",
            param="address",
        ) from None


def _same_cluster(ray: Any, address: str | None) -> None:
    """Refuse an explicit ``host:port`` other than the cluster this process already joined:
    Ray joins one cluster per process, so the searcher would silently use the other one."""
    if address is None or address == "auto" or "://" in address:
        return
    current = str(ray.get_runtime_context().gcs_address or "")
    if address != current:
        raise BadInput(
            f"this process is already connected to Ray at {current!r}, not {address!r}",
            "leave out the {address} to use that cluster, or open from a new process",
            param="address",
        )


def connect(address: str | None = None) -> tuple[Any, bool]:
    """Ray, connected: to ``address``, else ``RAY_ADDRESS``, else the Ray this process already
    initialised, else a new local one (as many CPUs as the machine, on 127.0.0.1). Returns
    ``(ray, started)``: whether this call started it (so its searcher stops it on close).

    Raises:
        MissingExtra: Ray is not installed.
        BadInput: ``address`` cannot be reached, or names another cluster than the one this
            process already joined.
    """
    ray = _import_ray()
    if ray.is_initialized():
        _same_cluster(ray, address)
        return ray, False
    address = address or os.environ.get("RAY_ADDRESS") or None
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address is None:
        package_root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        kwargs.update(
            num_cpus=os.cpu_count() or 1,
            runtime_env={"env_vars": {"PYTHONPATH": path}},
            _node_ip_address="127.0.0.1",
        )
    else:
        _reachable(address)
    try:  # "local": a new Ray, never one another process left running on this machine
        ray.init(address=address or "local", **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise BadInput(
            f"cannot connect to Ray at address {address!r} ({exc})",
            "check the {address} (a running cluster's), or leave it out for a local Ray",
            param="address",
        ) from None
    return ray, True


# -- where segments go ---------------------------------------------------------------------


def assign(
    manifest: mf.Manifest, shards: int, before: dict[str, int] | None = None
) -> dict[str, int]:
    """Each segment's shard (by segment name), balanced by live rows: segments keep the shard
    they had in ``before``; the others, largest first, go to the lightest shard."""
    load_of = [0] * shards
    out: dict[str, int] = {}
    fresh = []
    for seg in manifest.segments:
        kept = (before or {}).get(seg.name)
        if kept is not None and kept < shards:
            out[seg.name] = kept
            load_of[kept] += seg.n_live
        else:
            fresh.append(seg)
    for seg in sorted(fresh, key=lambda s: (-s.n_live, s.name)):
        lightest = min(range(shards), key=lambda i: (load_of[i], i))
        out[seg.name] = lightest
        load_of[lightest] += seg.n_live
    return out


@dataclass(frozen=True)
class ShardSpec:
    """What one shard serves at one version: its segments (a manifest holding only them) and
    each one's first global row in the whole version."""

    version: int
    manifest: mf.Manifest
    base: tuple[int, ...]


def specs(manifest: mf.Manifest, where: dict[str, int], shards: int) -> list[ShardSpec]:
    """Every shard's :class:`ShardSpec` for ``manifest`` under the assignment ``where``."""
    starts = np.concatenate([[0], np.cumsum([s.n_rows for s in manifest.segments])])
    out = []
    for i in range(shards):
        picked = [j for j, s in enumerate(manifest.segments) if where[s.name] == i]
        sub = manifest.model_copy(update={"segments": tuple(manifest.segments[j] for j in picked)})
        out.append(ShardSpec(int(manifest.version), sub, tuple(int(starts[j]) for j in picked)))
    return out


# -- the actor -----------------------------------------------------------------------------


class ShardServer:
    """One shard: a Ray actor's state (made with ``ray.remote``; also usable in-process).

    Keeps the :class:`~flowsearch.search.shards.SegmentSet` of the last two versions it was
    asked for; every call names its version's spec and moves the shard to it first.

    The shards already search in parallel (one actor per CPU by default), so an actor searches
    a query's segments in turn unless the searcher's options set ``segment_threads`` (its
    default, every core, is then 1 here), not with helpers on every actor's cores at once."""

    KEEP = 2

    def __init__(self, root: str, mmap: bool = False, options: SearchOptions | None = None) -> None:
        # nothing opened yet: every call names its spec, so an actor Ray restarts opens the
        # version asked for then, not the one it was first made for
        self.root = Path(root)
        self.mmap = mmap
        self.options = options or SearchOptions()
        self.opened = Opened(
            cache=RowCache(self.options.row_cache_bytes),
            lexical_cache_bytes=self.options.lexical_cache_bytes,
        )
        threads = self.options.segment_threads or 1
        self.helpers = SegmentHelpers(threads) if threads > 1 else None
        self.sets: dict[int, tuple[ShardSpec, sh.SegmentSet]] = {}
        self._filters: MetadataFilter | None = None

    def _database(self) -> MetadataFilter:
        if self._filters is None:
            from flowsearch.search.filters import MetadataFilter

            self._filters = MetadataFilter(
                timeout=self.options.filter_timeout, memory_limit=self.options.filter_memory_bytes
            )
        return self._filters

    def _move(self, spec: ShardSpec) -> sh.SegmentSet:
        held = self.sets.get(spec.version)
        if held is not None:
            return held[1]
        version = load(self.root, spec.manifest, self.opened, mmap=self.mmap, with_encoder=False)
        shard = sh.SegmentSet(version, np.array(spec.base, np.int64), filters=self._database,
                              helpers=self.helpers)  # fmt: skip
        self.sets[spec.version] = (spec, shard)
        for old in sorted(self.sets)[: -self.KEEP]:
            del self.sets[old]
        kept = {(s.name, s.dir): s for sp, _ in self.sets.values() for s in sp.manifest.segments}
        union = spec.manifest.model_copy(update={"segments": tuple(kept.values())})
        for reader in self.opened.keep_only(union):  # calls run one at a time: none is in use
            reader.close()
        return shard

    def _call(self, spec: ShardSpec, method: str, *args: Any) -> tuple[bool, Any]:
        """``(True, answer)``, or ``(False, error)`` for a flowsearch error (re-raised by the
        driver as itself, not wrapped in Ray's task error)."""
        try:
            shard = self._move(spec)
            return True, getattr(shard, method)(*args)
        except FlowsearchError as exc:
            return False, exc

    def ready(self, spec: ShardSpec) -> tuple[bool, Any]:
        try:
            return True, self._move(spec).number
        except FlowsearchError as exc:
            return False, exc

    def statistics(self, spec: ShardSpec, terms: list[str]) -> tuple[bool, Any]:
        return self._call(spec, "statistics", spec.version, terms)

    def answer(self, spec: ShardSpec, request: sh.Request) -> tuple[bool, Any]:
        return self._call(spec, "answer", request)

    def records(self, spec: ShardSpec, rows: np.ndarray) -> tuple[bool, Any]:
        return self._call(spec, "records", spec.version, rows)

    def node(self) -> str:
        """The Ray node this actor runs on."""
        import ray

        node: str = ray.get_runtime_context().get_node_id()
        return node


# -- the driver ----------------------------------------------------------------------------


class RayShards:
    """The :class:`~flowsearch.search.shards.Shards` of one version: actors asked in
    parallel, every call bounded by ``timeout`` seconds."""

    def __init__(self, ray: Any, actors: list[Any], manifest: mf.Manifest,
                 where: dict[str, int], timeout: float = SearchOptions.shard_timeout,
                 ) -> None:  # fmt: skip
        self.ray = ray
        self.timeout = timeout
        self.actors = actors
        self.version = int(manifest.version)
        self.specs = specs(manifest, where, len(actors))
        self.refs = [ray.put(spec) for spec in self.specs]
        starts = np.concatenate([[0], np.cumsum([s.n_rows for s in manifest.segments])])[:-1]
        self._starts = np.asarray(starts, np.int64)
        self._shard_of = np.array([where[s.name] for s in manifest.segments], np.int64)

    def __len__(self) -> int:
        return len(self.actors)

    def owners(self, rows: np.ndarray) -> np.ndarray:
        return sh.owners_of(self._starts, self._shard_of, rows)

    def ready(self) -> None:
        """Every actor on this version (opening what it lacks)."""
        self._all("ready", [() for _ in self.actors])

    def statistics(self, version: int, terms: Sequence[str]) -> list[sh.Statistics]:
        self._check(version)
        return self._all("statistics", [(list(terms),) for _ in self.actors])

    def answer(self, request: sh.Request) -> list[sh.Answer]:
        self._check(request.version)
        ref = self.ray.put(request)
        return self._all("answer", [(ref,) for _ in self.actors])

    def records(self, version: int, rows: Sequence[np.ndarray]) -> list[list[RowRecord]]:
        self._check(version)
        asked = [i for i, r in enumerate(rows) if len(r)]
        found = self._all("records", [(rows[i],) for i in asked], asked)
        out: list[list[RowRecord]] = [[] for _ in rows]
        for i, records in zip(asked, found, strict=True):
            out[i] = records
        return out

    def _check(self, version: int) -> None:
        if version != self.version:
            raise BadInput(f"these shards serve version {self.version}, not {version}")

    def _all(self, method: str, args: list[tuple[Any, ...]],
             which: Sequence[int] | None = None) -> list[Any]:  # fmt: skip
        """Call ``method`` on the actors (``which``, default all) and wait for every answer."""
        which = range(len(self.actors)) if which is None else which
        ray = self.ray
        calls = [getattr(self.actors[i], method).remote(self.refs[i], *a)
                 for i, a in zip(which, args, strict=True)]  # fmt: skip
        timeout = self.timeout
        try:
            answers = ray.get(calls, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            for call in calls:
                with contextlib.suppress(Exception):
                    ray.cancel(call)
            raise Unavailable(
                f"a shard of version {self.version} did not answer within {timeout:g} s",
                "retry; if it persists, check the Ray cluster (or a larger "
                "SearchOptions(shard_timeout=...))",
            ) from None
        except ray.exceptions.RayError as exc:
            raise Unavailable(
                f"a shard of version {self.version} was lost ({type(exc).__name__})",
                "retry: Ray restarts lost shards; if it persists, check the Ray cluster",
            ) from None
        out = []
        for ok, value in answers:
            if not ok:
                raise value
            out.append(value)
        return out


def _placements(ray: Any, n: int) -> list[Any]:
    """Where each of ``n`` shards starts: the cluster's live nodes in turn (a soft affinity, so
    a shard whose node is gone starts on another). Ray's ``SPREAD`` is best effort: under load
    it put both shards of a 3-node cluster on one node (tests/test_ray_serve.py)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = sorted(node["NodeID"] for node in ray.nodes() if node.get("Alive"))
    if not nodes:
        return ["SPREAD"] * n
    return [NodeAffinitySchedulingStrategy(nodes[i % len(nodes)], soft=True) for i in range(n)]


class RayBackend:
    """What a :class:`~flowsearch.search.searcher.Searcher` opened with ``engine="ray"``
    holds: the actors, the assignment of segments to them, the shards of the pinned version
    (and of the one before, for queries still running on it)."""

    def __init__(self, ray: Any, started: bool, actors: list[Any], where: dict[str, int],
                 version: Version, opened: Opened, options: SearchOptions) -> None:  # fmt: skip
        self.ray, self.started, self.actors, self.where = ray, started, actors, where
        self.root, self.opened, self.options = version.root, opened, options
        self.current = RayShards(ray, actors, version.manifest, where, options.shard_timeout)
        self.old: RayShards | None = None

    @classmethod
    def start(
        cls,
        index_dir: str | os.PathLike[str],
        verify: bool = False,
        *,
        encoder: TextEncoder | None = None,
        model: str | os.PathLike[str] | None = None,
        shards: int | None = None,
        address: str | None = None,
        options: SearchOptions | None = None,
    ) -> tuple[RayBackend, Version]:
        """Connect to Ray, start the actors on the current version's segments; returns the
        backend and the driver's version (see :meth:`Searcher.open`: ``shards`` is capped at
        the number of segments, default one per CPU of the cluster)."""
        if shards is not None and (
            isinstance(shards, bool) or not isinstance(shards, int) or shards < 1
        ):
            raise BadInput(f"shards must be an integer >= 1, got {shards!r}", param="shards")
        _import_ray()  # before loading anything: one line naming the extra
        options = options or SearchOptions()
        root = Path(index_dir).expanduser()
        opened = Opened()
        version = open_current(root, lambda m: _front(root, m, opened, verify, encoder, model))
        ray, started = connect(address)
        actors: list[Any] = []
        try:
            cpus = max(int(ray.cluster_resources().get("CPU", 1)), 1)
            wanted = shards or cpus
            n = max(1, min(wanted, len(version.manifest.segments)))
            if n < wanted:
                LOG.info("%d shards asked, %d segments: using %d", wanted, n, n)
            restarts = SHARD_RESTARTS
            for place in _placements(ray, n):
                actor = ray.remote(ShardServer).options(
                    # no CPU reserved: a shard always fits (any node count, any shard count)
                    # and a lost one restarts wherever a node is left (the affinity is soft)
                    num_cpus=0,
                    max_restarts=restarts,
                    max_task_retries=restarts,
                    scheduling_strategy=place,
                )
                actors.append(actor.remote(str(root.resolve()), False, options))
            backend = cls(ray, started, actors, assign(version.manifest, n), version, opened,
                          options)  # fmt: skip
            backend.current.ready()
        except BaseException:
            for made in actors:
                with contextlib.suppress(Exception):
                    ray.kill(made)
            if started:
                ray.shutdown()
            raise
        return backend, version

    def shards(self, version: Version) -> sh.Shards:
        """The shards answering for ``version`` (the pinned one, or the one before)."""
        number = int(version.manifest.version)
        for held in (self.current, self.old):
            if held is not None and held.version == number:
                return held
        raise BadInput("this version is no longer served", "search again")

    def refresh(self, encoder: TextEncoder | None) -> Version:
        """Move every shard to the index's current version (each opening only the segments
        it lacks) and return the driver's view of it; the searcher answers from it once every
        shard holds it."""
        root, opened = self.root, self.opened
        version = open_current(root, lambda m: _front(root, m, opened, False, encoder, None))
        opened.keep_only(version.manifest)
        where = assign(version.manifest, len(self.actors), self.where)
        moved = RayShards(self.ray, self.actors, version.manifest, where,
                          self.options.shard_timeout)  # fmt: skip
        moved.ready()
        self.old, self.current, self.where = self.current, moved, where
        return version

    def vectors(self, version: Version) -> np.ndarray:
        raise BadInput("a searcher on Ray does not hold the vectors",
                       "open the index with {engine='local'} to read them")  # fmt: skip

    def describe(self) -> str:
        return f", engine='ray', shards={len(self.actors)}"

    def close(self) -> None:
        """Stop the actors (and Ray, when this backend started it)."""
        for actor in self.actors:
            with contextlib.suppress(Exception):
                self.ray.kill(actor)
        self.actors = []
        if self.started:
            self.ray.shutdown()
            self.started = False


def _front(
    root: Path,
    manifest: mf.Manifest,
    opened: Opened,
    verify: bool,
    encoder: TextEncoder | None,
    model: str | os.PathLike[str] | None,
) -> Version:
    """The driver's view of a version: manifest, space (encoder and calibrator), files
    checked; no segment opened (the actors open them)."""
    checked = check_files(root, manifest, checksums=verify, segments=None if verify else [],
                          calibrator=True)  # fmt: skip
    space = opened.spaces.get(manifest.calibration.path)
    if space is None:
        space = SearchSpace.open(root, manifest, encoder, model=model)
        opened.spaces[manifest.calibration.path] = space
    if space.spec != manifest.calibration:
        space = SearchSpace(space.calibrator, manifest.calibration, space.encoder)
    offsets = np.concatenate([[0], np.cumsum([s.n_rows for s in manifest.segments])])
    with opened.lock:
        n_documents = live_documents(root, manifest, opened.documents)
    return Version(root, manifest, space, [], offsets.astype(np.int64), [], checked, None,
                   n_documents)  # fmt: skip
