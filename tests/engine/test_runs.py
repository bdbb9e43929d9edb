"""Sorted runs and the merge plan (engine/tasks/runs.py, engine/shuffle_plan.py): whatever the merge tree,
a reader of a key range gets the rows every writer wrote for it, in the same order (key, writer, row)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datapipe.engine import shuffle_plan as plan
from datapipe.engine.tasks import runs


def _writer(rng: np.random.Generator, w: int, keys: int, n: int) -> pa.Table:
    part = rng.integers(0, keys, n).astype(np.int32)
    return pa.table({"part": part, "writer": np.full(n, w, np.int32), "row": np.arange(n, dtype=np.int64)})


def _expected(tables: list[pa.Table], lo: int, hi: int) -> list[tuple[int, int, int]]:
    """Every writer's rows with lo <= part < hi, ordered by part, then writer, then the writer's row order."""
    rows = [(p, w, r) for t in tables for p, w, r in zip(*(t[c].to_pylist() for c in ("part", "writer", "row"))) if lo <= p < hi]
    return sorted(rows)  # a writer's rows of one part keep its order: row numbers grow within a writer


def _got(t: pa.Table | None) -> list[tuple[int, int, int]]:
    assert t is not None
    return list(zip(*(t[c].to_pylist() for c in ("part", "writer", "row"))))


def test_a_run_is_sorted_by_key_in_row_groups_by_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "RUN_GROUP_BYTES", 4096)
    t = _writer(np.random.default_rng(1), 0, 50, 5000)
    assert runs.write_run(tmp_path / "r.parquet", t, "part") == 5000
    f = pq.ParquetFile(tmp_path / "r.parquet")
    assert f.metadata.num_row_groups == -(-5000 // runs.MIN_GROUP_ROWS)  # 16 bytes a row: the smallest groups
    back = f.read()
    assert back["part"].to_pylist() == sorted(t["part"].to_pylist())
    # Rows of one key keep the writer's order: a stable sort.
    assert _got(back) == _expected([t], 0, 50)
    assert runs.write_run(tmp_path / "r.parquet", t.slice(0, 0), "part") == 0
    assert not (tmp_path / "r.parquet").exists()  # nothing to write: a stale run of an earlier attempt goes


def test_a_range_reads_only_the_row_groups_holding_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "MIN_GROUP_ROWS", 100)
    monkeypatch.setattr(runs, "RUN_GROUP_BYTES", 1600)
    t = _writer(np.random.default_rng(2), 0, 1000, 10_000)
    runs.write_run(tmp_path / "r.parquet", t, "part")
    f = pq.ParquetFile(tmp_path / "r.parquet")
    groups = runs.groups_in(f, "part", 500, 510)
    assert 1 <= len(groups) <= 2 and groups == list(range(groups[0], groups[-1] + 1))
    assert _got(runs.read_range([f], "part", 500, 510)) == _expected([t], 500, 510)


@pytest.mark.parametrize(("writers", "fan_in", "reader_files"), [(9, 2, 1), (12, 3, 2), (5, 8, 8), (30, 4, 3)])
def test_merging_in_any_tree_gives_readers_the_rows_of_every_writer_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writers: int, fan_in: int, reader_files: int
) -> None:
    monkeypatch.setattr(runs, "MIN_GROUP_ROWS", 64)
    monkeypatch.setattr(runs, "RUN_GROUP_BYTES", 2048)
    monkeypatch.setattr(runs, "MIN_READ_ROWS", 4)
    monkeypatch.setattr(runs, "MERGE_MEMORY_BYTES", 2048)  # a few rows of each input at a time
    keys = 40
    rng = np.random.default_rng(writers)
    tables = [_writer(rng, w, keys, int(rng.integers(0, 400))) for w in range(writers)]
    files: list[plan.RunFile | None] = []
    for w, t in enumerate(tables):
        path = tmp_path / "w" / f"{w}.parquet"
        n = runs.write_run(path, t, "part")
        files.append(plan.RunFile(str(path), n, 0, keys) if n else None)
    total = sum(t.nbytes for t in tables)
    grid = plan.writers_grid(files, keys)
    shapes = plan.levels(writers, keys, total, fan_in, total // 7, reader_files)
    assert bool(shapes) == (writers > reader_files)  # a reader opens every writer when it may
    for number, level in enumerate(shapes, 1):
        tasks, kept = plan.level_tasks(grid, level, number, fan_in)
        outputs: dict[str, plan.RunFile | None] = {}
        for task in tasks:
            assert len(task.inputs) <= fan_in
            out = tmp_path / f"l{number}" / f"{task.key}.parquet"
            n = runs.merge_range([pq.ParquetFile(f.path) for f in task.inputs], "part", task.lo, task.hi, out)
            outputs[task.key] = plan.RunFile(str(out), n, task.lo, task.hi) if n else None
        grid = plan.merged_grid(level, tasks, outputs, kept)
    assert grid.groups <= reader_files
    readers = plan.read_tasks(grid, 300)
    seen: list[tuple[int, int, int]] = []
    for reader in readers:
        assert len({f.path for f in reader.inputs}) <= reader_files
        got = runs.read_range([pq.ParquetFile(f.path) for f in reader.inputs], "part", reader.lo, reader.hi)
        assert _got(got) == _expected(tables, reader.lo, reader.hi)
        seen += _got(got)
    assert seen == _expected(tables, 0, keys)  # every row, once, readers in key order


def test_levels_are_logarithmic_in_the_writers_and_tasks_linear_in_the_bytes() -> None:
    # A crawl's MinHash band rows: 37,253 (10 TB) and 372,530 (100 TB) map tasks, ~27 bytes a row.
    for writers, total in ((37_253, 1.9e12), (372_530, 1.9e13)):
        shapes = plan.levels(writers, writers, int(total), 256, 256 << 20, 256)
        assert len(shapes) == (1 if writers < 256 * 256 else 2)
        for level in shapes:
            tasks = level.groups * len(level.ranges)
            assert total / (256 << 20) <= tasks <= 2 * total / (256 << 20) + level.groups
    assert plan.levels(64, 64, 10**6, 256, 256 << 20, 256) == []  # a small run reads its writers


def test_a_runs_bytes_per_row_do_not_grow_with_the_partitions(tmp_path: Path) -> None:
    """Bytes written per document are flat in the number of partitions (issue 48 item 7): a run's row
    groups are sized by bytes, not one per part, so the same rows keyed over 64 or 65,536 parts take the
    same bytes and row groups (a row group per part made exact dedup's shuffle files 1.30x at 16x)."""
    rng = np.random.default_rng(7)
    n = 200_000
    h = rng.integers(0, 2**63, n, dtype=np.int64)
    doc = rng.integers(0, 2**40, n, dtype=np.int64)  # ids as random as a hash's rows (none in sorted order)
    sizes, groups = [], []
    for parts in (64, 4096, 65_536):
        t = pa.table({"part": (h % parts).astype(np.int32), "hash": h, "doc": doc})
        path = tmp_path / f"{parts}.parquet"
        runs.write_run(path, t, "part")
        sizes.append(path.stat().st_size)
        groups.append(pq.ParquetFile(path).metadata.num_row_groups)
    assert len(set(groups)) == 1, groups
    assert max(sizes) <= 1.03 * min(sizes), sizes  # the key column: a few bits a row (delta-encoded, sorted)


def test_readers_are_cut_by_bytes_when_rows_are_wide() -> None:
    """A round of wide rows (MinHash's signatures) is cut by ``split.partition_bytes`` as well as rows:
    the same rows make more readers when their runs hold more bytes, never fewer than by rows."""
    keys = 64
    writers = [plan.RunFile(f"w{i}", 1000, 0, keys, bytes=b) for i, b in enumerate((600_000, 400_000))]
    grid = plan.writers_grid(writers, keys)
    assert len(plan.read_tasks(grid, 500)) == 4  # 2,000 rows / 500: bytes not counted
    assert len(plan.read_tasks(grid, 500, 1 << 30)) == 4  # narrow rows: still by rows
    wide = plan.read_tasks(grid, 500, 100_000)  # 1 MB of runs / 100 kB
    assert len(wide) == 10 and [(t.lo, t.hi) for t in wide][-1][1] == keys
    assert len(plan.read_tasks(grid, 500, 1)) == keys  # a part is never split


def test_a_merge_reads_fewer_rows_of_each_input_when_rows_are_wide(tmp_path: Path) -> None:
    n = 4096
    narrow = pa.table({"part": np.zeros(n, np.int32), "x": np.arange(n, dtype=np.int64)})
    sigs = np.random.default_rng(3).integers(0, 2**32, (n, 128), dtype=np.uint32)  # 512 bytes, as random as hashes
    wide = narrow.append_column("sig", pa.array([r.tobytes() for r in sigs], pa.binary(512)))
    files = {}
    for name, t in (("narrow", narrow), ("wide", wide)):
        runs.write_run(tmp_path / f"{name}.parquet", t, "part")
        files[name] = [pq.ParquetFile(tmp_path / f"{name}.parquet")] * 8
    # Decoded, not as stored: the part column (all 0) takes a few bits a row in the file, 4 bytes in Arrow.
    assert runs.decoded_row_bytes(files["narrow"][0]) == 12
    budget = 1 << 20
    per_read = {k: runs.read_rows(f, budget) for k, f in files.items()}
    assert per_read["wide"] * 20 < per_read["narrow"]
    assert per_read["wide"] * 520 * 2 * 8 <= budget * 1.1  # every input's two reads fit the budget


def test_a_spilling_writer_writes_the_run_of_every_row_added(tmp_path: Path) -> None:
    """A partition task's outputs, part by part: past its budget the writer spills sorted pieces and merges
    them, and the run holds what ``write_run`` of every row added writes (key, then order added)."""
    rng = np.random.default_rng(5)
    pieces = [_writer(rng, w, 40, int(rng.integers(1, 400))) for w in range(30)]
    whole = pa.concat_tables(pieces)
    runs.write_run(tmp_path / "whole.parquet", whole, "part")
    w = runs.SortedRunWriter(tmp_path / "out" / "r.parquet", "part", budget=4096, scratch=tmp_path / "scratch")
    for t in pieces:
        w.add(t)
    w.add(None)
    assert w._spills  # 16 bytes a row: the budget is past after a few pieces
    assert w.close() == whole.num_rows
    assert pq.read_table(tmp_path / "out" / "r.parquet").equals(pq.read_table(tmp_path / "whole.parquet"))
    assert not list((tmp_path / "scratch").iterdir())  # spills removed: never a task's output
    # Nothing added: no run (a stale one of an earlier attempt is removed).
    assert runs.SortedRunWriter(tmp_path / "out" / "r.parquet", "part", 4096, tmp_path / "scratch").close() == 0
    assert not (tmp_path / "out" / "r.parquet").exists()


def test_a_partition_reads_its_parts_one_at_a_time_in_read_range_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "MIN_GROUP_ROWS", 100)
    monkeypatch.setattr(runs, "RUN_GROUP_BYTES", 1600)
    monkeypatch.setattr(runs, "MIN_READ_ROWS", 16)
    rng = np.random.default_rng(6)
    tables = [_writer(rng, w, 60, 3000) for w in range(7)]
    files = []
    for w, t in enumerate(tables):
        runs.write_run(tmp_path / f"{w}.parquet", t, "part")
        files.append(pq.ParquetFile(tmp_path / f"{w}.parquet"))
    whole = runs.read_range(files, "part", 10, 50)
    assert whole is not None
    want = [(k, _got(t)) for k, t in runs.iter_keys(whole, "part")]
    got = [(k, _got(t)) for k, t in runs.iter_parts(files, "part", 10, 50, budget=4096)]
    assert got == want and len(got) == 40
