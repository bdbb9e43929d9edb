"""The corpus-wide tasks of a global stage: one partition task of a shuffle round, and the combine step."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datapipe.engine.plan import RunSpec, Segment, build_stage
from datapipe.engine.shuffle_plan import ReadTask, RunFile
from datapipe.engine.shuffles import OUTPUT_KEY, SHUFFLE_KEY
from datapipe.engine.tasks import runs
from datapipe.engine.tasks.copies import split_copies
from datapipe.engine.tasks.reduce_inputs import ParquetReduceInputs
from datapipe.engine.work_files import WorkFiles
from datapipe.run_folder.layout import RunFolder
from datapipe.stages.base import Stage
from datapipe.stages.global_stage import CombineStep, PartitionResult, PartitionStep, step_of
from datapipe.storage.atomic import atomic_path

# The map outputs a partition task may read rows of (``ReduceInputs.read_rows``): (shard ordinal, its run
# file), handed over by the driver (a step with ``owner_reads``: the shards its parts own); None: any
# shard's, found by the spec (a step that reads the rows of any document: semantic, substrings).
MapOutputs = tuple[tuple[int, RunFile], ...] | None


def _reduce_inputs(
    spec: RunSpec, folder: RunFolder, segment: Segment, forwarded: tuple[str, ...] = (), lazy: bool = False
) -> ParquetReduceInputs:
    """The map outputs the combine step reads. ``lazy``: nothing is downloaded up front; ``read_rows``
    reads the row groups it needs of each map output in place (``RunFolder.parquet``), a step reading
    whole files downloads them (``fetch``)."""
    assert segment.compute_global is not None
    outputs = str(folder.stage_outputs_dir(segment.compute_global, spec.stage_name(segment.compute_global)))
    if not lazy:
        present = [(s.ordinal, p) for s in spec.shards if (p := WorkFiles(folder).map_output(segment.index, s.key)).exists()]
        scratch = WorkFiles(folder).scratch_dir(segment.index)
        return ParquetReduceInputs([str(p) for _, p in present], [o for o, _ in present], str(scratch), forwarded, outputs)
    return ParquetReduceInputs(
        [],
        [],
        str(WorkFiles(folder).scratch_dir(segment.index)),
        forwarded,
        outputs,
        fetch=lambda path: str(folder.fetched(Path(path))),
        open_file=lambda path: folder.parquet(Path(path)),
        locate=_any_shard(spec, folder, segment),
    )


def _any_shard(spec: RunSpec, folder: RunFolder, segment: Segment) -> Callable[[int], str | None]:
    """Shard ordinal -> its map output (None: the task wrote none), looked up when a row of it is read."""

    def locate(ordinal: int) -> str | None:
        path = WorkFiles(folder).map_output(segment.index, spec.shards[ordinal].key, fetch=False)
        return str(path) if folder.is_committed(path) else None

    return locate


def _partition_inputs(spec: RunSpec, folder: RunFolder, segment: Segment, outputs: MapOutputs) -> ParquetReduceInputs:
    """What a partition task's step reads of the map outputs: the ones it was handed, opened with their
    committed size and footer, else any shard's (``MapOutputs``)."""
    if outputs is None:
        return _reduce_inputs(spec, folder, segment, lazy=True)
    assert segment.compute_global is not None
    by_path = {f.path: f for _, f in outputs}
    root = folder.root

    def open_file(path: str) -> pq.ParquetFile:
        f = by_path[Path(path).relative_to(root).as_posix()]
        return folder.open_run(f.path, f.bytes, f.footer)

    return ParquetReduceInputs(
        [str(root / f.path) for _, f in outputs],
        [o for o, _ in outputs],
        str(WorkFiles(folder).scratch_dir(segment.index)),
        (),
        str(folder.stage_outputs_dir(segment.compute_global, spec.stage_name(segment.compute_global))),
        open_file=open_file,
    )


def partitions_decide(stage: Stage) -> bool:
    """Whether the stage's partition outputs are decisions (read by each shard's map task)."""
    step = step_of(stage, PartitionStep)
    return step is not None and step.decides


def reduce_stage(spec: RunSpec, segment: Segment, outputs: Sequence[str] = (), forwarded: Sequence[str] = ()) -> dict[str, Any]:
    """The corpus-wide step of the global stage that ends ``segment``. ``outputs``: the partition step's
    outputs before it (round 0's, paths in the run folder), ``forwarded``: its last round's forwarded runs."""
    started = time.perf_counter()
    folder = RunFolder(Path(spec.root))
    assert segment.compute_global is not None
    stage = build_stage(spec, segment.compute_global)
    WorkFiles(folder).scratch_dir(segment.index).mkdir(parents=True, exist_ok=True)
    combine = step_of(stage, CombineStep)
    assert combine is not None, f"stage {stage.name!r} declares no combine step"
    present = [p for rel in outputs if (p := folder.fetched(folder.root / rel)).exists()]
    fwd = tuple(str(p) for rel in forwarded if (p := folder.fetched(folder.root / rel)).exists())
    inputs = _reduce_inputs(spec, folder, segment, fwd, lazy=not combine.reads_files)
    decisions, copies = split_copies(combine.decide([str(p) for p in present], inputs), stage.name)
    assert decisions is not None
    # The copies by their survivor's shard, for the survivors' map tasks (engine/tasks/copies.py).
    write_or_remove(WorkFiles(folder).combine_copies_file(segment.index), copies, sort_by_shard=True)
    if combine.state is not None:
        state = combine.state([str(p) for p in present], inputs)
        WorkFiles(folder).state_file(segment.index).unlink(missing_ok=True)  # a stale one must not apply
        if state is not None:
            with atomic_path(WorkFiles(folder).state_file(segment.index)) as tmp:
                pq.write_table(state, tmp, write_page_checksum=True)
    # Decisions come sorted by shard: slice each shard's rows instead of filtering per shard.
    decisions = decisions.sort_by([("shard", "ascending")])
    shard_col = decisions["shard"].to_numpy()
    written = 0
    for shard in spec.shards:
        path = WorkFiles(folder).decisions_file(segment.index, shard.key)
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


def reduce_partition(spec: RunSpec, segment: Segment, round: int, task: ReadTask, outputs: MapOutputs = None) -> dict[str, Any]:
    """One partition task of one round of a shuffled global stage: its parts' rows (one byte range of each
    run of ``task.inputs``), reduced a part at a time, as the stage's ``reduce`` expects (engine/shuffles.py).

    Its memory is bounded by configuration, not by its rows: the parts are read one at a time (a k-way
    merge of the inputs, ``runs.iter_parts``) and each part's results go straight to their runs' writers,
    which spill sorted pieces past ``split.merge_memory_bytes`` (``runs.SortedRunWriter``)."""
    started = time.perf_counter()
    folder = RunFolder(Path(spec.root))
    work = WorkFiles(folder)
    stage = build_stage(spec, segment.compute_global)  # type: ignore[arg-type]
    step = step_of(stage, PartitionStep)
    assert step is not None, f"stage {stage.name!r} declares no partition step"
    files = [folder.open_run(f.path, f.bytes, f.footer) for f in task.inputs]
    inputs = _partition_inputs(spec, folder, segment, outputs)
    decide = partitions_decide(stage)
    # The last round's forwarded rows go to the combine step, if one follows.
    forwards = round + 1 < step.rounds or step_of(stage, CombineStep) is not None

    def writer(path: Path, key: str) -> runs.SortedRunWriter:
        return runs.SortedRunWriter(path, key, spec.merge_memory_bytes, work.scratch_dir(segment.index))

    # Decisions are read by each shard's map task: a run by shard (a step that does not decide writes
    # its output as it comes).
    decisions = writer(work.partition_output(segment.index, task.index, round), OUTPUT_KEY) if decide else None
    undecided: list[pa.Table | None] = []
    state = writer(work.partition_state(segment.index, task.index, round), OUTPUT_KEY)
    # The copies it dropped, by their survivor's shard, for the survivors' map tasks (engine/tasks/copies.py).
    copies = writer(work.partition_copies(segment.index, task.index, round), OUTPUT_KEY)
    forward = writer(work.forward_file(segment.index, round, task.index), SHUFFLE_KEY)
    writers = [w for w in (decisions, state, copies, forward) if w is not None]
    rows_in = 0
    try:
        for _, part_rows in runs.iter_parts(files, SHUFFLE_KEY, task.lo, task.hi, spec.merge_memory_bytes):
            rows_in += part_rows.num_rows
            result = step.reduce(part_rows, round, inputs)
            if not isinstance(result, PartitionResult):
                result = PartitionResult(result)
            if decisions is not None:
                kept, dropped = split_copies(result.output, stage.name)
                decisions.add(kept)
                copies.add(dropped)
            else:
                undecided.append(result.output)
            state.add(result.state)
            if forwards:
                forward.add(result.forward)
            del result, part_rows
        if decisions is not None:
            n = decisions.close()
        else:
            n = write_or_remove(work.partition_output(segment.index, task.index, round), _concat(undecided), sort_by_shard=False)
        states, n_copies, forwarded = state.close(), copies.close(), forward.close()
    except BaseException:
        for w in writers:
            w.abort()
        raise
    return {
        "segment": segment.index,
        "round": round,
        "parts": [task.lo, task.hi],
        "inputs": len(files),
        "rows_in": rows_in,
        "rows_out": n,
        # With rows_out, what the next phases plan by (engine/shuffles.py): the outputs' merges, the
        # next round's writers.
        "state_rows": states,
        "copies_rows": n_copies,
        "forwarded": forwarded,
        "seconds": round_(time.perf_counter() - started),
    }


def _concat(tables: Sequence[pa.Table | None]) -> pa.Table | None:
    present = [t for t in tables if t is not None and t.num_rows]
    if not present:
        return None
    return present[0] if len(present) == 1 else pa.concat_tables(present, promote_options="permissive")


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


def shard_rows(folder: RunFolder, files: Sequence[RunFile], ordinal: int) -> pa.Table | None:
    """One shard's rows of a deciding step's outputs of one kind (decisions, state or copies): one byte
    range of each run the driver handed its map task (engine/shuffles.py ``final_outputs``), in their
    order; None when there are none."""
    if not files:
        return None
    opened = [folder.open_run(f.path, f.bytes, f.footer) for f in files]
    return runs.read_range(opened, OUTPUT_KEY, ordinal, ordinal + 1)
