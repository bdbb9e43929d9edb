"""The stage contract: a batch in, signals added as columns, then a separate decision.

Computing and deciding are split (as Data-Juicer does) so thresholds can be re-tuned
from recorded signals without recomputing them, and every drop is explainable:
``decide`` returns, per row, null to keep or a short reason string to drop, plus an
optional human-readable detail (the signal values behind the drop). This is
datatrove's ``filter -> keep | (drop, reason)`` over a whole batch.

Stages know nothing of Ray, the CLI or the run folder. They declare the resources
a task needs (NeMo Curator style) and the engine schedules them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from datapipe.config.sections import SOURCE_KINDS


class StageOptions(BaseModel):
    """Base for stage options: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Resources:
    num_cpus: float = 1.0
    memory_mb: int = 0  # 0: no explicit reservation


@dataclass(frozen=True)
class Decision:
    """Per-row outcome: ``reason`` null keeps the row, a string drops it."""

    reason: pa.Array  # string, null = keep
    detail: pa.Array | None = None  # string, why in numbers; null where not useful

    @staticmethod
    def keep_all(n: int) -> Decision:
        return Decision(pa.nulls(n, pa.string()))


@dataclass(frozen=True)
class StageContext:
    """What a stage may know about where it runs; nothing engine-specific."""

    pipeline_dir: str
    cache_dir: str


Problem = tuple[str, str]  # (key path inside the stage's options, "" for the stage itself; message)


@dataclass(frozen=True)
class CheckContext:
    """What pipeline validation knows when it asks a stage to check its options against the world."""

    pipeline_dir: Path
    kinds: frozenset[str]  # source kinds of the pipeline
    before: tuple[tuple[str, StageOptions], ...] = ()  # (stage type, options) of the stages that run earlier


@dataclass(frozen=True)
class ResourceFile:
    """A file a stage's signals or decisions depend on (rule set, word list, model).

    The run records each one in run.json (path, sha256 and, for small text files, the content), so
    a rerun against a changed file is refused naming it, and ``explain`` grades against what the
    run used rather than today's file.
    """

    path: Path
    role: str  # what it is to the stage: "rules", "word_list", "domain_list", "license_classes", "model"
    key: str | None = None  # the stage's own name for it, e.g. the quality rule-set key "zh_web"
    content: bool = True  # record the text (small data files); False: the hash only (models)
    name: str | None = None  # shown and compared instead of the path (a model found by env or cache)
    sha256: str | None = None  # a pinned hash that stands for the file (lid.176, checked when fetched)


def kinds_problems(kinds: list[str], key: str = "kinds") -> list[Problem]:
    """A kind outside web/code/paper/text matches no source: the stage would silently skip everything."""
    return [(f"{key}[{i}]", f"{k!r} is not a source kind; allowed: {', '.join(SOURCE_KINDS)}")
            for i, k in enumerate(kinds) if k not in SOURCE_KINDS]


class Stage:
    """A per-document stage. Subclasses set ``name`` and ``Options`` and implement compute/decide."""

    name: ClassVar[str]
    Options: ClassVar[type[StageOptions]] = StageOptions
    resources: ClassVar[Resources] = Resources()
    repeatable: ClassVar[bool] = False  # may the stage appear twice in one pipeline?
    is_global: ClassVar[bool] = False  # needs a corpus-wide step between map phases

    def __init__(self, options: StageOptions, context: StageContext) -> None:
        self.options: Any = options
        self.context = context

    @classmethod
    def check(cls, options: Any, context: CheckContext) -> list[Problem]:
        """Everything a run would only find out later (files, model labels, names), checked at validation.

        Must not load big models or read inputs: ``datapipe validate`` stays fast. Returns every
        problem, each with the key path inside the options, so a user fixes the file in one go.
        """
        return []

    @classmethod
    def global_for(cls, options: Any) -> bool:
        """Whether the stage needs a corpus-wide step with these options (classify: only for percentiles)."""
        return cls.is_global

    @classmethod
    def output_columns(cls, options: Any, context: CheckContext) -> set[str] | None:
        """The signal columns the stage adds to every batch; None where they cannot be known up front."""
        return set()

    @classmethod
    def resource_files(cls, options: Any, pipeline_dir: Path) -> list[ResourceFile]:
        """The files besides the pipeline file that the stage's outputs depend on: part of the run's identity.

        Called on the driver for validated options; must be cheap (no model loading). A stage that
        reads a data file it does not list here could resume silently with half a run judged by old rules.
        """
        return []

    def prepare(self) -> None:
        """Called once on the driver before any task: fetch models, fail early with a clear error."""

    def setup(self) -> None:
        """Load models and indexes: called by the engine once per worker process (``build_stage``)
        before the stage's first batch; code that builds a stage itself calls it before ``compute``."""

    def applies_to(self, kind: str) -> bool:
        """Whether documents of this source kind go through the stage (others pass untouched)."""
        return True

    def compute(self, batch: pa.Table) -> pa.Table:
        """Return the batch with this stage's signal columns added (or text transformed)."""
        return batch

    def decide(self, batch: pa.Table) -> Decision:
        """Keep or drop each row of a computed batch, from signals and thresholds only."""
        return Decision.keep_all(batch.num_rows)

    def steps(self) -> tuple[GlobalStep, ...]:
        """The corpus-wide steps a global stage declares (``GlobalStage``); a per-document stage has none."""
        return ()


@dataclass(frozen=True)
class PartitionStep:
    """A corpus-wide step split by key over ``partitions`` parallel tasks, in ``rounds`` rounds.

    ``shuffle(batch, first_row_key)`` runs in the map task before it on each computed batch and
    returns the rows to send, with an int32 ``part`` column (the batch's i-th document has row key
    ``first_row_key + i``: see ``GlobalStage``); ``reduce(rows, round, inputs)`` runs once per
    partition and round over that partition's rows from every shard (round 0) or from what the
    round before forwarded (round r + 1's partition p reads the rows round r forwarded with
    ``part == p``), returning a table or a ``PartitionResult``. With ``decides`` the partition
    outputs (of every round) *are* decisions (id, shard, reason, detail, extra columns), read by
    each shard's next map task; a combine step after it adds its own decisions for what the rounds
    left (the last round's forwarded rows, ``ReduceInputs.forwarded``). Without ``decides`` the
    outputs are for the ``CombineStep`` that must follow.
    """

    partitions: int
    shuffle: Callable[[pa.Table, int], pa.Table]
    reduce: Callable[..., Any]
    rounds: int = 1
    decides: bool = False  # the outputs are decisions (else a CombineStep reads them)


@dataclass(frozen=True)
class CombineStep:
    """One task over the whole corpus: ``decide(partition_outputs, inputs)`` returns the decisions
    (rows id, shard, reason, detail, extra columns for the documents to drop; ``no_drops`` where
    ``apply`` does the work); ``state``, if set, returns the table the map tasks after it load for
    ``GlobalStage.apply`` (None: nothing to load; with an int32 ``shard`` column each map task reads
    only its shard's rows, without one every map task loads it whole, so it must stay small).
    ``partition_outputs`` are the Parquet outputs of a ``PartitionStep`` before it (none without one)."""

    decide: Callable[[list[str], ReduceInputs], pa.Table]
    state: Callable[[list[str], ReduceInputs], pa.Table | None] | None = None


GlobalStep = PartitionStep | CombineStep
_S = TypeVar("_S", PartitionStep, CombineStep)


def step_of(stage: Stage, kind: type[_S]) -> _S | None:
    """The stage's step of this kind (None: it has none, or the stage is not global)."""
    return next((s for s in stage.steps() if isinstance(s, kind)), None)


def checked_steps(stage: Stage) -> tuple[GlobalStep, ...]:
    """The stage's steps, or a TypeError saying what is wrong with them: a ``PartitionStep``, a
    ``CombineStep``, or both in that order; a partition step that does not decide needs a combine step
    after it (its outputs would be read by nothing)."""
    steps = tuple(stage.steps())
    kinds = [type(s) for s in steps]
    if kinds not in ([PartitionStep], [CombineStep], [PartitionStep, CombineStep]):
        raise TypeError(f"stage {stage.name!r} declares steps {[k.__name__ for k in kinds]}: a global stage "
                        f"declares a PartitionStep, a CombineStep, or both in that order")
    if kinds == [PartitionStep] and not steps[0].decides:  # type: ignore[union-attr]
        raise TypeError(f"stage {stage.name!r}: its PartitionStep does not decide (decides=True) and no "
                        f"CombineStep follows it to read its outputs")
    return steps


def no_drops(partition_outputs: list[str], inputs: ReduceInputs) -> pa.Table:
    """A ``CombineStep.decide`` that drops no document (the stage's ``apply`` judges them instead)."""
    return pa.table({"id": pa.array([], pa.string()), "shard": pa.array([], pa.int32())})


class GlobalStage(Stage):
    """A stage whose decision needs the whole corpus (dedup).

    The engine runs it in three parts: ``compute`` in the map phase before it (signals per
    document), the corpus-wide ``steps()`` it declares (a ``PartitionStep`` split by key across
    parallel tasks, and/or a ``CombineStep``, one task), and in the map phase after it the
    decisions are joined to each row by id, then ``apply`` edits what they kept.
    The engine knows global stages only by their steps: a new one declares them and registers
    itself (``datapipe.stages.register_stage``), with no engine change.

    Document references between the map tasks and the steps are *row keys*: ``shard_ordinal << 32 | row``
    where row is the document's position in its shard's map output, so the run order is the key order.
    """

    is_global = True
    signal_columns: ClassVar[tuple[str, ...]] = ()
    transient_columns: ClassVar[tuple[str, ...]] = ()  # dropped once decisions are applied

    def apply(self, batch: pa.Table, row_keys: np.ndarray, state: pa.Table | None) -> tuple[pa.Table, Decision]:
        """In the map segment after the steps, for the documents their decisions kept: edit them.

        A stage that changes kept documents (removes boilerplate lines, adds a cluster size) returns
        the batch with the same rows, edited, and a decision that may drop some of them; a dropped
        row must keep its original text (a reject is never lost). ``row_keys`` are the documents'
        row keys; ``state`` is what ``CombineStep.state`` returned and the partitions' states
        (``PartitionResult.state``), for this shard only where it has a ``shard`` column. The
        default changes nothing.
        """
        return batch, Decision.keep_all(batch.num_rows)


@dataclass(frozen=True)
class PartitionResult:
    output: pa.Table | None  # the partition's result (decisions, when its step ``decides``)
    forward: pa.Table | None = None  # rows for the next round, with an int32 ``part`` column
    # Rows for ``GlobalStage.apply`` (int32 ``shard`` column): each shard's map task reads its rows
    # of every partition's state, as it does those of ``CombineStep.state``.
    state: pa.Table | None = None


ROW_KEY_SHIFT = 32


@dataclass(frozen=True)
class ReduceInputs:
    """The map outputs a global stage reduces over, in the run's deterministic shard order."""

    files: list[str]  # one Parquet file per shard, in shard order
    shards: list[int]  # shard ordinal of each file
    scratch_dir: str  # for spilling; inside the run folder
    memory_limit_mb: int = 4096
    # For a combine step: the rows the last round of the partition step forwarded (Parquet files),
    # i.e. the work its partitions left unfinished.
    forwarded: tuple[str, ...] = ()

    def read_rows(self, row_keys: np.ndarray, columns: list[str]) -> pa.Table:
        """The given columns of the documents with these row keys, in the order of ``row_keys``."""

        row_keys = np.asarray(row_keys, dtype=np.int64)
        order = np.argsort(row_keys, kind="stable")
        sorted_keys = row_keys[order]
        shard_of = sorted_keys >> ROW_KEY_SHIFT
        by_ordinal = dict(zip(self.shards, self.files))
        parts = []
        for ordinal in np.unique(shard_of):
            rows = sorted_keys[shard_of == ordinal] & ((1 << ROW_KEY_SHIFT) - 1)
            parts.append(_read_row_groups_of(by_ordinal[int(ordinal)], rows, columns))
        if not parts:
            return pa.table({c: pa.array([], pa.null()) for c in columns})
        merged = pa.concat_tables(parts)
        return merged.take(pa.array(np.argsort(order, kind="stable")))


def _read_row_groups_of(path: str, rows: np.ndarray, columns: list[str]) -> pa.Table:
    """``columns`` of a Parquet file's rows ``rows`` (sorted), reading only the row groups that hold
    them. Map outputs are written a batch (at most ``batch_size`` documents) per row group, and a
    MinHash partition needs a few rows of each shard: reading whole columns made that cost grow
    with partitions x corpus (bench/scale.py, shuffle1 CPU per document 24 -> 176 us from 1x to 16x)."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as file:
        meta = file.metadata
        starts = np.zeros(meta.num_row_groups + 1, np.int64)
        starts[1:] = np.cumsum([meta.row_group(i).num_rows for i in range(meta.num_row_groups)])
        group_of = np.searchsorted(starts, rows, side="right") - 1
        groups = np.unique(group_of)
        table = file.read_row_groups(groups.tolist(), columns=columns)
    # Where each chosen group begins in ``table``: the groups are read in order, back to back.
    begins = np.zeros(len(groups), np.int64)
    begins[1:] = np.cumsum(starts[groups + 1] - starts[groups])[:-1]
    local = rows - starts[group_of] + begins[np.searchsorted(groups, group_of)]
    return table.take(pa.array(local))
