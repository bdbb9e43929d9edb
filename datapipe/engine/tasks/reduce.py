"""The corpus-wide tasks of a global stage: one partition of a shuffle round, and the combine step."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datapipe.engine.plan import RunSpec, Segment, build_stage
from datapipe.engine.tasks.copies import split_copies
from datapipe.engine.tasks.merge import OutputMerge, merged_output_files, round_inputs
from datapipe.engine.tasks.reduce_inputs import ParquetReduceInputs
from datapipe.engine.tasks.sinks import ShuffleSink
from datapipe.engine.work_files import WorkFiles
from datapipe.run_folder.layout import RunFolder
from datapipe.stages.base import Stage
from datapipe.stages.global_stage import CombineStep, PartitionResult, PartitionStep, step_of
from datapipe.storage.atomic import atomic_path
from datapipe.storage.parquet_reads import rows_where


def _reduce_inputs(
    spec: RunSpec, folder: RunFolder, segment: Segment, forwarded: tuple[str, ...] = (), lazy: bool = False
) -> ParquetReduceInputs:
    """The map outputs a step reads. ``lazy`` (partition tasks): nothing is downloaded up front; a
    MinHash partition's ``read_rows`` reads the row groups it needs of each map output in place
    (``RunFolder.parquet``), a step reading whole files downloads them (``fetch``)."""
    assert segment.compute_global is not None
    outputs = str(folder.stage_outputs_dir(segment.compute_global, spec.stage_name(segment.compute_global)))
    work = WorkFiles(folder)
    if not lazy:
        present = [(s.ordinal, p) for s in spec.shards if (p := work.map_output(segment.index, s.key)).exists()]
        scratch = work.scratch_dir(segment.index)
        return ParquetReduceInputs([str(p) for _, p in present], [o for o, _ in present], str(scratch), forwarded, outputs)
    present = [
        (s.ordinal, p) for s in spec.shards if folder.is_committed(p := work.map_output(segment.index, s.key, fetch=False))
    ]
    return ParquetReduceInputs(
        [str(p) for _, p in present],
        [o for o, _ in present],
        str(work.scratch_dir(segment.index)),
        forwarded,
        outputs,
        fetch=lambda path: str(folder.fetched(Path(path))),
        open_file=lambda path: folder.parquet(Path(path)),
    )


def partitions_decide(stage: Stage) -> bool:
    """Whether the stage's partition outputs are decisions (read by each shard's map task)."""
    step = step_of(stage, PartitionStep)
    return step is not None and step.decides


def reduce_stage(spec: RunSpec, segment: Segment) -> dict[str, Any]:
    """The corpus-wide step of the global stage that ends ``segment``."""
    started = time.perf_counter()
    folder = RunFolder(Path(spec.root))
    work = WorkFiles(folder)
    assert segment.compute_global is not None
    stage = build_stage(spec, segment.compute_global)
    work.scratch_dir(segment.index).mkdir(parents=True, exist_ok=True)
    combine = step_of(stage, CombineStep)
    assert combine is not None, f"stage {stage.name!r} declares no combine step"
    part = step_of(stage, PartitionStep)
    outputs = [work.partition_output(segment.index, p) for p in range(part.partitions)] if part else []
    forwarded = [work.forward_file(segment.index, part.rounds - 1, p) for p in range(part.partitions)] if part else []
    fwd = tuple(str(f) for f in forwarded if f.exists())
    inputs = _reduce_inputs(spec, folder, segment, fwd, lazy=not combine.reads_files)
    decisions, copies = split_copies(combine.decide([str(p) for p in outputs if p.exists()], inputs), stage.name)
    assert decisions is not None
    # The copies by their survivor's shard, for the survivors' map tasks (engine/tasks/copies.py).
    write_or_remove(work.combine_copies_file(segment.index), copies, sort_by_shard=True)
    if combine.state is not None:
        state = combine.state([str(p) for p in outputs if p.exists()], inputs)
        work.state_file(segment.index).unlink(missing_ok=True)  # a stale one must not apply
        if state is not None:
            with atomic_path(work.state_file(segment.index)) as tmp:
                pq.write_table(state, tmp, write_page_checksum=True)
    # Decisions come sorted by shard: slice each shard's rows instead of filtering per shard.
    decisions = decisions.sort_by([("shard", "ascending")])
    shard_col = decisions["shard"].to_numpy()
    written = 0
    for shard in spec.shards:
        path = work.decisions_file(segment.index, shard.key)
        lo, hi = np.searchsorted(shard_col, [shard.ordinal, shard.ordinal + 1])
        if hi == lo:
            path.unlink(missing_ok=True)  # a stale file from an earlier attempt must not apply
            continue
        with atomic_path(path) as tmp:
            pq.write_table(decisions.slice(lo, hi - lo), tmp, write_page_checksum=True)
        written += int(hi - lo)
    return {
        "segment": segment.index,
        "stage": spec.stage_name(segment.compute_global),
        "decisions": written,
        "seconds": round(time.perf_counter() - started, 3),
    }


def reduce_partition(spec: RunSpec, segment: Segment, partition: int, round: int = 0) -> dict[str, Any]:
    """One partition of one round of a shuffled global stage: its rows from every shard (round 0)
    or from every partition of the round before, reduced."""
    started = time.perf_counter()
    folder = RunFolder(Path(spec.root))
    work = WorkFiles(folder)
    stage = build_stage(spec, segment.compute_global)  # type: ignore[arg-type]
    step = step_of(stage, PartitionStep)
    assert step is not None, f"stage {stage.name!r} declares no partition step"
    # The round's inputs: each writer's file, or the few files a merge phase combined them into; of
    # each, only the row groups of this partition are read (by their `part` statistics), in place
    # from a remote run folder unless this node has the file.
    files = [folder.parquet(f) for f in round_inputs(spec, folder, segment, round, fetch=False, part=partition)]
    rows = rows_where(files, "part", partition)
    result = None
    if rows is not None and rows.num_rows:
        result = step.reduce(rows, round, _reduce_inputs(spec, folder, segment, lazy=True))
    if not isinstance(result, PartitionResult):
        result = PartitionResult(result)
    out = work.partition_output(segment.index, partition, round)
    decisions, copies = split_copies(result.output, stage.name) if partitions_decide(stage) else (result.output, None)
    n = write_or_remove(out, decisions, sort_by_shard=partitions_decide(stage))
    states = write_or_remove(work.partition_state(segment.index, partition, round), result.state, sort_by_shard=True)
    # The copies it dropped, by their survivor's shard, for the survivors' map tasks (engine/tasks/copies.py).
    n_copies = write_or_remove(work.partition_copies(segment.index, partition, round), copies, sort_by_shard=True)
    forward = ShuffleSink(work.forward_file(segment.index, round, partition))
    # The last round's forwarded rows go to the combine step, if one follows.
    if result.forward is not None and (round + 1 < step.rounds or step_of(stage, CombineStep) is not None):
        forward.write(result.forward)
    forward.close()  # nothing to forward: removes a stale file of an earlier attempt
    return {
        "segment": segment.index,
        "partition": partition,
        "round": round,
        "rows_in": rows.num_rows if rows is not None else 0,
        "rows_out": n,
        # With rows_out, what the decisions merge cuts its groups by (engine/tasks/merge.py, output_bounds).
        "state_rows": states,
        "copies_rows": n_copies,
        "forwarded": result.forward.num_rows if result.forward is not None else 0,
        "seconds": round_(time.perf_counter() - started),
    }


def write_or_remove(path: Path, table: pa.Table | None, sort_by_shard: bool) -> int:
    if table is None or table.num_rows == 0:
        path.unlink(missing_ok=True)  # a stale file from an earlier attempt must not count
        return 0
    if sort_by_shard:
        # Decisions read by each shard's map task: sorted by shard in small row groups, so that
        # task's filter on `shard` skips the rest by row-group statistics.
        table = table.sort_by([("shard", "ascending")])
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, row_group_size=_DECISION_ROW_GROUP, write_page_checksum=True)
    return table.num_rows


_DECISION_ROW_GROUP = 1 << 15


def round_(x: float) -> float:
    return round(x, 3)


def partition_decisions(
    folder: RunFolder, segment: int, stage: Stage, ordinal: int, groups: OutputMerge | None = None
) -> pa.Table | None:
    """One shard's decisions, gathered from every partition output of every round (``partitions_decide``),
    or from the ``groups`` files they were merged into (engine/tasks/merge.py, ``output_groups``)."""
    assert step_of(stage, PartitionStep) is not None
    return _partition_rows(folder, segment, stage, ordinal, groups, "decisions")


def partition_state(
    folder: RunFolder, segment: int, stage: Stage, ordinal: int, groups: OutputMerge | None = None
) -> pa.Table | None:
    """One shard's rows of every partition's ``PartitionResult.state``, of every round (None: there are
    none), or of the ``groups`` files they were merged into."""
    return _partition_rows(folder, segment, stage, ordinal, groups, "state")


def partition_copies(
    folder: RunFolder, segment: int, stage: Stage, ordinal: int, groups: OutputMerge | None = None
) -> pa.Table | None:
    """The copies every partition of every round dropped of this shard's documents (None: there are
    none), or of the ``groups`` files they were merged into (engine/tasks/copies.py)."""
    return _partition_rows(folder, segment, stage, ordinal, groups, "copies")


def _partition_rows(
    folder: RunFolder, segment: int, stage: Stage, ordinal: int, groups: OutputMerge | None, kind: str
) -> pa.Table | None:
    step = step_of(stage, PartitionStep)
    if step is None:
        return None
    if groups:
        paths = merged_output_files(folder, segment, groups, ordinal, kind)
    else:
        written = [(p, r) for r in range(step.rounds) for p in range(step.partitions)]
        work = WorkFiles(folder)
        paths = [work.partition_file(kind, segment, p, r, fetch=False) for p, r in written]
    # Of each file, the row groups of this shard only (in place from a remote run folder).
    return rows_where([folder.parquet(f) for f in paths if folder.is_committed(f)], "shard", ordinal)
