"""Merging a shuffle round's input files into a few, so a partition opens a few files, not all of them.

A shuffle round's inputs are one file per writer (a map task's shuffle rows in round 0, a
partition's forwarded rows after it), each sorted by ``part`` with a row group per part. Read
as they are, every partition opens every writer's file: writers x partitions opens, which grows
with the square of the corpus when both grow with it (bench/shuffle_files.py). With more writers
than ``split.shuffle_groups`` (G), G merge tasks each combine a contiguous group of the writers'
files into one, again sorted by ``part`` with a row group per part, and each partition reads its
row groups from the G merged files: writers + G x partitions opens, flat per document.

A merged file holds each part's rows in writer order, then row order, so reading the G merged
files in group order gives a partition exactly the rows, in the order, that reading every
writer's file did. A merge task streams: it reads the row groups of a range of parts from each of
its files at a time (about ``CHUNK_BYTES`` of them), so its memory does not grow with the group.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datapipe.engine.plan import RunSpec, Segment, build_stage
from datapipe.run_folder.layout import OUTPUT_KINDS, RunFolder
from datapipe.stages.global_stage import PartitionStep, step_of
from datapipe.storage.atomic import atomic_path

CHUNK_BYTES = 64 << 20  # uncompressed row-group bytes a merge task holds at a time


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


def round_inputs(
    spec: RunSpec, folder: RunFolder, segment: Segment, round: int, writers: range | None = None, fetch: bool = True
) -> list[Path]:
    """The input files of a shuffle round that exist (of ``writers`` only, if given), in writer order;
    merged ones where the round is merged (``writers`` then does not apply). ``fetch=False``: not
    downloaded from a remote run folder (a partition reads its row groups in place: ``RunFolder.parquet``)."""
    groups = merge_groups(spec, round_writers(spec, segment, round))
    if groups and writers is None:
        paths = [folder.merged_file(segment.index, round, g, fetch) for g in range(groups)]
    else:
        chosen = writers if writers is not None else range(round_writers(spec, segment, round))
        if round == 0:
            paths = [folder.shuffle_file(segment.index, spec.shards[i].key, fetch) for i in chosen]
        else:
            paths = [folder.forward_file(segment.index, round - 1, p, fetch) for p in chosen]
    return [p for p in paths if (p.exists() if fetch else folder.is_committed(p))]


def group_writers(writers: int, groups: int, group: int) -> range:
    """The writers (contiguous, in order) of one group."""
    size = -(-writers // groups)
    return range(min(writers, group * size), min(writers, (group + 1) * size))


def merge_group(spec: RunSpec, segment: Segment, round: int, group: int) -> dict[str, Any]:
    """Merge one group of a shuffle round's input files into its merged file; returns the marker contents."""
    started = time.perf_counter()
    folder = RunFolder(Path(spec.root))
    writers = round_writers(spec, segment, round)
    groups = merge_groups(spec, writers)
    files = round_inputs(spec, folder, segment, round, group_writers(writers, groups, group))
    rows = merge_files(files, folder.merged_file(segment.index, round, group))
    return {
        "segment": segment.index,
        "round": round,
        "group": group,
        "files": len(files),
        "rows": rows,
        "seconds": round_(time.perf_counter() - started),
    }


def merge_files(paths: list[Path], out: Path) -> int:
    """Rows of ``paths`` (each sorted by ``part``, a row group per part) into ``out``, sorted by part,
    writer order kept inside a part, a row group per part. Returns the rows written (0: no file)."""
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
    if not groups:
        out.unlink(missing_ok=True)  # a stale file of an earlier attempt must not be read
        return 0
    groups.sort()  # by part, then file (writer order), then row group: the order a reader needs
    schema = sources[0].schema_arrow
    written = 0
    with atomic_path(out) as tmp, pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        start = 0
        while start < len(groups):
            # A chunk of whole parts of about CHUNK_BYTES.
            end, size = start, 0
            while end < len(groups) and (size < CHUNK_BYTES or groups[end][0] == groups[end - 1][0]):
                size += groups[end][3]
                end += 1
            chunk = groups[start:end]
            written += _write_chunk(sources, chunk, schema, writer)
            start = end
    for f in sources:
        f.close()
    return written


def _write_chunk(
    sources: list[pq.ParquetFile], chunk: list[tuple[int, int, int, int]], schema: pa.Schema, writer: pq.ParquetWriter
) -> int:
    tables = [sources[i].read_row_group(rg).cast(schema) for _, i, rg, _ in chunk]
    parts = np.array([part for part, _, _, _ in chunk])
    bounds = np.flatnonzero(np.diff(parts)) + 1
    rows = 0
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(parts)]):
        table = pa.concat_tables(tables[lo:hi])
        writer.write_table(table)
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
# single merge task per group held 1/G of the corpus: at 5 billion documents on 64 groups that one
# task took ~10 minutes while the cluster idled (docs/scaling.md); with J ranges each holds 1/(G x J).
# J is fixed, not grown with the partitions: each of a group's J tasks opens every output file of
# the group, so the files opened are J x the outputs, flat per document only while J is (with J =
# partitions / G, tried first, they grew 1.38x from 1x to 16x). A file of a range holds only that
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


def merge_outputs(spec: RunSpec, segment: Segment, group: int, rng: int = 0) -> dict[str, Any]:
    """Merge one range of shards of one group of the partition outputs, states and copies; returns the marker contents."""
    started = time.perf_counter()
    folder = RunFolder(Path(spec.root))
    merge = output_groups(spec, segment)
    writers = output_writers(spec, segment)
    mine = [writers[i] for i in group_writers(len(writers), merge.groups, group)]
    shards = merge.shards_of(rng) if merge.ranges > 1 else None
    rows = {}
    for kind in OUTPUT_KINDS:
        # Read in place (only the row groups of the range cross a store), not downloaded whole: the
        # J tasks of a group each read 1/J of its files.
        files = [f for r, p in mine if folder.is_committed(f := folder.partition_file(kind, segment.index, p, r, fetch=False))]
        rows["decision_rows" if kind == "decisions" else f"{kind}_rows"] = merge_by_shard(
            [folder.parquet(f) for f in files], folder.merged_outputs(segment.index, group, kind, rng=_rng(merge, rng)), shards
        )
    return {
        "segment": segment.index,
        "group": group,
        **({"range": rng} if merge.ranges > 1 else {}),
        **rows,
        "seconds": round_(time.perf_counter() - started),
    }


def _rng(merge: OutputMerge, rng: int) -> int | None:
    return rng if merge.ranges > 1 else None


def merged_output_files(folder: RunFolder, segment: int, merge: OutputMerge, ordinal: int, kind: str) -> list[Path]:
    """The merged files of one ``kind`` (``OUTPUT_KINDS``) holding shard ``ordinal``'s rows, in reading order (group order)."""
    rng = _rng(merge, merge.range_of(ordinal))
    return [folder.merged_outputs(segment, g, kind, fetch=False, rng=rng) for g in range(merge.groups)]


def merge_by_shard(sources: list[pq.ParquetFile], out: Path, shards: range | None = None) -> int:
    """Rows of ``sources`` (each sorted by ``shard``; of ``shards`` only, if given) into ``out``, sorted
    by shard with the files' order kept inside a shard, a row group per shard; streamed a range of
    shards at a time."""
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
    if not groups:
        out.unlink(missing_ok=True)
        return 0
    # Ranges of shards holding about CHUNK_BYTES of row groups each (by where they start).
    by_start = sorted(groups)
    bounds, size = [by_start[0][0] if lo_all is None else max(lo_all, by_start[0][0])], 0
    for lo, _, _, _, nbytes in by_start:
        if size >= CHUNK_BYTES and lo > bounds[-1]:
            bounds.append(lo)
            size = 0
        size += nbytes
    end = max(g[1] for g in groups) + 1
    bounds.append(end if hi_all is None else min(end, hi_all))
    schema = sources[0].schema_arrow
    in_order = sorted(groups, key=lambda g: (g[2], g[3]))  # file order, then row group: the readers' order
    written = 0
    with atomic_path(out) as tmp, pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            tables = [sources[i].read_row_group(rg).cast(schema) for mn, mx, i, rg, _ in in_order if mn < hi and mx >= lo]
            if not tables:
                continue
            table = pa.concat_tables(tables)
            shard = table["shard"].to_numpy()
            table = table.filter(pa.array((shard >= lo) & (shard < hi))).sort_by([("shard", "ascending")])  # a stable sort
            shard = table["shard"].to_numpy()
            cuts = np.flatnonzero(np.diff(shard)) + 1
            for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(shard)]):
                if b > a:
                    writer.write_table(table.slice(a, b - a))
            written += table.num_rows
    if not written:
        out.unlink(missing_ok=True)
    return written


def merge_all_outputs(spec: RunSpec, segment: Segment) -> OutputMerge:
    """Every output merge task of the step ending ``segment``, in this process (its ``merge<i>d`` phase):
    for callers that drive the rounds themselves, before the next map tasks. Returns how they merged."""
    merge = output_groups(spec, segment)
    for g in range(merge.groups):
        for j in range(merge.ranges):
            merge_outputs(spec, segment, g, j)
    return merge
