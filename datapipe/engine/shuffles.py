"""A global stage's shuffle as phases: merge levels and partition tasks, planned from the writers' markers.

For each round of a ``PartitionStep`` (engine/phases.py lays the phases out, this module lists their
tasks when the phases before are done):

    merge<i>[r<r>][l<l>]  the round's runs merged, level by level, while a part is held by more runs
                          than ``split.shuffle_fan_in`` (engine/shuffle_plan.py ``levels``)
    shuffle<i>[r<r>]      the partition tasks: each a contiguous range of parts holding about
                          ``split.partition_rows`` rows, reading one byte range of each run of the last
                          level (at most fan-in of them)
    merge<i>d[l<l>]       after the last round of a deciding step: its outputs merged by shard, so a
                          map task reads its shard's decisions from at most ``OUTPUT_READS`` runs

The writers of round 0 are the map tasks (one shuffle run each), of round r the partition tasks of
round r - 1 (one forwarded run each). Parts are the step's ``partitions`` (the stage hashes its keys
into them; ``auto``: one per map task), so a part holds about one map task's keys at any corpus size,
and a partition task reduces its parts one at a time (``engine/tasks/reduce.py``): the stage sees what
it always saw, one part's rows per call, while the number of tasks follows the rows, not the parts.

Every list is a function of markers that never change once written, so it is cached, and the same on
resume. Building one is linear in the writers, tasks and shards: no loop over shards per task.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from datapipe.engine.plan import RunSpec, Segment
from datapipe.engine.shuffle_plan import Grid, Level, MergeTask, ReadTask, RunFile, level_tasks, levels, merged_grid, read_tasks
from datapipe.engine.shuffle_plan import writers_grid as _writers_grid
from datapipe.engine.work_files import (
    OUTPUT_KINDS,
    WorkFiles,
    map_phase,
    merge_outputs_phase,
    merge_phase,
    partition_key,
    shuffle_phase,
)
from datapipe.run_folder.layout import RunFolder
from datapipe.stages.global_stage import PartitionStep

# Bytes (as written, compressed) a merge task reads: a few seconds of work, tens of MiB held at once
# (it streams); bench/crawl_proportions.py measured it. Fewer, larger tasks mean fewer requests (a task
# makes one per input run) and less driver work; smaller ones, shorter stragglers.
MERGE_TASK_BYTES = 256 << 20
# Runs a map task reads each kind of its shard's decisions from, at most: every read is a request or
# two on an object store, and a crawl has tens of thousands of map tasks.
OUTPUT_READS = 8
SHUFFLE_KEY, OUTPUT_KEY = "part", "shard"  # the key column of a round's runs, and of a step's outputs
Merges = tuple[list[MergeTask], dict[tuple[int, int], RunFile]]  # a level's tasks, and the runs passing through


def entry(marker: dict[str, Any], rel: str) -> tuple[int, int | None] | None:
    """(bytes, footer length) of the file ``rel`` as the task's marker names it (None: not written)."""
    for f in marker.get("files", ()):
        if f["path"] == rel:
            return int(f["bytes"]), f.get("footer")
    return None


def run_file(folder: RunFolder, marker: dict[str, Any], path: Any, rows: int, lo: int, hi: int) -> RunFile | None:
    """The run at ``path`` (in the run folder; or its path there, as text) as its writer's marker
    describes it; None when it holds no rows."""
    if rows <= 0:
        return None
    rel = path if isinstance(path, str) else folder.rel(path)
    found = entry(marker, rel)
    size, footer = found if found is not None else (0, None)
    return RunFile(rel, rows, lo, hi, size, footer)


@dataclass
class StepShuffle:
    """The shuffle of one ``PartitionStep`` (the global stage that ends ``segment``): its rounds' merge
    levels and partition tasks, and its outputs' merge levels, as far as the markers tell."""

    spec: RunSpec
    segment: Segment
    step: PartitionStep

    def __post_init__(self) -> None:
        self.parts = self.step.partitions
        self.fan_in = self.spec.shuffle_fan_in
        self.rows = self.spec.partition_rows
        self.bytes = self.spec.partition_bytes
        self._levels: dict[int, list[Level]] = {}
        self._grids: dict[tuple[int, int], Grid] = {}
        self._merges: dict[tuple[int, int], Merges] = {}
        self._readers: dict[int, list[ReadTask]] = {}
        self._outputs: dict[tuple[str, int], Grid] = {}
        self._output_levels: dict[str, list[Level]] = {}
        self._output_merges: dict[tuple[str, int], Merges] = {}
        self._by_part: list[tuple[int, int]] | None = None

    # --- a round's runs ------------------------------------------------------------------------
    def max_levels(self, round: int) -> int:
        """Merge levels a round may need at most (its phases are planned up front; those a smaller run
        does not need have no tasks): the writers are the map tasks, or at most one per part."""
        writers = len(self.spec.shards) if round == 0 else self.parts
        return len(levels(writers, self.parts, 1, self.fan_in, 1, self.fan_in))

    def writers(self, folder: RunFolder, round: int) -> list[RunFile | None] | None:
        """The round's runs in writer order (None where one wrote nothing); None until all are written."""
        if round == 0:
            markers = folder.markers.read_all(map_phase(self.segment.index))
            out: list[RunFile | None] = []
            for shard in self.spec.shards:
                m = markers.get(shard.key)
                if m is None:
                    return None
                rel = WorkFiles.shuffle_file_rel(self.segment.index, shard.key)  # as text: one per map task
                out.append(run_file(folder, m, rel, int(m.get("shuffle_rows", 0)), 0, self.parts))
            return out
        before = self.readers(folder, round - 1)
        if before is None:
            return None
        markers = folder.markers.read_all(shuffle_phase(self.segment.index, round - 1))
        out = []
        for task in before:
            m = markers.get(partition_key(task.index))
            if m is None:
                return None
            path = WorkFiles.forward_file_rel(self.segment.index, round - 1, task.index)
            out.append(run_file(folder, m, path, int(m.get("forwarded", 0)), 0, self.parts))
        return out

    def levels(self, folder: RunFolder, round: int) -> list[Level] | None:
        if round not in self._levels:
            writers = self.writers(folder, round)
            if writers is None:
                return None
            total = sum(w.bytes or w.rows for w in writers if w is not None)
            self._levels[round] = levels(len(writers), self.parts, total, self.fan_in, MERGE_TASK_BYTES, self.fan_in)
        return self._levels[round]

    def grid(self, folder: RunFolder, round: int, level: int) -> Grid | None:
        """The runs of ``level`` (0: the writers'); None until that level is done."""
        key = (round, level)
        if key in self._grids:
            return self._grids[key]
        if level == 0:
            writers = self.writers(folder, round)
            if writers is None:
                return None
            grid = _writers_grid(writers, self.parts)
        else:
            merged = self.merge_plan(folder, round, level)
            shapes = self.levels(folder, round)
            if merged is None or shapes is None:
                return None
            tasks, kept = merged
            markers = folder.markers.read_all(merge_phase(self.segment.index, round, level))
            outputs: dict[str, RunFile | None] = {}
            for t in tasks:
                m = markers.get(t.key)
                if m is None:
                    return None
                path = WorkFiles.merged_run_rel(self.segment.index, round, level, t.key)
                outputs[t.key] = run_file(folder, m, path, int(m.get("rows", 0)), t.lo, t.hi)
            grid = merged_grid(shapes[level - 1], tasks, outputs, kept)
        self._grids[key] = grid
        return grid

    def merge_plan(
        self, folder: RunFolder, round: int, level: int
    ) -> tuple[list[MergeTask], dict[tuple[int, int], RunFile]] | None:
        """Level ``level``'s merge tasks and the runs passing through it; ([], {}) past the last level."""
        key = (round, level)
        if key not in self._merges:
            shapes = self.levels(folder, round)
            if shapes is None:
                return None
            if level > len(shapes):
                return [], {}
            prev = self.grid(folder, round, level - 1)
            if prev is None:
                return None
            self._merges[key] = level_tasks(prev, shapes[level - 1], level, self.fan_in)
        return self._merges[key]

    def readers(self, folder: RunFolder, round: int) -> list[ReadTask] | None:
        """The round's partition tasks ([]: a round after one that forwarded nothing has none)."""
        if round in self._readers:
            return self._readers[round]
        shapes = self.levels(folder, round)
        if shapes is None:
            return None
        grid = self.grid(folder, round, len(shapes))
        if grid is None:
            return None
        self._readers[round] = read_tasks(grid, self.rows, self.bytes)
        return self._readers[round]

    def owned(self, task: ReadTask) -> list[int]:
        """The shards whose map outputs the partition reads rows of (``owner_reads``: its parts own them,
        a shard's owner part is its ordinal modulo the parts): found by bisection, not a loop per task."""
        if self._by_part is None:
            self._by_part = sorted((s.ordinal % self.parts, s.ordinal) for s in self.spec.shards)
        a = bisect.bisect_left(self._by_part, (task.lo, -1))
        b = bisect.bisect_left(self._by_part, (task.hi, -1))
        return [ordinal for _, ordinal in self._by_part[a:b]]

    def map_outputs(
        self, folder: RunFolder, ordinals: list[int], markers: dict[str, dict[str, Any]] | None = None
    ) -> tuple[tuple[int, RunFile], ...]:
        """The committed map outputs (of the segment's map phase) of these shards, as run files.
        ``markers``: that phase's markers (``read_all``), read once by a caller asking for many tasks."""
        if markers is None:
            markers = folder.markers.read_all(map_phase(self.segment.index))
        out = []
        for o in ordinals:
            shard = self.spec.shards[o]
            m = markers.get(shard.key)
            path = WorkFiles.map_output_rel(self.segment.index, shard.key)
            if m is not None and (f := run_file(folder, m, path, int(m.get("kept", 0)), 0, 1)) is not None:
                out.append((o, f))  # none where every document of the shard was dropped
        return tuple(out)

    # --- the outputs of a deciding step, by shard ------------------------------------------------
    def output_writers(self, folder: RunFolder, kind: str) -> list[RunFile | None] | None:
        """Every partition task's output of ``kind``, round by round; None until the last round is done."""
        counts = {"decisions": "rows_out", "state": "state_rows", "copies": "copies_rows"}[kind]
        shards = len(self.spec.shards)
        out: list[RunFile | None] = []
        if kind != "state" and not self.step.decides:
            return out  # its outputs are the combine step's, not runs by shard
        for r in range(self.step.rounds):
            tasks = self.readers(folder, r)
            if tasks is None:
                return None
            markers = folder.markers.read_all(shuffle_phase(self.segment.index, r))
            for t in tasks:
                m = markers.get(partition_key(t.index))
                if m is None:
                    return None
                path = WorkFiles.partition_file_rel(kind, self.segment.index, t.index, r)
                out.append(run_file(folder, m, path, int(m.get(counts, 0)), 0, shards))
            if not tasks:
                break  # the rounds after one without tasks have none either
        return out

    def output_levels(self, folder: RunFolder, kind: str) -> list[Level] | None:
        if kind not in self._output_levels:
            writers = self.output_writers(folder, kind)
            if writers is None:
                return None
            total = sum(w.bytes or w.rows for w in writers if w is not None)
            present = [w for w in writers if w is not None]
            self._output_levels[kind] = levels(
                len(present), len(self.spec.shards), total, self.fan_in, MERGE_TASK_BYTES, OUTPUT_READS
            )
        return self._output_levels[kind]

    def output_grid(self, folder: RunFolder, kind: str, level: int) -> Grid | None:
        key = (kind, level)
        if key in self._outputs:
            return self._outputs[key]
        shards = len(self.spec.shards)
        if level == 0:
            writers = self.output_writers(folder, kind)
            if writers is None:
                return None
            grid = _writers_grid([w for w in writers if w is not None], shards)
        else:
            merged = self.output_merge_plan(folder, kind, level)
            shapes = self.output_levels(folder, kind)
            if merged is None or shapes is None:
                return None
            tasks, kept = merged
            markers = folder.markers.read_all(merge_outputs_phase(self.segment.index, level))
            outputs: dict[str, RunFile | None] = {}
            for t in tasks:
                m = markers.get(f"{kind}-{t.key}")
                if m is None:
                    return None
                path = WorkFiles.merged_outputs_rel(self.segment.index, level, kind, t.key)
                outputs[t.key] = run_file(folder, m, path, int(m.get("rows", 0)), t.lo, t.hi)
            grid = merged_grid(shapes[level - 1], tasks, outputs, kept)
        self._outputs[key] = grid
        return grid

    def output_merge_plan(self, folder: RunFolder, kind: str, level: int) -> Merges | None:
        key = (kind, level)
        if key not in self._output_merges:
            shapes = self.output_levels(folder, kind)
            if shapes is None:
                return None
            if level > len(shapes):
                return [], {}
            prev = self.output_grid(folder, kind, level - 1)
            if prev is None:
                return None
            self._output_merges[key] = level_tasks(prev, shapes[level - 1], level, self.fan_in)
        return self._output_merges[key]

    def max_output_levels(self) -> int:
        writers = self.step.rounds * self.parts
        return len(levels(writers, len(self.spec.shards), 1, self.fan_in, 1, OUTPUT_READS))

    def final_outputs(self, folder: RunFolder) -> dict[str, Grid] | None:
        """The last level's runs of each kind, by shard: what the next map tasks read."""
        out = {}
        for kind in OUTPUT_KINDS:
            shapes = self.output_levels(folder, kind)
            if shapes is None:
                return None
            grid = self.output_grid(folder, kind, len(shapes))
            if grid is None:
                return None
            out[kind] = grid
        return out
