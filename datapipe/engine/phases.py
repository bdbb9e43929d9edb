"""The run as data: the ordered phases of a ``RunSpec``, each with its tasks, resources and task function.

    lines                   records per range of a split file whose format numbers them across the
                            file (JSONL lines; ReaderSpec.prepass_count): a pre-pass
    map<i>                  one task per input shard: read or load, stages, compute the next global stage
    merge<i>[r<r>][l<l>]    a shuffle round's runs merged, level by level, while a part is held by more
                            runs than ``split.shuffle_fan_in`` (engine/shuffles.py)
    shuffle<i>[r<r>]        a global stage's ``PartitionStep``: per round, tasks of about
                            ``split.partition_rows`` rows, each a range of parts (none in a round after
                            one that forwarded nothing)
    merge<i>d[l<l>]         after the last round: the partition outputs merged by shard, for the next map tasks
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from datapipe.engine import aggregate_tree, work_files
from datapipe.engine.pack_plan import pack_ranges
from datapipe.engine.plan import RunSpec, Segment, Shard, build_stage
from datapipe.engine.shuffles import StepShuffle
from datapipe.engine.tasks.aggregates import merge_aggregates
from datapipe.engine.tasks.map import count_range_lines, map_shard
from datapipe.engine.tasks.merge import merge_outputs, merge_runs
from datapipe.engine.tasks.pack import pack_range
from datapipe.engine.tasks.reduce import reduce_partition, reduce_stage
from datapipe.engine.work_files import (
    OUTPUT_KINDS,
    WorkFiles,
    map_phase,
    merge_outputs_phase,
    merge_phase,
    partition_key,
    reduce_phase,
    shuffle_phase,
)
from datapipe.readers import reader_spec
from datapipe.run_folder.layout import LINES_PHASE, PACK_PHASE, RunFolder
from datapipe.run_folder.remote import CommittedPhase
from datapipe.stages.base import Resources
from datapipe.stages.global_stage import CombineStep, GlobalStage, PartitionStep, checked_steps, step_of


@dataclass(frozen=True)
class Task:
    """One unit of work: ``key`` names its marker; the phase's function is called as ``fn(spec, *args)``
    (args picklable: they travel to a Ray worker)."""

    key: str
    args: tuple[Any, ...]
    # The Ray node to run it on when it is there (set by the runner from ``Phase.follows``); None: anywhere.
    node: str | None = None
    # A remote run folder: the committed entries of the files (and markers) this task reads by path, from
    # the driver (set by the runner from ``Phase.inputs``; run_folder/remote.py ``install``): a worker
    # holds its current task's inputs only, never a table of the run's files. None: a local folder, or
    # the driver's own process (which holds every committed marker).
    committed: CommittedPhase | None = None

    def on(self, node: str) -> Task:
        """This task placed on ``node`` (made directly: ``dataclasses.replace`` costs ~10x more, per task)."""
        return Task(self.key, self.args, node, self.committed)

    def handed(self, committed: CommittedPhase) -> Task:
        """This task with the committed entries of what it reads (``committed``)."""
        return Task(self.key, self.args, self.node, committed)


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
    # What a task reads by path of earlier phases' files (paths in the run folder) and markers ((phase,
    # task key)): the runner hands it their committed entries (``Task.committed``). The runs a task is
    # handed as ``RunFile`` values carry their own; None: nothing else.
    inputs: Callable[[Task], tuple[list[str], list[tuple[str, str]]]] | None = None
    # Whether ``inputs`` is the same for every task (a partition step reading any document's rows is handed
    # every map output): the runner makes their committed entries once and every task shares them (one
    # object in Ray's store), instead of one table of every map output per task (O(shards x partitions):
    # ~4 GB in the driver at 10 TB's 37,253 map tasks x 1,252 exact-dedup partitions).
    same_inputs: bool = False
    # Whether its tasks read the spec's shards (a combine step over every map output, a partition step
    # reading any document's rows, bestfit packing): the others get the spec without them, and each map
    # task its own shard (the shards pickled for every task cost 87 ms at 37,253 shards, 0.9 s at 372,530).
    full_spec: bool = False
    # What the phase does, for a person: the stage and its step ("minhash: verifying pairs (round 3
    # of 7)", "semantic: training vectors"); progress shows it instead of the marker folder's name.
    label: str = ""
    # A remote run folder: the ``_work/`` folders no phase from this one on reads (``prune_after``), which
    # each node deletes from its mirror before its next task (the store keeps them: resume reads there).
    prune: tuple[str, ...] = ()

    def placed(self, tasks: Sequence[Task], ran_on: dict[str, str]) -> list[Task]:
        """``tasks``, each with the node that wrote most of what it reads (``ran_on``: task key of
        ``follows`` -> its node, from the markers)."""
        out = []
        for task in tasks:
            weights: dict[str, int] = {}
            for key, weight in self.reads(task) if self.reads is not None else [(task.key, 1)]:
                if (node := ran_on.get(key)) is not None:
                    weights[node] = weights.get(node, 0) + weight
            out.append(task.on(max(sorted(weights), key=weights.__getitem__)) if weights else task)
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
    shuffle: StepShuffle | None = None  # the partition step the next map tasks apply, if any
    for segment in spec.segments:
        # SPREAD: input shards are I/O-heavy; spreading them uses every node's disks and network.
        phases.append(
            Phase(
                map_phase(segment.index),
                map_shard,
                _map_tasks(spec, segment, shuffle),
                {**_segment_resources(spec, segment), "scheduling_strategy": "SPREAD"},
                "shards",
                any(r.gpus_required for r in _computing_resources(spec, segment)),
                follows=map_phase(segment.index - 1) if segment.index else None,
                inputs=_map_inputs(spec, segment),
                label=_map_label(spec, segment),
            )
        )
        shuffle = None
        if not segment.final:
            global_phases, shuffle = _global_phases(spec, segment)
            phases += global_phases
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
                inputs=_pack_inputs(spec),
                full_spec=spec.tokenize is not None and spec.tokenize.packing != "concat",  # a split in one task
                label="packing shards",
            )
        )
    phases += _aggregate_phases(spec)
    return phases


def _map_inputs(spec: RunSpec, segment: Segment) -> Callable[[Task], tuple[list[str], list[tuple[str, str]]]]:
    """What a map task reads by path: the segment before's output of its shard and the files a combine
    step wrote for the map tasks; for a range of a file numbered across (JSONL), the pre-pass's markers
    of the file's ranges before it."""

    def inputs(task: Task) -> tuple[list[str], list[tuple[str, str]]]:
        shard = task.args[0]
        markers = []
        if segment.index == 0:
            piece = shard.inputs[0]
            if len(shard.inputs) == 1 and piece.part and reader_spec(piece.format).prepass_count is not None:
                prefix = shard.key.rsplit(".part", 1)[0]
                markers = [(LINES_PHASE, f"{prefix}.part{j:04d}") for j in range(piece.part)]
            return [], markers
        before = segment.index - 1
        # As text: this runs for every map task (pathlib's joins were most of its planning: issue 48).
        paths = [
            WorkFiles.map_output_rel(before, shard.key),
            WorkFiles.decisions_rel(before, shard.key),  # its combine decisions
            WorkFiles.state_rel(before),
            WorkFiles.combine_copies_rel(before),
        ]
        return paths, markers

    return inputs


def _pack_inputs(spec: RunSpec) -> Callable[[Task], tuple[list[str], list[tuple[str, str]]]]:
    """A pack task's token files (of its shards; every shard of its source for a split packed in one task)."""
    made: list[RunFolder] = []  # made once: a RunFolder costs ~1 ms

    def inputs(task: Task) -> tuple[list[str], list[tuple[str, str]]]:
        rng = task.args[0]
        keys = [k for k, _ in rng.shard_tokens] if rng.n_files is not None else [s.key for s in spec.shards_of(rng.source)]
        if not made:
            made.append(RunFolder(Path(spec.root)))
        folder = made[0]
        return [_rel(folder, folder.tokens_file(k, fetch=False)) for k in keys], []

    return inputs


def prune_after(spec: RunSpec) -> dict[str, tuple[str, ...]]:
    """Phase -> the ``_work/`` folders (paths in the run folder) no later phase reads once it is done, so
    each node's mirror keeps only what later phases may still read there (a crawl's map outputs,
    shuffle runs and merged runs are each the corpus's size: ~1 TB per node at 10 TB kept whole).
    A round's runs (its writers' and merge levels') go when its partitions are done; a segment's map
    outputs and its step's outputs when the next map phase is; the token files when packing is."""
    out: dict[str, list[str]] = {}
    work = "_work"
    for segment in spec.segments:
        if segment.final or segment.compute_global is None:
            continue
        s = segment.index
        step = step_of(build_stage(spec, segment.compute_global), PartitionStep)
        shuffle = StepShuffle(spec, segment, step) if step is not None else None
        rounds = step.rounds if step is not None else 0
        for r in range(rounds):
            assert shuffle is not None
            gone = [f"{work}/{merge_phase(s, r, level)}" for level in range(1, shuffle.max_levels(r) + 1)]
            gone.append(f"{work}/{shuffle_phase(s)}" if r == 0 else f"{work}/{shuffle_phase(s)}-r{r - 1}")
            out.setdefault(shuffle_phase(s, r), []).extend(gone)
        after_next = [f"{work}/{map_phase(s)}", f"{work}/{reduce_phase(s)}-parts", f"{work}/{reduce_phase(s)}"]
        after_next += (
            [f"{work}/{merge_outputs_phase(s, level)}" for level in range(1, shuffle.max_output_levels() + 1)] if shuffle else []
        )
        after_next += [f"{work}/{shuffle_phase(s)}-r{rounds - 1}", f"{work}/{reduce_phase(s)}-scratch"] if rounds else []
        out.setdefault(map_phase(s + 1), []).extend(after_next)
    if spec.tokenizer is not None:
        out[PACK_PHASE] = [f"{work}/tokens"]
    return {k: tuple(v) for k, v in out.items()}


def _map_tasks(spec: RunSpec, segment: Segment, shuffle: StepShuffle | None) -> TaskList:
    """A map phase's tasks, largest first: each shard with the runs holding its rows of the partition
    step it applies (known once that step's outputs are merged), or none."""
    order = largest_first(spec.shards)
    if shuffle is None:
        return tuple(Task(s.key, (s, segment)) for s in order)

    def listed(folder: RunFolder) -> tuple[Task, ...] | None:
        grids = shuffle.final_outputs(folder)
        if grids is None:
            return None
        held = {k: g.holding_each(len(spec.shards)) for k, g in grids.items()}
        runs: dict[tuple[int, ...], dict[str, tuple[Any, ...]]] = {}  # one dict per combination of runs, shared
        tasks = []
        for s in order:
            each = {k: held[k][s.ordinal] for k in held}
            shared = runs.setdefault(tuple(id(v) for v in each.values()), each)
            tasks.append(Task(s.key, (s, segment, shared)))
        return tuple(tasks)

    return listed


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
            # The files it merges, handed to its worker: on another node than their writers' they are
            # fetched from the store (without them, a remote run of more than FAN_IN map outputs on
            # several nodes failed here: the mirror had no such file).
            inputs=lambda task: (list(task.args[3]), []),
        )
        for level in range(1, depth + 1)
    ]


def _global_phases(spec: RunSpec, segment: Segment) -> tuple[list[Phase], StepShuffle | None]:
    """The phases of the global stage that ends ``segment``, from the steps it declares, and its
    partition step's shuffle (what the next map tasks read of it)."""
    assert segment.compute_global is not None
    stage = build_stage(spec, segment.compute_global)
    assert isinstance(stage, GlobalStage)
    wants = stage.step_resources()
    cpus = wants.num_cpus
    steps = {"num_cpus": cpus, **({"num_gpus": wants.num_gpus} if wants.num_gpus else {})}  # a GPU share: semantic
    phases: list[Phase] = []
    shuffle: StepShuffle | None = None
    for step in checked_steps(stage):
        if isinstance(step, PartitionStep):
            shuffle = StepShuffle(spec, segment, step)
            for r in range(step.rounds):
                for level in range(1, shuffle.max_levels(r) + 1):
                    phases.append(
                        Phase(
                            merge_phase(segment.index, r, level),
                            merge_runs,
                            _merge_tasks(shuffle, segment, r, level),
                            {"num_cpus": 1, "scheduling_strategy": "SPREAD"},
                            "merges",
                            label=f"{stage.name}: merging the inputs of {step.describe(r)} (level {level})",
                        )
                    )
                phases.append(
                    Phase(
                        shuffle_phase(segment.index, r),
                        reduce_partition,
                        _partition_tasks(shuffle, segment, r),
                        {**steps, "scheduling_strategy": "SPREAD"},
                        "partitions",
                        wants.gpus_required,
                        # The map outputs a partition answers from, read where they were written.
                        follows=map_phase(segment.index) if step.owner_reads else None,
                        reads=_owned_shards(spec) if step.owner_reads else None,
                        # A step reading any document's rows is handed every map output (as a table per task).
                        inputs=None if step.owner_reads else _all_map_outputs(spec, segment),
                        same_inputs=not step.owner_reads,
                        full_spec=not step.owner_reads,
                        label=f"{stage.name}: {step.describe(r)}",
                    )
                )
            for level in range(1, shuffle.max_output_levels() + 1):
                phases.append(
                    Phase(
                        merge_outputs_phase(segment.index, level),
                        merge_outputs,
                        _output_merge_tasks(shuffle, segment, level),
                        {"num_cpus": 1, "scheduling_strategy": "SPREAD"},
                        "merges",
                        label=f"{stage.name}: gathering decisions",
                    )
                )
        elif isinstance(step, CombineStep):
            phases.append(
                Phase(
                    reduce_phase(segment.index),
                    reduce_stage,
                    _combine_tasks(spec, segment, stage.name, shuffle),
                    steps,
                    "steps",
                    wants.gpus_required,
                    inputs=_combine_inputs(spec, segment),
                    full_spec=True,
                    label=f"{stage.name}: {step.name}",
                )
            )
        else:
            raise TypeError(f"stage {stage.name!r} declares an unknown step {step!r}")
    return phases, shuffle


def _all_map_outputs(spec: RunSpec, segment: Segment) -> Callable[[Task], tuple[list[str], list[tuple[str, str]]]]:
    every = [WorkFiles.map_output_rel(segment.index, s.key) for s in spec.shards]
    return lambda task: (every, [])


def _combine_inputs(spec: RunSpec, segment: Segment) -> Callable[[Task], tuple[list[str], list[tuple[str, str]]]]:
    """The combine step reads the partition step's outputs and forwarded runs it is handed, and any map output."""
    maps = _all_map_outputs(spec, segment)

    def inputs(task: Task) -> tuple[list[str], list[tuple[str, str]]]:
        given = [rel for part in task.args[1:] for rel in part]  # (segment, outputs, forwarded)
        return [*given, *maps(task)[0]], []

    return inputs


def _merge_tasks(shuffle: StepShuffle, segment: Segment, round: int, level: int) -> TaskList:
    def listed(folder: RunFolder) -> tuple[Task, ...] | None:
        plan = shuffle.merge_plan(folder, round, level)
        return None if plan is None else tuple(Task(t.key, (segment, round, t)) for t in plan[0])

    return listed


def _partition_tasks(shuffle: StepShuffle, segment: Segment, round: int) -> TaskList:
    """A round's partition tasks, each with the map outputs its parts own (``owner_reads``)."""

    def listed(folder: RunFolder) -> tuple[Task, ...] | None:
        readers = shuffle.readers(folder, round)
        if readers is None:
            return None
        if not shuffle.step.owner_reads:
            return tuple(Task(partition_key(t.index), (segment, round, t, None)) for t in readers)
        maps = folder.markers.read_all(map_phase(segment.index))  # once for the phase, not once per task
        return tuple(
            Task(partition_key(t.index), (segment, round, t, shuffle.map_outputs(folder, shuffle.owned(t), maps)))
            for t in readers
        )

    return listed


def _owned_shards(spec: RunSpec) -> Callable[[Task], list[tuple[str, int]]]:
    """A partition task's reads of the map phase before it (``PartitionStep.owner_reads``): the map
    outputs it was handed (its parts' shards), by their bytes: linear in its own shards."""

    def reads(task: Task) -> list[tuple[str, int]]:
        outputs = task.args[3] or ()
        return [(spec.shards[o].key, max(1, f.bytes)) for o, f in outputs]

    return reads


def _output_merge_tasks(shuffle: StepShuffle, segment: Segment, level: int) -> TaskList:
    """One level of the outputs merge, a task per (kind, group, range)."""

    def listed(folder: RunFolder) -> tuple[Task, ...] | None:
        out: list[Task] = []
        for kind in OUTPUT_KINDS:
            plan = shuffle.output_merge_plan(folder, kind, level)
            if plan is None:
                return None
            out += [Task(f"{kind}-{t.key}", (segment, kind, t)) for t in plan[0]]
        return tuple(out)

    return listed


def _combine_tasks(spec: RunSpec, segment: Segment, name: str, shuffle: StepShuffle | None) -> TaskList:
    """The combine step's one task, with the partition step's round-0 outputs and last round's forwarded runs."""
    if shuffle is None:
        return (Task(name, (segment,)),)

    def listed(folder: RunFolder) -> tuple[Task, ...] | None:
        last = shuffle.step.rounds - 1
        first, final = shuffle.readers(folder, 0), shuffle.readers(folder, last)
        if first is None or final is None:
            return None
        root = folder.root
        outputs = tuple(
            WorkFiles(folder).partition_output(segment.index, t.index, 0, fetch=False).relative_to(root).as_posix() for t in first
        )
        forwarded = tuple(
            WorkFiles(folder).forward_file(segment.index, last, t.index, fetch=False).relative_to(root).as_posix() for t in final
        )
        return (Task(name, (segment, outputs, forwarded)),)

    return listed


def _rel(folder: RunFolder, path: Path) -> str:
    return folder.rel(path)


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


# --- a run's phases in this process, for tests and benches that drive them themselves -------------


def run_here(spec: RunSpec, phases: Sequence[Phase]) -> None:
    """Every unfinished task of ``phases``, in order, in this process, its marker written (what the runner
    does with the in-process executor, without a run record or the end of a run)."""
    from datapipe.engine.worker import run_task

    folder = RunFolder(Path(spec.root))
    for phase in phases:
        tasks = phase.task_list(folder)
        assert tasks is not None, f"{phase.name}: its tasks depend on phases that did not run"
        done = folder.markers.read_all(phase.name)
        for task in tasks:
            if task.key not in done:
                run_task(phase.name, task.key, phase.fn, spec, *task.args)


def segment_phases(spec: RunSpec, segment: Segment, map_phase_too: bool = True) -> list[Phase]:
    """The phases of one segment as the run plans them: its map phase (unless not ``map_phase_too``) and
    those of the global stage that ends it."""
    mine = {map_phase(segment.index)} if map_phase_too else set()
    phases = plan_phases(spec)
    names = [p.name for p in phases]
    start = names.index(map_phase(segment.index)) + 1
    end = names.index(map_phase(segment.index + 1)) if map_phase(segment.index + 1) in names else len(names)
    if PACK_PHASE in names[start:end]:
        end = names.index(PACK_PHASE)
    mine |= set(names[start:end])
    return [p for p in phases if p.name in mine]


def shard_outputs(spec: RunSpec, segment: Segment, ordinal: int, kind: str = "decisions") -> pa.Table | None:
    """One shard's rows of ``kind`` (decisions, state, copies) from the partition step ending ``segment``,
    as its next map task reads them (after the step's phases ran: ``run_here``)."""
    from datapipe.engine.tasks.reduce import shard_rows

    stage = build_stage(spec, segment.compute_global)  # type: ignore[arg-type]
    step = next(s for s in checked_steps(stage) if isinstance(s, PartitionStep))
    folder = RunFolder(Path(spec.root))
    grids = StepShuffle(spec, segment, step).final_outputs(folder)
    assert grids is not None, "the step's phases have not all run"
    return shard_rows(folder, grids[kind].holding(ordinal, ordinal + 1), ordinal)
