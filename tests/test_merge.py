"""Merging segments (flowsearch.writes.merge): the size-tiered policy, the bound writes keep,
compact's merges, and a merged segment equal to its inputs' live rows."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from corpus_helpers import write_corpus
from segment_helpers import build, texts_for, unit

from flowsearch.ann.policy import AnnPolicy
from flowsearch.errors import BadInput
from flowsearch.lexical.postings import Postings
from flowsearch.storage import manifest as mf
from flowsearch.storage.keys import KeyIndex
from flowsearch.storage.rows import RowReader
from flowsearch.storage.writer import open_writer
from flowsearch.writes.compact import compact
from flowsearch.writes.merge import MergePolicy, merge, plan_merges, tier_of, tiers


def _segments(*sizes: int | tuple[int, int]) -> list[mf.SegmentRecord]:
    """Records of segments with these live sizes (``(n_rows, n_deleted)`` for deleted rows)."""
    out = []
    for at, size in enumerate(sizes, 1):
        n_rows, n_deleted = size if isinstance(size, tuple) else (size, 0)
        out.append(
            mf.SegmentRecord(
                name=f"s{at:06d}",
                dir=f"segments/s{at:06d}",
                n_rows=n_rows,
                n_deleted=n_deleted,
                ann=mf.AnnRecord(path="ann.faiss", factory="Flat"),
            )
        )
    return out


@pytest.fixture()
def small_tiers():
    """Tiers of 10x from 10 rows, three segments to a tier."""
    return MergePolicy(floor_segment_rows=10, merge_factor=10, segments_per_tier=3)


def test_tiers_by_live_size(small_tiers):
    assert [tier_of(n, small_tiers) for n in (0, 9, 10, 99, 100, 999, 1_001, 50_000)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
        4,
    ]
    assert tiers([5, 150, 9, 12, 0, 99], small_tiers) == [[0, 2, 4], [3, 5], [1]]
    assert tiers([], small_tiers) == []
    default = MergePolicy(floor_segment_rows=10_000, merge_factor=10)
    assert tiers([5, 6, 7, 50_000], default) == [[0, 1, 2], [3]]  # the module's example


def test_a_segment_at_a_tier_boundary_is_in_the_upper_tier(small_tiers):
    assert [tier_of(n, small_tiers) for n in (10, 100, 1_000, 10_000, 100_000)] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("sizes", "want"),
    [
        ((5, 6, 7), [[1, 2, 3]]),  # a full tier merges
        ((5, 6), []),  # not yet
        ((8, 5, 7, 6), [[2, 3, 4]]),  # the three smallest of a tier, in row order
        ((5, 50, 6, 60, 7, 70), [[1, 3, 5], [2, 4, 6]]),  # two tiers, each full
        ((5, 6, 50, 60), []),  # two tiers, neither full
        (((100, 95), 6, 7), [[1, 2, 3]]),  # live rows decide the tier: 100 rows, 95 deleted
        ((5, 6, 7, 500, 600, 700), [[1, 2, 3], [4, 5, 6]]),
    ],
)
def test_which_segments_a_full_tier_merges(small_tiers, sizes, want):
    segments = _segments(*sizes)
    assert plan_merges(segments, small_tiers, max_rows=None) == [
        [f"s{i:06d}" for i in g] for g in want
    ]


def test_writes_merge_only_tiers_under_their_bound(small_tiers):
    segments = _segments(5, 6, 7, 500, 600, 700)
    assert plan_merges(segments, small_tiers, max_rows=18) == [["s000001", "s000002", "s000003"]]
    assert plan_merges(segments, small_tiers, max_rows=17) == []  # 5 + 6 + 7 rows exceed it
    assert len(plan_merges(segments, small_tiers, max_rows=None)) == 2  # compact: no bound


def test_segments_with_many_deleted_rows_are_rewritten_alone(small_tiers):
    segments = _segments((40, 30), (40, 10), 5, 6, 7)
    assert plan_merges(segments, small_tiers, max_rows=None, deleted_share=0.5) == [
        ["s000003", "s000004", "s000005"],
        ["s000001"],  # 30 of 40 deleted (live 10: tier 1, alone there)
    ]
    assert plan_merges(segments, small_tiers, max_rows=None, deleted_share=0.2) == [
        ["s000003", "s000004", "s000005"],
        ["s000001"],
        ["s000002"],
    ]


@pytest.fixture()
def flat_budget():
    """Tiers of 10x from 10 rows, ten segments to a tier; segments of up to 20 rows are Flat
    and at most two of them stay apart."""
    return MergePolicy(floor_segment_rows=10, merge_factor=10, segments_per_tier=10,
                       flat_segments_max=2)  # fmt: skip


#: Segments of up to this many live rows are Flat (the AnnPolicy's ``flat_max_rows``).
FLAT = 20


@pytest.mark.parametrize(
    ("sizes", "want"),
    [
        ((500, 5, 6), []),  # two small segments: within the budget
        ((500, 5, 6, 7), [[2, 3, 4]]),  # a third: all the small ones merge into one
        ((500, 5, 30, 6, 20, 7), [[2, 4, 5, 6]]),  # up to flat_max_rows live rows is small
        ((500, (40, 35), 6, 7), [[2, 3, 4]]),  # live rows decide: 40 rows, 35 deleted
        ((5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]),
    ],
)
def test_small_segments_past_the_flat_budget_merge_into_one(flat_budget, sizes, want):
    segments = _segments(*sizes)
    assert plan_merges(segments, flat_budget, max_rows=None, flat_max_rows=FLAT) == [
        [f"s{i:06d}" for i in g] for g in want
    ]


def test_the_flat_budget_leaves_segments_a_tier_merge_takes(flat_budget):
    # tier 1 (10-99 rows) is full with ten segments: the tier's merge takes its ten smallest
    # (11-20); the small ones left (5, 6, 7) are three, over the budget of two: merged too
    sizes = (500, 5, 6, 7, *range(11, 21), 21)
    plans = plan_merges(_segments(*sizes), flat_budget, max_rows=None, flat_max_rows=FLAT)
    assert plans == [[f"s{i:06d}" for i in range(5, 15)], ["s000002", "s000003", "s000004"]]
    roomier = MergePolicy(floor_segment_rows=10, segments_per_tier=10, flat_segments_max=3)
    assert plan_merges(_segments(*sizes), roomier, max_rows=None, flat_max_rows=FLAT) == plans[:1]


def test_a_write_merges_the_small_segments_only_within_its_bound(flat_budget):
    segments = _segments(500, 5, 6, 7)
    assert plan_merges(segments, flat_budget, max_rows=18, flat_max_rows=FLAT) == [
        ["s000002", "s000003", "s000004"]
    ]
    assert (
        plan_merges(segments, flat_budget, max_rows=17, flat_max_rows=FLAT) == []
    )  # 5 + 6 + 7 rows exceed it
    assert (
        plan_merges(segments, flat_budget, max_rows=None, flat_max_rows=FLAT) != []
    )  # compact: no bound
    none = MergePolicy(floor_segment_rows=10, segments_per_tier=10, flat_segments_max=0)
    # 0 keeps one small segment, never merges one alone
    assert plan_merges(_segments(500, 5), none, max_rows=None, flat_max_rows=FLAT) == []
    assert plan_merges(_segments(500, 5, 6), none, max_rows=None, flat_max_rows=FLAT) == [
        ["s000002", "s000003"]
    ]


def _live_rows(root, manifest, names):
    """The live rows of the named segments, in order: (table of id/text/meta, vector, raw)."""
    tables, vectors, raws = [], [], []
    for seg in manifest.segments:
        if seg.name not in names:
            continue
        folder = root / seg.dir
        reader = RowReader(folder, seg.parts)
        keep = np.ones(seg.n_rows, bool)
        if seg.deletions:
            from flowsearch.storage import deletions

            keep = ~deletions.read(folder / seg.deletions, seg.n_rows)
        tables.append(reader.table().filter(pa.array(keep)))
        vectors.append(reader.vectors("vector")[keep])
        raws.append(reader.vectors("raw")[keep])
        reader.close()
    return tables, np.concatenate(vectors), np.concatenate(raws)


def test_a_merged_segment_holds_exactly_its_inputs_live_rows(tmp_path):
    root = tmp_path / "idx"
    metas = [
        pa.table({"year": pa.array([2001, 2002, 2003, 2004], pa.int32())}),
        None,  # a segment written before the column existed
        pa.table({"year": pa.array([None, 2007], pa.int32())}),
    ]
    base = build(
        root,
        [["a", "b", "c", "d"], ["e", "f", "g"], ["h", "i"]],
        metas=metas,
        metadata=pa.schema([("year", pa.int32())]),
    )
    names = [s.name for s in base.segments]
    with open_writer(root) as writer:
        writer.delete_rows(names[0], np.array([1, 3]))
        writer.delete_rows(names[1], np.array([0]))
        writer.publish(kind="delete", n_rows=3)
    before = mf.read(root)
    tables, vectors, raws = _live_rows(root, before, names[:2] + names[2:])
    with open_writer(root) as writer:
        record = merge(writer, names, dim=before.dim, requested="Flat", lexical=True,
                       schema=before.schema_)  # fmt: skip
        after = writer.publish(kind="compact", n_rows=record.n_rows)
    assert [s.name for s in after.segments] == [record.name] and record.name not in names
    assert (record.n_rows, record.n_deleted, record.deletions) == (6, 0, None)
    reader = RowReader(root / record.dir, record.parts)
    got = reader.table()
    assert got.column("id").to_pylist() == ["a", "c", "f", "g", "h", "i"]
    assert got.column("year").to_pylist() == [2001, 2003, None, None, None, 2007]
    want_texts = [t for table in tables for t in table.column("text").to_pylist()]
    assert got.column("text").to_pylist() == want_texts
    np.testing.assert_array_equal(reader.vectors("vector"), vectors)  # copied, not recomputed
    np.testing.assert_array_equal(reader.vectors("raw"), raws)
    merged = Postings.load(root / record.dir / record.postings)
    rebuilt = Postings.build(want_texts)  # merged without re-tokenising, equal to a rebuild
    assert merged.vocab == rebuilt.vocab
    for name in ("indptr", "rows", "tf", "lengths"):
        np.testing.assert_array_equal(getattr(merged, name), getattr(rebuilt, name))
    keys = KeyIndex.load(root / record.dir, record.n_rows)
    assert sorted(keys.lookup(pa.array(["i", "b", "a"]))) == [(0, 5), (2, 0)]
    from flowsearch.ann import io as ann_io

    ann = ann_io.read_index(root / record.dir / record.ann.path)
    assert ann.ntotal == 6
    scores, rows = ann_io.search(ann, vectors, 1)  # each row finds itself
    assert rows[:, 0].tolist() == list(range(6))
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)


def test_merging_only_dead_rows_drops_the_segments(tmp_path):
    root = tmp_path / "idx"
    base = build(root, [["a", "b"], ["c"]])
    first, second = (s.name for s in base.segments)
    with open_writer(root) as writer:
        writer.delete_rows(first, np.array([0, 1]))
        assert merge(writer, [first], dim=base.dim, requested="Flat", lexical=True,
                     schema=()) is None  # fmt: skip
        assert [s.name for s in writer.segments] == [second]
        writer.publish(kind="compact", n_rows=0)
    m = mf.read(root)
    assert [s.name for s in m.segments] == [second] and (m.n_rows, m.n_live) == (1, 1)


def test_compact_merges_full_tiers_rewrites_deleted_rows_and_full_merges_all(tmp_path):
    root = tmp_path / "idx"
    sizes = [3, 4, 5, 40, 2]
    ids = [[f"r{n}-{i}" for i in range(size)] for n, size in enumerate(sizes)]
    base = build(root, ids)
    with open_writer(root) as writer:
        writer.delete_rows(base.segments[3].name, np.array([0, 1]))
        writer.publish(kind="delete", n_rows=2)
    everything = sorted(i for group in ids for i in group if i not in ("r3-0", "r3-1"))
    result = compact(
        root, merge=MergePolicy(floor_segment_rows=10, merge_factor=10, segments_per_tier=3)
    )
    m = mf.read(root)
    # the tier of 2-5 rows: its three smallest (2, 3, 4) merge; the 40-row one is rewritten
    # without its deleted rows; the 5-row one stays as it was
    assert result.n_merged == 4 and result.n_dropped == 2 and result.version == 3
    assert [s.n_rows for s in m.segments] == [5, 9, 38]
    assert m.segments[0].name == base.segments[2].name and m.n_deleted == 0
    assert result.bytes_freed > 0
    assert _ids(root, m) == everything
    assert compact(root).version == 3  # nothing to do: no version written
    full = compact(root, full=True)
    m = mf.read(root)
    assert full.n_merged == 3 and len(m.segments) == 1 and m.n_rows == 52
    assert _ids(root, m) == everything
    assert compact(root, full=True).version == full.version  # one segment already


def _ids(root, manifest):
    out = []
    for seg in manifest.segments:
        reader = RowReader(root / seg.dir, seg.parts)
        out += [i for chunk in reader.column_chunks("id") for i in chunk]
        reader.close()
    return sorted(out)


def test_writes_run_the_policy_within_their_bound(tmp_path, model_dir):
    """Upserts add small segments; the third in a tier merges them when the merge stays under
    ``write_merge_max_rows``; otherwise only compact merges them."""
    from flowsearch import build_index, upsert

    built = tmp_path / "built"
    corpus = write_corpus(tmp_path / "c.parquet", n=20)
    build_index(corpus, built, model=str(model_dir), calibration="none", lexical=False)
    for bound, merged in ((1_000, 3), (10, 0)):
        root = Path(shutil.copytree(built, tmp_path / f"idx-{bound}"))
        policy = MergePolicy(floor_segment_rows=100, segments_per_tier=3,
                             write_merge_max_rows=bound)  # fmt: skip
        upsert(root, [{"id": "n1", "text": "the new cat", "topic": "x", "year": 2001}],
               merge=policy)  # fmt: skip
        result = upsert(root, [{"id": "d3", "text": "the red sea", "topic": "y", "year": 1}],
                        merge=policy)  # fmt: skip
        m = mf.read(root)
        assert result.n_merged == merged and result.n_replaced == 1
        assert len(m.segments) == (1 if merged else 3)
        assert m.n_live == 21 and m.n_deleted == (0 if merged else 1)
        if not merged:
            assert compact(root, merge=policy).n_merged == 3
            assert len(mf.read(root).segments) == 1
        assert mf.read(root).n_live == 21


def test_recalibrate_rewrites_every_segment_from_the_raw_vectors(tmp_path):
    """recalibrate keeps one segment per old one (merge tiers stay) and drops deleted rows."""
    from flowsearch.writes.compact import recalibrate

    root = tmp_path / "idx"
    base = build(root, [["a", "b", "c"], ["d", "e"]], seeds=[3, 4])
    with open_writer(root) as writer:
        writer.delete_rows(base.segments[0].name, np.array([1]))
        writer.publish(kind="delete", n_rows=1)
    result = recalibrate(root, calibration="none")
    m = mf.read(root)
    assert result.kind == "recalibrate" and [s.n_rows for s in m.segments] == [2, 2]
    assert m.n_deleted == 0 and m.calibration.path != base.calibration.path
    tables, vectors, raws = _live_rows(root, m, {s.name for s in m.segments})
    assert [t for table in tables for t in table.column("id").to_pylist()] == ["a", "c", "d", "e"]
    want = np.concatenate([unit(3, seed=3)[[0, 2]], unit(2, seed=4)])
    np.testing.assert_allclose(vectors, want, atol=2e-3)  # none: the raw vectors, normalised
    np.testing.assert_array_equal(raws, want.astype(np.float16).astype(np.float32))
    assert texts_for(["a"])[0] == tables[0].column("text")[0].as_py()


def test_a_write_past_the_flat_budget_merges_the_small_segments_into_a_graph(tmp_path, model_dir):
    """Upserts of small segments: once more of them than ``flat_segments_max`` would be left,
    the write merges them into one, which gets a graph when it passes ``flat_max_rows``;
    a bound under their rows leaves them to compact."""
    from flowsearch import build_index, upsert

    built = tmp_path / "built"
    corpus = write_corpus(tmp_path / "c.parquet", n=20)
    build_index(corpus, built, model=str(model_dir), calibration="none", lexical=False)

    def rows(first):
        return [{"id": f"n{i}", "text": f"a new row {i}"} for i in range(first, first + 3)]

    for bound, merged in ((1_000, 2), (5, 0)):
        root = Path(shutil.copytree(built, tmp_path / f"idx-{bound}"))
        policies = {
            "ann": AnnPolicy(flat_max_rows=5),
            "merge": MergePolicy(
                flat_segments_max=1, floor_segment_rows=100, write_merge_max_rows=bound
            ),  # fmt: skip
        }
        upsert(root, rows(0), **policies)  # one small segment: within the budget
        assert [s.ann.factory for s in mf.read(root).segments] == ["Flat", "Flat"]
        result = upsert(root, rows(3), **policies)  # a second: 3 + 3 rows, merged if bounded
        m = mf.read(root)
        assert result.n_merged == merged and m.n_live == 26
        if merged:
            assert [(s.n_rows, s.ann.factory) for s in m.segments] == [
                (20, "Flat"), (6, "HNSW32")]  # fmt: skip
        else:
            assert [s.n_rows for s in m.segments] == [20, 3, 3]
            assert compact(root, **policies).n_merged == 2  # compact merges them (no bound)
            assert [s.ann.factory for s in mf.read(root).segments] == ["Flat", "HNSW32"]
        assert _ids(root, mf.read(root)) == sorted(
            [*(f"d{i}" for i in range(20)), *(f"n{i}" for i in range(6))]
        )


@pytest.mark.parametrize(
    ("field", "value"),
    [("segments_per_tier", 1), ("merge_factor", 1), ("floor_segment_rows", 0),
     ("write_merge_max_rows", -1), ("flat_segments_max", 2.0), ("segments_per_tier", True)],
)  # fmt: skip
def test_a_bad_merge_policy_is_refused_in_one_line(field, value):
    with pytest.raises(BadInput) as err:
        MergePolicy(**{field: value})
    assert f"MergePolicy.{field} must be an integer of at least" in str(err.value)
    assert "\n" not in str(err.value) and err.value.param == field


def test_a_write_refuses_a_policy_of_the_wrong_kind(tmp_path):
    root = tmp_path / "idx"
    build(root, [["a", "b"]])
    with pytest.raises(BadInput, match="merge must be a MergePolicy"):
        compact(root, merge={"segments_per_tier": 2})  # type: ignore[arg-type]
    with pytest.raises(BadInput, match="ann must be an AnnPolicy"):
        compact(root, ann=MergePolicy())  # type: ignore[arg-type]
