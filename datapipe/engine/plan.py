"""Turning a pipeline into phases: map segments split by global stages, then packing and statistics.

For ``stages: [langid, length, dedup, X]`` the plan is

    map0:     read -> langid -> length -> dedup.compute     (one Ray task per input shard)
    shuffle0: dedup by text hash, then by URL key          (one task per partition and round)
    map1:     apply dedup decisions -> X -> tokenize        (one task per shard)
    pack:     concatenate tokens into Arrow shards          (one task per range of shard files)
    stats:    stats.duckdb                                  (driver; DuckDB under a memory cap)

A global stage runs the steps it declares (``GlobalStage.steps()``): a ``PartitionStep`` as the
``shuffle<i>`` rounds, a ``CombineStep`` as one ``reduce<i>`` task (classify has only that one;
minhash and boilerplate have both).

Everything a task needs travels in the picklable ``RunSpec``; workers rebuild stage
objects from it, so stages never see Ray.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from datapipe.config.input_names import input_name
from datapipe.config.limits import ReadLimits
from datapipe.config.mixture import RepeatRule, repeat_rules
from datapipe.config.sections import WorkersConfig
from datapipe.engine.splits import InputRange, effective_target, file_size, group_pieces, plan_file, task_key
from datapipe.pipeline.load import Pipeline, SourceConfig, TokenizeConfig
from datapipe.runtime.process_cache import clear_process_caches
from datapipe.stages import STAGES, Stage, StageContext, StageOptions
from datapipe.tokens.encode import TokenizerInfo, load_tokenizer_info, with_engine


@dataclass(frozen=True)
class Shard:
    """One map task's input: a whole file, a range of one (a split large file) or several whole
    small files (grouped), always contiguous in the run's order (engine/splits.py)."""

    ordinal: int  # position in the run's global order: sources in file order, then sorted files, then ranges
    key: str  # "<source>/<NNNNN>[.partPPPP|..<NNNNN>]": names every output of this shard
    source: SourceConfig
    inputs: tuple[InputRange, ...]

    @property
    def path(self) -> str:
        return self.inputs[0].path

    @property
    def nbytes(self) -> int:
        """Input bytes it reads, as planned (0 where unknown: a folder of code)."""
        return sum(r.nbytes for r in self.inputs)

    @property
    def input_name(self) -> str:
        return self.inputs[0].input_name

    @property
    def format(self) -> str:
        return self.inputs[0].format


@dataclass(frozen=True)
class Segment:
    index: int
    apply_global: int | None  # stage position whose reduce decisions are applied first
    stages: tuple[int, ...]  # per-document stage positions, in order
    compute_global: int | None  # global stage whose signals this segment computes last
    final: bool  # writes docs/ (and tokens)


@dataclass(frozen=True)
class Recorded:
    """Signals an earlier run recorded, read instead of computed (``run --from``, engine/redecide.py):
    its run folder, for each reused stage position the columns the stage adds, in the order its
    ``compute`` adds them (a run's outputs keep that order), and whether its documents' token lists
    are reused too (no stage may change a text, and the tokenizer is the same)."""

    root: str
    columns: tuple[tuple[int, tuple[str, ...]], ...]
    tokens: bool = False

    def of(self, position: int) -> tuple[str, ...] | None:
        return dict(self.columns).get(position)


@dataclass(frozen=True)
class RunSpec:
    root: str
    pipeline_dir: str
    cache_dir: str
    fingerprint: str
    batch_size: int
    # (stage type, its options) in order, validated once on the driver: pydantic models pickle, so
    # workers build stages from them without validating again.
    stage_options: tuple[tuple[str, StageOptions], ...]
    # Their classes, pickled by reference (module and name): a worker imports the module of a stage
    # known only to the driver's registry (a test's override) instead of asking its own registry.
    stage_types: tuple[type[Stage], ...]
    segments: tuple[Segment, ...]
    tokenize: TokenizeConfig | None
    tokenizer: TokenizerInfo | None
    limits: ReadLimits
    shards: tuple[Shard, ...] = field(repr=False)
    recorded: Recorded | None = None
    # Source -> how many times each of its documents is packed and exported (mixture.<source>.repeat,
    # rehydrate); computed per document in the final map task (config/mixture.py).
    repeats: dict[str, RepeatRule] = field(default_factory=dict)
    shuffle_fan_in: int = 256  # split.shuffle_fan_in: runs a shuffle's merge or partition task reads at most
    partition_rows: int = 4_000_000  # split.partition_rows: rows a partition task holds, about
    partition_bytes: int = 256 << 20  # split.partition_bytes: and bytes of runs (as written) it reads, about
    merge_memory_bytes: int = 32 << 20  # split.merge_memory_bytes: decoded bytes a merge task buffers, about
    workers: WorkersConfig = field(default_factory=WorkersConfig)  # when a Ray worker is replaced (executors/ray/recycle.py)
    # The run's CPU priority: the driver's niceness. Ray runs its workers 15 steps nicer; a process a
    # stage starts for its own work (fastText training) runs at this one (StageContext.niceness).
    niceness: int = 0

    def stage_name(self, position: int) -> str:
        return self.stage_options[position - 1][0]

    @property
    def stages(self) -> tuple[tuple[str, dict[str, Any]], ...]:
        """(stage type, options as JSON data): the record of what the run's stages were (stats.duckdb)."""
        return tuple((kind, opts.model_dump(mode="json")) for kind, opts in self.stage_options)

    def shards_of(self, source: str) -> list[Shard]:
        return [s for s in self.shards if s.source.name == source]

    @cached_property
    def sources(self) -> list[str]:
        return list(dict.fromkeys(s.source.name for s in self.shards))


_STAGE_CACHE: dict[tuple[str, int, int], Stage] = {}
_SET_UP: set[tuple[str, int, int]] = set()


def forget_stages() -> None:
    """Drop every built stage and what stages loaded (``datapipe/runtime/process_cache.py``): for a worker
    moving on to another phase, so it does not carry the last phase's models into this one."""
    _STAGE_CACHE.clear()
    _SET_UP.clear()
    clear_process_caches()


def build_stage(spec: RunSpec, position: int, setup: bool = False) -> Stage:
    """The stage at ``position`` (1-based; 0 is reading), built once per process.

    ``setup``: also load what its work needs (models, indexes: ``Stage.setup()``), once per process.
    Tasks that run the stage's compute/decide/apply ask for it; the driver, which builds stages only
    to plan (resources, steps) and ``prepare``, does not, so it loads no model it never uses.
    """
    key = (spec.fingerprint, len(spec.shards), position)  # map tasks: `partitions: auto` is resolved from them
    if key not in _STAGE_CACHE:
        kind, options = spec.stage_options[position - 1]
        context = StageContext(spec.pipeline_dir, spec.cache_dir, spec.niceness)
        _STAGE_CACHE[key] = spec.stage_types[position - 1](options, context)
    stage = _STAGE_CACHE[key]
    if setup and key not in _SET_UP:
        stage.setup()
        _SET_UP.add(key)
    return stage


def plan_segments(stages: list[tuple[str, StageOptions]]) -> tuple[Segment, ...]:
    """Split the stages at each one that is global with its options (``Stage.global_for``)."""
    segments: list[Segment] = []
    current: list[int] = []
    apply: int | None = None
    for pos, (kind, options) in enumerate(stages, start=1):
        if STAGES[kind].global_for(options):
            segments.append(Segment(len(segments), apply, tuple(current), pos, False))
            current, apply = [], pos
        else:
            current.append(pos)
    segments.append(Segment(len(segments), apply, tuple(current), None, True))
    return tuple(segments)


def input_bytes(pipeline: Pipeline) -> int:
    """The size of every input file of the pipeline, summed."""
    return sum(file_size(str(p)) for files in pipeline.inputs.values() for p, _ in files)


def split_target(pipeline: Pipeline, cpus: int | None) -> int:
    """Bytes per map task for this corpus on ``cpus`` CPUs (``split:``; see engine/splits.py)."""
    return effective_target(pipeline.config.split, input_bytes(pipeline), cpus)


def resolve_partitions(options: StageOptions, map_tasks: int) -> StageOptions:
    """A global stage's ``partitions: auto`` as a number: one part per map task, so a part holds about one
    map task's keys at any corpus size (no cap: a round's tasks follow its rows, ``split.partition_rows``,
    each a range of parts; engine/shuffles.py). A resumed run forms the same map tasks from the target
    recorded in run.json, so the same parts."""
    if getattr(options, "partitions", None) != "auto":
        return options
    return options.model_copy(update={"partitions": max(1, map_tasks)})


def make_spec(
    pipeline: Pipeline, root: Path, cache_dir: Path, target_bytes: int | None = None, recorded: Recorded | None = None
) -> RunSpec:
    """``target_bytes``: bytes per map task, as the runner chose it for the cluster and recorded in
    run.json (a resumed run must form the same tasks); default ``split.target_bytes``. ``recorded``:
    the signals of an earlier run to reuse (``run --from``)."""
    target = target_bytes or pipeline.config.split.target_bytes
    shards: list[Shard] = []
    for src in pipeline.config.sources:
        ranges: list[InputRange] = []
        for i, (path, fmt) in enumerate(pipeline.inputs[src.name]):
            name = pipeline.input_names.get(src.name, {}).get(path) or input_name(path, str(path), pipeline.base_dir)
            ranges += plan_file(str(path), name, fmt, i, target)
        for pieces in group_pieces(ranges, target, pipeline.config.split.group_small_files):
            shards.append(Shard(len(shards), task_key(src.name, pieces), src, pieces))
    tok_cfg = pipeline.config.tokenize
    tokenizer = with_engine(load_tokenizer_info(pipeline.resolve(tok_cfg.tokenizer), tok_cfg)) if tok_cfg else None
    stages = tuple((kind, resolve_partitions(opts, len(shards))) for kind, opts in pipeline.stage_options)
    return RunSpec(
        root=str(root),
        pipeline_dir=str(pipeline.base_dir),
        cache_dir=str(cache_dir),
        fingerprint=pipeline.fingerprint(),
        batch_size=pipeline.config.batch_size,
        stage_options=stages,
        stage_types=tuple(STAGES[kind] for kind, _ in stages),
        segments=plan_segments(list(stages)),
        tokenize=tok_cfg,
        tokenizer=tokenizer,
        limits=pipeline.config.limits,
        shards=tuple(shards),
        recorded=recorded,
        repeats=repeat_rules(pipeline.config.mixture),
        shuffle_fan_in=pipeline.config.split.shuffle_fan_in,
        partition_rows=pipeline.config.split.partition_rows,
        partition_bytes=pipeline.config.split.partition_bytes,
        merge_memory_bytes=pipeline.config.split.merge_memory_bytes,
        workers=pipeline.config.workers,
        niceness=os.getpriority(os.PRIO_PROCESS, 0),
    )
