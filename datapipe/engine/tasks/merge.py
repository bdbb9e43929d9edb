"""Merging a shuffle round's input files into a few, so a partition opens a few files, not all of them.

A shuffle round's inputs are one file per writer (a map task's shuffle rows in round 0, a
partition's forwarded rows after it), each sorted by ``part`` with a row group per part. Read
as they are, every partition opens every writer's file: writers x partitions opens, which grows
with the square of the corpus when both grow with it (bench/scaling/shuffle_files.py). With more writers
than ``split.shuffle_groups`` (G), G merge tasks each combine a contiguous group of the writers'
files into one, again sorted by ``part`` with a row group per part, and each partition reads its
row groups from the G merged files: writers + G x partitions opens, flat per document.

A merged file holds each part's rows in writer order, then row order, so reading the G merged
files in group order gives a partition exactly the rows, in the order, that reading every
writer's file did. A merge task streams: it reads the row groups of a range of parts from each of
its files at a time (about ``CHUNK_BYTES`` of them), so its memory does not grow with the group.

A merge task's output is split by key: one file per ``KEYS_PER_FILE`` contiguous parts (or shards, for
the decisions below), so a reader opens only the file of its own key in each group and parses a
footer of at most ``KEYS_PER_FILE`` row groups, not one that grows with the partitions (every reader
parsed the whole footer of a file holding a row group per key, a cost that grew with the
partitions: docs/scaling.md). A reader still opens one file per group, so the files opened per
document do not change; with as many keys as ``KEYS_PER_FILE`` or fewer a task writes one file, under
the name it always had.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datapipe.engine.plan import RunSpec, Segment, build_stage
from datapipe.engine.work_files import OUTPUT_KINDS, WorkFiles
from datapipe.run_folder.layout import RunFolder
from datapipe.stages.global_stage import PartitionStep, step_of
from datapipe.storage.atomic import atomic_path

CHUNK_BYTES = 64 << 20  # uncompressed row-group bytes a merge task holds at a time
# Keys (parts or shards) a merged file holds at most: the footer every reader of the file parses.
# Smaller means more files written (a merge task writes keys / KEYS_PER_FILE of them); larger, more
# footer per reader (each row group of it costs the reader CPU).
KEYS_PER_FILE = 128


def key_files(keys: int) -> int:
    """Files a merge task's output over ``keys`` contiguous keys is split into."""
    return max(1, -(-keys // KEYS_PER_FILE))


def key_file(offset: int, keys: int) -> int | None:
    """The file of the key ``offset`` keys after the first of a merge task's ``keys`` (None: one file,
    named as unsplit)."""
    return offset // KEYS_PER_FILE if key_files(keys) > 1 else None


def merge_groups(spec: RunSpec, writers: int) -> int:
    """Merged files of a round with ``writers`` input files (0: none, the partitions read the inputs)."""
    groups = spec.shuffle_groups
    return groups if 0 < groups < writers else 0


def round_writers(spec: RunSpec, segment: Segment, round: int) -> int:
    """Input files a shuffle round reads at most: map tasks (round 0) or the partitions before."""
    if round == 0:
        return len(spec.shards)
    step = step_of(build_stage(spec, segment.compute_global), PartitionStep)  # type: ignore[arg-type]
    assert step is not None
    return step.partitions


def round_parts(spec: RunSpec, segment: Segment) -> int:
    """The parts (partitions) a shuffle round's rows go to: the keys of its merged files."""
    step = step_of(build_stage(spec, segment.compute_global), PartitionStep)  # type: ignore[arg-type]
    assert step is not None
    return step.partitions


def round_inputs(
    spec: RunSpec,
    folder: RunFolder,
    segment: Segment,
    round: int,
    writers: range | None = None,
    fetch: bool = True,
    part: int | None = None,
) -> list[Path]:
    """The input files of a shuffle round that exist (of ``writers`` only, if given), in writer order;
    merged ones where the round is merged (``writers`` then does not apply): of each group the file
    holding ``part`` if given, else all of them. ``fetch=False``: not downloaded from a remote run
    folder (a partition reads its row groups in place: ``RunFolder.parquet``)."""
    work = WorkFiles(folder)
    groups = merge_groups(spec, round_writers(spec, segment, round))
    if groups and writers is None:
        parts = round_parts(spec, segment)
        cuts: Sequence[int | None] = (
            [key_file(part, parts)] if part is not None else [key_file(k * KEYS_PER_FILE, parts) for k in range(key_files(parts))]
        )
        paths = [work.merged_file(segment.index, round, g, fetch, rng=k) for g in range(groups) for k in cuts]
    else:
        chosen = writers if writers is not None else range(round_writers(spec, segment, round))
        if round == 0:
            paths = [work.shuffle_file(segment.index, spec.shards[i].key, fetch) for i in chosen]
        else:
            paths = [work.forward_file(segment.index, round - 1, p, fetch) for p in chosen]
    return [p for p in paths if (p.exists() if fetch else folder.is_committed(p))]


def group_writers(writers: int, groups: int, group: int) -> range:
    """The writers (contiguous, in order) of one group."""
    size = -(-writers // groups)
    return range(min(writers, group * size), min(writers, (group + 1) * size))


def merge_group(spec: RunSpec, segment: Segment, round: int, group: int) -> dict[str, Any]:
    """Merge one group of a shuffle round's input files into its merged file; returns the marker contents."""
    started = time.perf_counter()
    folder = RunFolder(Path(spec.root))
    work = WorkFiles(folder)
    writers = round_writers(spec, segment, round)
    groups = merge_groups(spec, writers)
    files = round_inputs(spec, folder, segment, round, group_writers(writers, groups, group))
    parts = round_parts(spec, segment)
    rows = merge_files(
        files, lambda k: work.merged_file(segment.index, round, group, rng=key_file(k * KEYS_PER_FILE, parts)), key_files(parts)
    )
    return {
        "segment": segment.index,
        "round": round,
        "group": group,
        "files": len(files),
        "rows": rows,
        "seconds": round_(time.perf_counter() - started),
    }


def merge_files(paths: list[Path], out: Path | Callable[[int], Path], files: int = 1) -> int:
    """Rows of ``paths`` (each sorted by ``part``, a row group per part) into ``out``, sorted by part,
    writer order kept inside a part, a row group per part; ``out(k)``: the file of parts ``k x
    KEYS_PER_FILE`` on, for ``files`` files. Returns the rows written (0: no file)."""
    sources = [pq.ParquetFile(p) for p in paths]
    # (part, file, row group, bytes) of every row group; a row group holds one part (ShuffleSink).
    groups: list[tuple[int, int, int, int]] = []
    for i, f in enumerate(sources):
        col = f.schema_arrow.get_field_index("part")
        for rg in range(f.metadata.num_row_groups):
            meta = f.metadata.row_group(rg)
            stats = meta.column(col).statistics
            assert stats is not None and stats.min == stats.max, f"{paths[i]}: a row group of several parts"
            groups.append((int(stats.min), i, rg, meta.total_byte_size))
    name = _outputs(out, files)
    written = 0
    with _key_files(name, files, sources[0].schema_arrow if sources else None) as write:
        groups.sort()  # by part, then file (writer order), then row group: the order a reader needs
        start = 0
        while start < len(groups):
            # A chunk of whole parts of about CHUNK_BYTES, in one output file.
            k = _file_of(groups[start][0], files)
            end, size = start, 0
            while (
                end < len(groups)
                and _file_of(groups[end][0], files) == k
                and (size < CHUNK_BYTES or groups[end][0] == groups[end - 1][0])
            ):
                size += groups[end][3]
                end += 1
            written += _write_chunk(sources, groups[start:end], k, write)
            start = end
    for f in sources:
        f.close()
    return written


def _file_of(key: int, files: int, first: int = 0) -> int:
    return (key - first) // KEYS_PER_FILE if files > 1 else 0


def _outputs(out: Path | Callable[[int], Path], files: int) -> Callable[[int], Path]:
    if isinstance(out, Path):
        assert files == 1, "one path for several files"
        return lambda _: out
    return out


@contextlib.contextmanager
def _key_files(out: Callable[[int], Path], files: int, schema: pa.Schema | None) -> Iterator[Callable[[int, pa.Table], None]]:
    """``write(k, table)``: append ``table`` to output file ``k`` (ascending ``k``; each written
    atomically when the next one starts or the task ends). Files not written are removed: a stale
    file of an earlier attempt must not be read."""
    done: set[int] = set()
    current: list[tuple[int, contextlib.ExitStack, pq.ParquetWriter]] = []

    def write(k: int, table: pa.Table) -> None:
        if current and current[0][0] != k:
            current.pop()[1].close()
        if not current:
            assert k not in done, "output files are written in key order"
            stack = contextlib.ExitStack()
            tmp = stack.enter_context(atomic_path(out(k)))
            current.append(
                (k, stack, stack.enter_context(pq.ParquetWriter(tmp, schema, compression="zstd", write_page_checksum=True)))
            )
            done.add(k)
        current[0][2].write_table(table)

    try:
        yield write
    except BaseException:
        if current:
            current.pop()[1].__exit__(*sys.exc_info())  # the temporary file goes
        raise
    if current:
        current.pop()[1].close()
    for k in range(files):
        if k not in done:
            out(k).unlink(missing_ok=True)


def _write_chunk(
    sources: list[pq.ParquetFile], chunk: list[tuple[int, int, int, int]], k: int, write: Callable[[int, pa.Table], None]
) -> int:
    schema = sources[0].schema_arrow
    tables = [sources[i].read_row_group(rg).cast(schema) for _, i, rg, _ in chunk]
    parts = np.array([part for part, _, _, _ in chunk])
    bounds = np.flatnonzero(np.diff(parts)) + 1
    rows = 0
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(parts)]):
        table = pa.concat_tables(tables[lo:hi])
        write(k, table)
        rows += table.num_rows
    return rows


def round_(x: float) -> float:
    return round(x, 3)


def merge_round(spec: RunSpec, segment: Segment, round: int) -> int:
    """Every merge task of a round, one after another in this process (what its merge phase runs on
    Ray): for callers that drive a global stage's rounds themselves (tests, benches). Returns the groups."""
    groups = merge_groups(spec, round_writers(spec, segment, round))
    for g in range(groups):
        merge_group(spec, segment, round, g)
    return groups


# --- the partition outputs the next map tasks read ---------------------------------------------
#
# A deciding partition step's outputs (decisions, states for ``GlobalStage.apply`` and the copies for
# their survivors' map tasks, engine/tasks/copies.py) are read by
# every map task of the next segment, each taking its shard's rows: map tasks x partitions x rounds
# opens. With more partition outputs than ``split.shuffle_groups`` (G), they are merged after the
# last round: G groups of contiguous outputs (in the order readers list them: round, then partition),
# each cut into J = ``OUTPUT_RANGES`` ranges of shards, one merge task and one file per (group, range),
# sorted by shard with a row group per shard. A map task opens the G files of its shard's range. A
# single merge task per group held 1/G of the corpus: at crawl scale that one task ran long while
# the cluster idled (docs/scaling.md); with J ranges each holds 1/(G x J).
# J is fixed, not grown with the partitions: each of a group's J tasks opens every output file of
# the group, so the files opened are J x the outputs, flat per document only while J is (J =
# partitions / G, tried first, made them grow with the corpus). A file of a range holds only that
# range's shards' row groups, so the footer a map task parses is 1/J of what a whole group's file had.
OUTPUT_RANGES = 8


@dataclass(frozen=True)
class OutputMerge:
    """How a deciding step's partition outputs are merged: ``groups`` x ``ranges`` files (0 groups: not
    merged, read as written) over the run's ``shards`` map tasks."""

    groups: int
    ranges: int = 1
    shards: int = 1

    def __bool__(self) -> bool:
        return self.groups > 0

    @property
    def tasks(self) -> int:
        return self.groups * self.ranges

    def range_of(self, ordinal: int) -> int:
        """The range holding shard ``ordinal``."""
        return ordinal * self.ranges // self.shards

    def shards_of(self, rng: int) -> range:
        """The shard ordinals of range ``rng``: those whose ``range_of`` is ``rng``."""
        return range(-(-rng * self.shards // self.ranges), -(-(rng + 1) * self.shards // self.ranges))


def output_writers(spec: RunSpec, segment: Segment) -> list[tuple[int, int]]:
    """(round, partition) of every partition output a deciding step may write, in reading order."""
    step = step_of(build_stage(spec, segment.compute_global), PartitionStep)  # type: ignore[arg-type]
    assert step is not None
    return [(r, p) for r in range(step.rounds) for p in range(step.partitions)]


def output_groups(spec: RunSpec, segment: Segment) -> OutputMerge:
    """How the partition outputs of the step ending ``segment`` are merged (falsy: not merged; read as written)."""
    step = step_of(build_stage(spec, segment.compute_global), PartitionStep)  # type: ignore[arg-type]
    if step is None or not step.decides:
        return OutputMerge(0)
    groups = merge_groups(spec, step.rounds * step.partitions)
    if not groups:
        return OutputMerge(0)
    shards = max(1, len(spec.shards))
    return OutputMerge(groups, max(1, min(shards, OUTPUT_RANGES)), shards)


def output_bounds(weights: Sequence[float], groups: int) -> list[int]:
    """Cut the outputs (in reading order, ``weights[i]``: rows of output ``i``) into ``groups`` contiguous
    groups of about equal weight: the ``groups + 1`` boundaries. Contiguous, so reading the groups in
    order still gives each shard its rows in the unmerged order. Cutting by count instead (one group
    per 1/G of the planned outputs) put most rows in a few groups: a deciding step writes in a few of
    its rounds (MinHash: pairs of copies settle in round 9 of 56), so 11 of 256 groups held them all."""
    w = np.asarray(weights, dtype=float)
    before = np.r_[0.0, np.cumsum(w)[:-1]]  # the weight of the outputs before each one
    total = float(w.sum())
    if total <= 0:
        return [len(w) * g // groups for g in range(groups + 1)]
    # Group g starts at the first output with at least g/G of the weight before it.
    starts = np.searchsorted(before, total * np.arange(1, groups) / groups, side="left")
    return [0, *(int(x) for x in starts), len(w)]


def output_weights(spec: RunSpec, segment: Segment, markers: Callable[[int], dict[int, dict[str, Any]]]) -> list[float]:
    """Rows of every partition output (decisions, states and copies), in reading order, from the rounds'
    markers (``markers(round)``: partition -> marker; a round without tasks has none). A file costs a
    merge task more than its rows: each counts as ``FILE_ROWS`` rows more."""
    step = step_of(build_stage(spec, segment.compute_global), PartitionStep)  # type: ignore[arg-type]
    assert step is not None
    weights = []
    for r in range(step.rounds):
        done = markers(r)
        for p in range(step.partitions):
            m = done.get(p) or {}
            counts = [m.get("rows_out", 0), m.get("state_rows", 0), m.get("copies_rows", 0)]
            weights.append(float(sum(counts) + FILE_ROWS * sum(1 for c in counts if c)))
    return weights


FILE_ROWS = 2000  # a partition output file's fixed cost to a merge task (open, footer), in rows (bench/scaling/merge_task.py)


def merge_outputs(
    spec: RunSpec, segment: Segment, group: int, rng: int = 0, lo: int | None = None, hi: int | None = None
) -> dict[str, Any]:
    """Merge one range of shards of one group of the partition outputs, states and copies; returns the
    marker contents. ``lo``, ``hi``: the group's outputs (``output_bounds``; default: 1/G of them)."""
    started = time.perf_counter()
    folder = RunFolder(Path(spec.root))
    work = WorkFiles(folder)
    merge = output_groups(spec, segment)
    writers = output_writers(spec, segment)
    chosen = range(lo, hi) if lo is not None and hi is not None else group_writers(len(writers), merge.groups, group)
    mine = [writers[i] for i in chosen]
    shards = merge.shards_of(rng) if merge.ranges > 1 else range(merge.shards)
    rows = {}
    for kind in OUTPUT_KINDS:
        # Read in place (only the row groups of the range cross a store), not downloaded whole: the
        # J tasks of a group each read 1/J of its files.
        files = [f for r, p in mine if folder.is_committed(f := work.partition_file(kind, segment.index, p, r, fetch=False))]

        def out(k: int, kind: str = kind) -> Path:
            cut = key_file(k * KEYS_PER_FILE, len(shards))
            return work.merged_outputs(segment.index, group, kind, rng=_rng(merge, rng), cut=cut)

        rows["decision_rows" if kind == "decisions" else f"{kind}_rows"] = merge_by_shard(
            [folder.parquet(f) for f in files], out, shards if merge.ranges > 1 else None, key_files(len(shards))
        )
    return {
        "segment": segment.index,
        "group": group,
        **({"range": rng} if merge.ranges > 1 else {}),
        **({"outputs": [chosen.start, chosen.stop]} if lo is not None else {}),
        **rows,
        "seconds": round_(time.perf_counter() - started),
    }


def _rng(merge: OutputMerge, rng: int) -> int | None:
    return rng if merge.ranges > 1 else None


def merged_output_files(folder: RunFolder, segment: int, merge: OutputMerge, ordinal: int, kind: str) -> list[Path]:
    """The merged files of one ``kind`` (``OUTPUT_KINDS``) holding shard ``ordinal``'s rows, in reading order (group order)."""
    j = merge.range_of(ordinal)
    shards = merge.shards_of(j) if merge.ranges > 1 else range(merge.shards)
    cut = key_file(ordinal - shards.start, len(shards))
    work = WorkFiles(folder)
    return [work.merged_outputs(segment, g, kind, fetch=False, rng=_rng(merge, j), cut=cut) for g in range(merge.groups)]


def merge_by_shard(
    sources: list[pq.ParquetFile], out: Path | Callable[[int], Path], shards: range | None = None, files: int = 1
) -> int:
    """Rows of ``sources`` (each sorted by ``shard``; of ``shards`` only, if given) into ``out``, sorted
    by shard with the files' order kept inside a shard, a row group per shard; ``out(k)``: the file
    of shards ``k x KEYS_PER_FILE`` on from ``shards.start`` (``files`` of them). Streamed a range of
    shards at a time; a row group spanning several ranges is read once and kept until passed."""
    lo_all, hi_all = (shards.start, shards.stop) if shards is not None else (None, None)
    groups: list[tuple[int, int, int, int, int]] = []  # (min shard, max shard, file, row group, bytes)
    for i, f in enumerate(sources):
        col = f.schema_arrow.get_field_index("shard")
        for rg in range(f.metadata.num_row_groups):
            meta = f.metadata.row_group(rg)
            stats = meta.column(col).statistics
            if meta.num_rows:
                assert stats is not None and stats.has_min_max, "a partition output without shard statistics"
                mn, mx = int(stats.min), int(stats.max)
                if lo_all is not None and (mx < lo_all or mn >= hi_all):  # type: ignore[operator]
                    continue  # none of this range's shards
                groups.append((mn, mx, i, rg, meta.total_byte_size))
    name = _outputs(out, files)
    if not groups:
        with _key_files(name, files, None):
            return 0
    first = lo_all if lo_all is not None else 0
    # Ranges of shards holding about CHUNK_BYTES of row groups each (by where they start), cut where an
    # output file ends.
    by_start = sorted(groups)
    bounds, size = [by_start[0][0] if lo_all is None else max(lo_all, by_start[0][0])], 0
    for lo, _, _, _, nbytes in by_start:
        if size >= CHUNK_BYTES and lo > bounds[-1]:
            bounds.append(lo)
            size = 0
        size += nbytes
    end = max(g[1] for g in groups) + 1
    end = end if hi_all is None else min(end, hi_all)
    cuts = [first + k * KEYS_PER_FILE for k in range(1, files)] if files > 1 else []
    bounds = sorted({*bounds, *(c for c in cuts if bounds[0] < c < end), end})
    schema = sources[0].schema_arrow
    in_order = sorted(groups, key=lambda g: (g[2], g[3]))  # file order, then row group: the readers' order
    held: dict[tuple[int, int], tuple[pa.Table, np.ndarray]] = {}  # row groups read, by (file, row group)
    written = 0
    with _key_files(name, files, schema) as write:
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            pieces = []
            for mn, mx, i, rg, _ in in_order:
                if not (mn < hi and mx >= lo):
                    continue
                if (i, rg) not in held:
                    table = sources[i].read_row_group(rg).cast(schema)
                    held[i, rg] = table, table["shard"].to_numpy()
                table, shard = held[i, rg]
                if len(shard) < 2 or bool((shard[1:] >= shard[:-1]).all()):
                    # Sorted by shard (a partition output is): this range's rows are one slice.
                    a, b = np.searchsorted(shard, lo, "left"), np.searchsorted(shard, hi, "left")
                    if b > a:
                        pieces.append(table.slice(a, b - a))
                else:
                    pieces.append(table.filter(pa.array((shard >= lo) & (shard < hi))))
                if mx < hi:
                    del held[i, rg]  # passed: no later range holds its shards
            if not pieces:
                continue
            table = pa.concat_tables(pieces).sort_by([("shard", "ascending")])  # a stable sort
            shard = table["shard"].to_numpy()
            cut = np.flatnonzero(np.diff(shard)) + 1
            k = _file_of(lo, files, first)
            for a, b in zip(np.r_[0, cut], np.r_[cut, len(shard)]):
                write(k, table.slice(a, b - a))
            written += table.num_rows
    return written


def merge_all_outputs(spec: RunSpec, segment: Segment) -> OutputMerge:
    """Every output merge task of the step ending ``segment``, in this process (its ``merge<i>d`` phase):
    for callers that drive the rounds themselves, before the next map tasks. The groups are cut by
    the rows of the outputs, as the engine does from the rounds' markers (here: from the files).
    Returns how they merged."""
    merge = output_groups(spec, segment)
    if not merge:
        return merge
    work = WorkFiles(RunFolder(Path(spec.root)))

    def rows(r: int) -> dict[int, dict[str, Any]]:
        step = step_of(build_stage(spec, segment.compute_global), PartitionStep)  # type: ignore[arg-type]
        assert step is not None
        out: dict[int, dict[str, Any]] = {}
        for p in range(step.partitions):
            counts = {}
            for kind, key in zip(OUTPUT_KINDS, ("rows_out", "state_rows", "copies_rows"), strict=True):
                f = work.partition_file(kind, segment.index, p, r)
                counts[key] = pq.ParquetFile(f).metadata.num_rows if f.exists() else 0
            out[p] = counts
        return out

    bounds = output_bounds(output_weights(spec, segment, rows), merge.groups)
    for g in range(merge.groups):
        for j in range(merge.ranges):
            merge_outputs(spec, segment, g, j, bounds[g], bounds[g + 1])
    return merge
