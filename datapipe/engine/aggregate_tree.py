"""The tree of tasks that merges the map tasks' aggregate files, so the driver reads a few whatever the run's size.

Every map task writes one small aggregate file (``audit/aggregates.py``); the end of the run merges
them into the ``agg_`` tables of ``stats.duckdb``. Merged by the driver alone, that is a serial step
whose time and memory grow with the number of map tasks (bench/scaling/aggregate_tree.py measures it
at crawl proportions). Instead, beyond ``FAN_IN`` files, phases of merge tasks combine them first:

    aggregates<L>   level L >= 1: a task per group of at most FAN_IN files of level L - 1 (level 0: the
                    map tasks' files), merged by the aggregates' declared rules into one file,
                    _work/aggregates/l<L>/<first>-<end>.parquet, committed with a marker like every task

Levels are added while more than ``FAN_IN`` files remain, and the driver merges the last level's (at
most ``FAN_IN``) into the database: its reads and time bounded by ``FAN_IN`` at any size of run
(``bench/scaling/aggregate_tree.py``). A run of at most ``FAN_IN`` map tasks (over all its segments)
has no tree. The files of level 0 are the map tasks' slots in (segment, shard) order, and a task
covers the slots ``first`` to ``end`` (its key), so a task's output is the merge of the same map
files whatever the fan-in a run was resumed with; a slot whose task wrote no document has no file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from datapipe.engine.plan import RunSpec
from datapipe.engine.work_files import WorkFiles, map_phase
from datapipe.run_folder.layout import RunFolder

# Files a merge task (and the driver, at the end) reads at most: each task's time and memory are a
# few dozen small files' worth, and a crawl's map tasks need two or three levels (``levels``).
FAN_IN = 64


def slots(spec: RunSpec) -> int:
    """Aggregate files the map tasks may write: one per (segment, shard)."""
    return len(spec.segments) * len(spec.shards)


def levels(files: int, fan_in: int | None = None) -> int:
    """Levels of merge tasks for ``files`` files: none up to ``fan_in`` of them."""
    fan_in = fan_in or FAN_IN
    n = 0
    while files > fan_in:
        files, n = -(-files // fan_in), n + 1
    return n


def spans(files: int, level: int, fan_in: int | None = None) -> list[range]:
    """The slots each task (level >= 1) or file (level 0: one slot each) of ``level`` covers, in order."""
    width = (fan_in or FAN_IN) ** level
    return [range(start, min(start + width, files)) for start in range(0, files, width)]


def task_key(span: range) -> str:
    return f"{span.start:09d}-{span.stop:09d}"


@dataclass(frozen=True)
class MergeTask:
    """One task of the tree: the files of ``level - 1`` it reads (relative to the run folder)."""

    level: int
    span: range
    inputs: tuple[str, ...]

    @property
    def key(self) -> str:
        return task_key(self.span)


def map_entries(folder: RunFolder, spec: RunSpec) -> list[dict[str, Any] | None] | None:
    """Per slot, in order: its map marker's ``aggregates`` entry (``path`` and ``rows``; None where the
    task wrote no document). None while a map task has no marker yet. A marker without the record (a
    task of a datapipe before aggregates: the end of the run scans ``documents`` instead) raises
    ``NoAggregates``."""
    out: list[dict[str, Any] | None] = []
    for segment in spec.segments:
        markers = folder.markers.read_all(map_phase(segment.index))  # one listing per phase, cached markers
        for shard in spec.shards:
            marker = markers.get(shard.key)
            if marker is None:
                return None
            if "aggregates" not in marker:
                raise NoAggregates(f"{map_phase(segment.index)} {shard.key}")
            out.append(marker["aggregates"])
    return out


class NoAggregates(Exception):
    """A map marker without its aggregate file's record: the run has no complete set of aggregate files."""


def output(level: int, span: range) -> str:
    """A merge task's file, relative to the run folder."""
    return WorkFiles.aggregates_merged_rel(level, task_key(span))


def level_tasks(folder: RunFolder, spec: RunSpec, level: int) -> list[MergeTask] | None:
    """The tasks of ``level`` (>= 1), with their inputs; None until every map task is done; none in a run
    with a map task of a datapipe before aggregates (the end of the run scans instead)."""
    try:
        entries = map_entries(folder, spec)
    except NoAggregates:
        return []
    if entries is None:
        return None
    files = len(entries)
    out = []
    for span in spans(files, level):
        if level == 1:
            inputs = tuple(e["path"] for e in entries[span.start : span.stop] if e is not None)
        else:
            inputs = tuple(output(level - 1, child) for child in _children(span, level))
        out.append(MergeTask(level, span, inputs))
    return out


def _children(span: range, level: int) -> list[range]:
    """The spans of ``level - 1`` inside ``span`` (a span of ``level``)."""
    width = FAN_IN ** (level - 1)
    return [range(start, min(start + width, span.stop)) for start in range(span.start, span.stop, width)]


def final_inputs(folder: RunFolder, spec: RunSpec) -> list[str] | None:
    """The files the driver merges into the ``agg_`` tables: the last level's (at most ``FAN_IN``), or the
    map tasks' own in a run without a tree; None where a map task wrote no record (scan instead)."""
    try:
        entries = map_entries(folder, spec)
    except NoAggregates:
        return None
    assert entries is not None, "the run's map tasks are not all done"
    top = levels(len(entries))
    if top == 0:
        return [e["path"] for e in entries if e is not None]
    return [output(top, span) for span in spans(len(entries), top)]
