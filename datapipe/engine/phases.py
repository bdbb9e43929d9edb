"""The run as data: the ordered phases of a ``RunSpec``, each with its tasks, resources and task function.

    lines                   records per range of a split file whose format numbers them across the
                            file (JSONL lines; ReaderSpec.prepass_count): a pre-pass
    map<i>                  one task per input shard: read or load, stages, compute the next global stage
    merge<i>[r<r>]          a shuffle round with more input files than ``split.shuffle_groups``: one task per
                            group of them, merged into one file (engine/tasks/merge.py)
    merge<i>d               after the last round of a deciding step with more outputs than that: its
                            partition outputs and states merged by shard, for the next map tasks
    shuffle<i>[r<r>]        a global stage's ``PartitionStep``: one task per partition, per round (none
                            in a round after one that forwarded nothing)
    reduce<i>               a global stage's ``CombineStep``: one task
    pack                    one task per range of output shard files (known once the last map is done)
    aggregates<L>           beyond FAN_IN map tasks' aggregate files: a tree of merge tasks, each
                            combining at most FAN_IN files of the level below (engine/aggregate_tree.py)

The runner is one loop over this list; ``_all_tasks`` (is anything left to do?) reads the same list.
A global stage is known here only by the steps it declares (``GlobalStage.steps()``), so a new one
needs no engine change. Phase names come from ``run_folder`` (they name the marker folders).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from datapipe.engine import aggregate_tree, work_files
from datapipe.engine.pack_plan import pack_ranges
from datapipe.engine.plan import RunSpec, Segment, Shard, build_stage
from datapipe.engine.tasks.aggregates import merge_aggregates
from datapipe.engine.tasks.map import count_range_lines, map_shard
from datapipe.engine.tasks.merge import (
    OutputMerge,
    group_writers,
    merge_group,
    merge_groups,
    merge_outputs,
    output_bounds,
    output_groups,
    output_weights,
    round_writers,
)
from datapipe.engine.tasks.pack import pack_range
from datapipe.engine.tasks.reduce import reduce_partition, reduce_stage
from datapipe.engine.work_files import map_phase, merge_outputs_phase, merge_phase, partition_key, reduce_phase, shuffle_phase
from datapipe.readers import reader_spec
from datapipe.run_folder.layout import LINES_PHASE, PACK_PHASE, RunFolder
from datapipe.run_folder.remote import CommittedPhase
from datapipe.stages.base import Resources
from datapipe.stages.global_stage import CombineStep, GlobalStage, PartitionStep, checked_steps


@dataclass(frozen=True)
class Task:
    """One unit of work: ``key`` names its marker; the phase's function is called as ``fn(spec, *args)``
    (args picklable: they travel to a Ray worker)."""

    key: str
    args: tuple[Any, ...]
    # The Ray node to run it on when it is there (set by the runner from ``Phase.follows``); None: anywhere.
    node: str | None = None


TaskList = tuple[Task, ...] | Callable[[RunFolder], "tuple[Task, ...] | None"]


@dataclass(frozen=True)
class Phase:
    name: str  # the marker folder: kept as runs before had it, so old run folders resume
    fn: Callable[..., dict[str, Any]]  # fn(spec, *task.args) -> the marker's contents
    tasks: TaskList  # or, where they depend on earlier outputs, a function of the run folder (None: not yet known)
    resources: dict[str, Any]  # Ray task options: num_cpus, memory, num_gpus, scheduling_strategy
    unit: str  # what the progress bar counts
    gpus_required: bool = False  # False: num_gpus is dropped on a cluster without GPUs (a stage's device: auto)
    # A phase whose task of the same key wrote the files this one's task reads whole (the map task of
    # the segment before): each task is placed on the node that ran that one, so it reads them from its
    # own mirror instead of moving them through the store (a remote run folder on several nodes).
    follows: str | None = None
    # What a task reads of ``follows``: (task key there, weight), e.g. a pack range's shards and their
    # tokens; it goes where most of that weight was written. None: the task of its own key.
    reads: Callable[[Task], Sequence[tuple[str, int]]] | None = None
    # A remote run folder: what the phases before this one committed, handed to each task by the
    # executor (set by the runner; run_folder/remote.py ``install``), so no task lists or reads
    # markers on the store. None: a local folder, where tasks read the finished outputs in place.
    committed: tuple[CommittedPhase, ...] | None = None
    # What the phase does, for a person: the stage and its step ("minhash: verifying pairs (round 3
    # of 7)", "semantic: training vectors"); progress shows it instead of the marker folder's name.
    label: str = ""

    def placed(self, tasks: Sequence[Task], ran_on: dict[str, str]) -> list[Task]:
        """``tasks``, each with the node that wrote most of what it reads (``ran_on``: task key of
        ``follows`` -> its node, from the markers)."""
        out = []
        for task in tasks:
            weights: dict[str, int] = {}
            for key, weight in self.reads(task) if self.reads is not None else [(task.key, 1)]:
                if (node := ran_on.get(key)) is not None:
                    weights[node] = weights.get(node, 0) + weight
            out.append(replace(task, node=max(sorted(weights), key=weights.__getitem__)) if weights else task)
        return out

    def task_list(self, folder: RunFolder) -> tuple[Task, ...] | None:
        return self.tasks(folder) if callable(self.tasks) else self.tasks


def plan_phases(spec: RunSpec) -> list[Phase]:
    """Every phase of the run, in the order they run."""
    phases: list[Phase] = []
    if lines := line_tasks(spec):  # global record numbers (JSONL lines) for ranges: a cheap parallel pre-pass
        phases.append(
            Phase(
                LINES_PHASE,
                count_range_lines,
                tuple(Task(s.key, (s,)) for s in lines),
                {"num_cpus": 1, "scheduling_strategy": "SPREAD"},
                "ranges",
                label="counting lines",
            )
        )
    for segment in spec.segments:
        # SPREAD: input shards are I/O-heavy; spreading them uses every node's disks and network.
        phases.append(
            Phase(
                map_phase(segment.index),
                map_shard,
                tuple(Task(s.key, (s, segment)) for s in largest_first(spec.shards)),
                {**_segment_resources(spec, segment), "scheduling_strategy": "SPREAD"},
                "shards",
                any(r.gpus_required for r in _computing_resources(spec, segment)),
                follows=map_phase(segment.index - 1) if segment.index else None,
                label=_map_label(spec, segment),
            )
        )
        if not segment.final:
            phases += _global_phases(spec, segment)
    if spec.tokenizer is not None:
        phases.append(
            Phase(
                PACK_PHASE,
                pack_range,
                lambda folder: _pack_tasks(folder, spec),
                {"num_cpus": 1},
                "ranges",
                follows=map_phase(spec.segments[-1].index),
                reads=lambda task: task.args[0].shard_tokens,  # the token files of its shards
                label="packing shards",
            )
        )
    phases += _aggregate_phases(spec)
    return phases


def _map_label(spec: RunSpec, segment: Segment) -> str:
    """``map: langid, length, quality, minhash`` (the stages its tasks run; a global stage's part too)."""
    positions = [p for p in (segment.apply_global, *segment.stages, segment.compute_global) if p is not None]
    names = [spec.stage_name(p) for p in positions]
    if segment.final and spec.tokenizer is not None:
        names.append("tokenize")
    return "map: " + (", ".join(dict.fromkeys(names)) or "read")


def _aggregate_phases(spec: RunSpec) -> list[Phase]:
    """The levels of the tree that merges the map tasks' aggregate files, so the driver merges at most
    ``aggregate_tree.FAN_IN`` of them at the end of the run (none in a run of fewer map tasks)."""

    def listed(folder: RunFolder, level: int) -> tuple[Task, ...] | None:
        tasks = aggregate_tree.level_tasks(folder, spec, level)
        return None if tasks is None else tuple(Task(t.key, (level, t.span.start, t.span.stop, t.inputs)) for t in tasks)

    depth = aggregate_tree.levels(aggregate_tree.slots(spec))
    return [
        Phase(
            work_files.aggregates_phase(level),
            merge_aggregates,
            lambda folder, level=level: listed(folder, level),  # type: ignore[misc]
            {"num_cpus": 1},
            "files",
            label=f"merging statistics (level {level} of {depth})",
        )
        for level in range(1, depth + 1)
    ]


def _global_phases(spec: RunSpec, segment: Segment) -> list[Phase]:
    """The phases of the global stage that ends ``segment``, from the steps it declares."""
    assert segment.compute_global is not None
    stage = build_stage(spec, segment.compute_global)
    assert isinstance(stage, GlobalStage)
    wants = stage.step_resources()
    cpus = wants.num_cpus
    steps = {"num_cpus": cpus, **({"num_gpus": wants.num_gpus} if wants.num_gpus else {})}  # a GPU share: semantic
    phases: list[Phase] = []
    for step in checked_steps(stage):
        if isinstance(step, PartitionStep):
            forwarded: dict[int, bool] = {}  # round -> forwarded anything, shared by the rounds' task lists
            for r in range(step.rounds):
                if groups := merge_groups(spec, round_writers(spec, segment, r)):
                    # Many writers: merge their files into a few first (engine/tasks/merge.py).
                    merges = tuple(Task(partition_key(g), (segment, r, g)) for g in range(groups))
                    phases.append(
                        Phase(
                            merge_phase(segment.index, r),
                            merge_group,
                            _round_tasks(segment, step, r, forwarded, merges),
                            {"num_cpus": 1, "scheduling_strategy": "SPREAD"},
                            "groups",
                            label=f"{stage.name}: gathering the inputs of {step.describe(r)}",
                        )
                    )
                every = tuple(Task(partition_key(p), (segment, p, r)) for p in range(step.partitions))
                phases.append(
                    Phase(
                        shuffle_phase(segment.index, r),
                        reduce_partition,
                        _round_tasks(segment, step, r, forwarded, every),
                        {**steps, "scheduling_strategy": "SPREAD"},
                        "partitions",
                        wants.gpus_required,
                        # The map outputs a partition answers from, read where they were written.
                        follows=map_phase(segment.index) if step.owner_reads else None,
                        reads=_owned_shards(spec, step.partitions) if step.owner_reads else None,
                        label=f"{stage.name}: {step.describe(r)}",
                    )
                )
            if merged := output_groups(spec, segment):
                # The decisions the next map tasks read, merged into a few files per range of shards
                # (engine/tasks/merge.py); a task per (group, range), keyed as before where one range.
                phases.append(
                    Phase(
                        merge_outputs_phase(segment.index),
                        merge_outputs,
                        _output_merge_tasks(spec, segment, step, merged),
                        {"num_cpus": 1, "scheduling_strategy": "SPREAD"},
                        "groups",
                        label=f"{stage.name}: gathering decisions",
                    )
                )
        elif isinstance(step, CombineStep):
            phases.append(
                Phase(
                    reduce_phase(segment.index),
                    reduce_stage,
                    (Task(stage.name, (segment,)),),
                    steps,
                    "steps",
                    wants.gpus_required,
                    label=f"{stage.name}: {step.name}",
                )
            )
        else:
            raise TypeError(f"stage {stage.name!r} declares an unknown step {step!r}")
    return phases


def _owned_shards(spec: RunSpec, partitions: int) -> Callable[[Task], list[tuple[str, int]]]:
    """A partition task's reads of the map phase before it (``PartitionStep.owner_reads``): the
    shards whose ordinal is its partition modulo ``partitions``, by their bytes of input."""

    def reads(task: Task) -> list[tuple[str, int]]:
        p = task.args[1]
        return [(s.key, max(1, s.nbytes)) for s in spec.shards if s.ordinal % partitions == p]

    return reads


def _output_merge_tasks(spec: RunSpec, segment: Segment, step: PartitionStep, merged: OutputMerge) -> TaskList:
    """The decisions merge's tasks, a task per (group, range), keyed as before where one range; its
    groups cut by the rows the rounds' markers say each partition output holds (``output_bounds``),
    so known once the last round with tasks is done."""

    def listed(folder: RunFolder) -> tuple[Task, ...] | None:
        done: dict[int, dict[int, dict[str, Any]]] = {}
        for r in range(step.rounds):
            markers = folder.markers.read_all(shuffle_phase(segment.index, r))
            got = {p: m for p in range(step.partitions) if (m := markers.get(partition_key(p))) is not None}
            if r and not any(m.get("forwarded", 0) for m in done[r - 1].values()):
                break  # the rounds from here had no tasks
            if len(got) < step.partitions:
                return None  # not known until that round is done
            done[r] = got
        bounds = output_bounds(output_weights(spec, segment, lambda r: done.get(r, {})), merged.groups)
        earlier = folder.markers.read_all(merge_outputs_phase(segment.index))
        if any("outputs" not in m for m in earlier.values()):
            # A run folder whose merge tasks ran before the groups were cut by rows: keep its groups (by
            # count), or a resumed run would merge some outputs twice and others not at all.
            writers = step.rounds * step.partitions
            bounds = [group_writers(writers, merged.groups, g).start for g in range(merged.groups)] + [writers]
        return tuple(
            Task(partition_key(g * merged.ranges + j), (segment, g, j, bounds[g], bounds[g + 1]))
            for g in range(merged.groups)
            for j in range(merged.ranges)
        )

    return listed


def _round_tasks(
    segment: Segment, step: PartitionStep, round: int, forwarded: dict[int, bool], every: tuple[Task, ...]
) -> TaskList:
    """The tasks of a round (``every``: one per partition, or its merge tasks); a round after one that
    forwarded nothing has none (a stage planning more rounds than its data needs, e.g. minhash's
    star rounds, pays nothing for the rest). ``forwarded`` caches what finished rounds' markers say
    (they never change once written), so listing round r reads one round's markers, not r rounds'
    (P x R^2 reads, on object stores too)."""
    if round == 0:
        return every

    def listed(folder: RunFolder) -> tuple[Task, ...] | None:
        for r in range(round):  # from round 0: a round with no tasks forwards nothing
            if r not in forwarded:
                done = folder.markers.read_all(shuffle_phase(segment.index, r))
                markers = [done.get(partition_key(p)) for p in range(step.partitions)]
                if any(m is None for m in markers):
                    return None  # not known until that round is done
                forwarded[r] = any(m.get("forwarded", 0) for m in markers)  # type: ignore[union-attr]
            if not forwarded[r]:
                return ()
        return every

    return listed


def largest_first(shards: tuple[Shard, ...]) -> list[Shard]:
    """Map tasks in the order they are submitted: largest input first (ties in run order). Ray starts
    tasks in about the order they were submitted, so the longest ones no longer come last, on one
    core while the others idle (greedy longest-processing-time order). Outputs are named by shard,
    so the order changes nothing in them."""
    return sorted(shards, key=lambda s: -s.nbytes)


def line_tasks(spec: RunSpec) -> list[Shard]:
    """Ranges of split files whose record count a later range needs (every one but the last), where
    the format numbers records across the file (``ReaderSpec.prepass_count``)."""
    return [
        s
        for s in spec.shards
        if len(s.inputs) == 1 and s.inputs[0].part < s.inputs[0].parts - 1 and reader_spec(s.format).prepass_count is not None
    ]


def _pack_tasks(folder: RunFolder, spec: RunSpec) -> tuple[Task, ...] | None:
    ranges = pack_ranges(folder, spec)  # None until every final map task is done
    return None if ranges is None else tuple(Task(r.key, (r,)) for r in ranges)


def _segment_resources(spec: RunSpec, segment: Segment) -> dict[str, Any]:
    positions = [*segment.stages, *(p for p in (segment.apply_global, segment.compute_global) if p)]
    stages = [build_stage(spec, p) for p in positions]
    cpus = max([1.0, *(s.resources.num_cpus for s in stages)])
    memory = sum(s.resources.memory_mb for s in stages)
    # GPUs only for the stages whose compute runs here: applying a global stage's decisions needs none
    gpus = max([0.0, *(r.num_gpus for r in _computing_resources(spec, segment))])
    return {"num_cpus": cpus, **({"memory": memory * 1024 * 1024} if memory else {}), **({"num_gpus": gpus} if gpus else {})}


def _computing_resources(spec: RunSpec, segment: Segment) -> list[Resources]:
    positions = [*segment.stages, *([segment.compute_global] if segment.compute_global else [])]
    return [build_stage(spec, p).task_resources() for p in positions]
