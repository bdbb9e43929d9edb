"""Merge tasks: one level of a shuffle's merge (engine/shuffle_plan.py), one (group, key range) each.

A merge task reads one key range of each run of its group (at most ``split.shuffle_fan_in`` runs,
one byte range each) and writes them as one run (engine/tasks/runs.py ``merge_range``): sorted by key,
then by input in writer order, then row, streamed as a k-way merge. Its memory is bounded by
``split.merge_memory_bytes`` (a share of it per input: fewer rows per read when rows are wide), its
work by the bytes of its range (``shuffles.MERGE_TASK_BYTES``), whatever the number of writers, parts
or shards. Before issue 48 a merge task combined a group of whole files
holding a row group per part: ~350 us per (file, part), 4.77M-47.7M row groups for one task of a crawl.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from datapipe.engine.plan import RunSpec, Segment
from datapipe.engine.shuffle_plan import MergeTask
from datapipe.engine.shuffles import OUTPUT_KEY, SHUFFLE_KEY
from datapipe.engine.tasks import runs
from datapipe.engine.work_files import WorkFiles
from datapipe.run_folder.layout import RunFolder


def merge_runs(spec: RunSpec, segment: Segment, round: int, task: MergeTask) -> dict[str, Any]:
    """A round's merge task: its key range of its group's runs, as one run; returns the marker contents."""
    started = time.perf_counter()
    folder = RunFolder(Path(spec.root))
    files = [folder.open_run(f.path, f.bytes, f.footer) for f in task.inputs]
    out = WorkFiles(folder).merged_run(segment.index, round, task.level, task.key)
    rows = runs.merge_range(files, SHUFFLE_KEY, task.lo, task.hi, out, budget=spec.merge_memory_bytes)
    return _marker(segment, task, rows, started, round=round)


def merge_outputs(spec: RunSpec, segment: Segment, kind: str, task: MergeTask) -> dict[str, Any]:
    """A deciding step's outputs merge task (one ``kind``: decisions, state, copies), by shard."""
    started = time.perf_counter()
    folder = RunFolder(Path(spec.root))
    files = [folder.open_run(f.path, f.bytes, f.footer) for f in task.inputs]
    out = WorkFiles(folder).merged_outputs(segment.index, task.level, kind, task.key)
    rows = runs.merge_range(files, OUTPUT_KEY, task.lo, task.hi, out, budget=spec.merge_memory_bytes)
    return _marker(segment, task, rows, started, kind=kind)


def _marker(segment: Segment, task: MergeTask, rows: int, started: float, **more: Any) -> dict[str, Any]:
    return {
        "segment": segment.index,
        **more,
        "level": task.level,
        "group": task.group,
        "keys": [task.lo, task.hi],
        "inputs": len(task.inputs),
        "rows": rows,
        "seconds": round(time.perf_counter() - started, 3),
    }
