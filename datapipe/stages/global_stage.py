"""The contract of a global stage: the corpus-wide steps it declares between two map phases.

A stage whose decision needs the whole corpus (dedup, near-dedup, boilerplate, percentile cuts)
declares them with ``GlobalStage.steps()``: a ``PartitionStep`` (split by key over parallel tasks,
in rounds) and/or a ``CombineStep`` (one task). That is the only way: the engine plans and runs a
global stage from its steps alone, so a new one needs no engine change. The steps read the map
outputs through ``ReduceInputs``, which the engine implements (``datapipe.engine.tasks.reduce_inputs``).
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

import numpy as np
import pyarrow as pa

from datapipe.stages.base import Decision, Resources, Stage
from datapipe.stages.row_keys import shard_of
from datapipe.stages.steps import CombineStep, GlobalStep, PartitionResult, PartitionStep, ReduceInputs, partition_count

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
        raise TypeError(
            f"stage {stage.name!r} declares steps {[k.__name__ for k in kinds]}: a global stage "
            f"declares a PartitionStep, a CombineStep, or both in that order"
        )
    if kinds == [PartitionStep] and not steps[0].decides:  # type: ignore[union-attr]
        raise TypeError(
            f"stage {stage.name!r}: its PartitionStep does not decide (decides=True) and no "
            f"CombineStep follows it to read its outputs"
        )
    return steps


# The row key of the survivor a dropped copy names in ``dup_of``: the engine routes the copy's row to
# the survivor's map task too, which indexes the copies of its survivors (``copies/``), and removes
# the column before the decisions are applied.
DUP_OF_KEY = "dup_of_key"


def drop_rows(
    row_keys: np.ndarray,
    ids: pa.Array | pa.ChunkedArray | list[str],
    reason: str,
    detail: pa.Array | pa.ChunkedArray | list[str | None] | None = None,
    dup_of_keys: np.ndarray | None = None,
    **extra: pa.Array,
) -> pa.Table:
    """Decisions that drop the documents with these row keys and ids: what a deciding step returns.

    Columns id, shard (which map task applies the row), reason, detail (null where not given), then
    ``extra`` in the order given (``dup_of``, ...: they go to rejected/ beside the document; typed
    arrays, as an empty list has no type). The row-key layout stays the engine's.

    Copies dropped in favour of a survivor name it twice: its id in ``dup_of`` and its row key in
    ``dup_of_keys``, so that `datapipe explain SURVIVOR` finds them in one file of the survivor's
    task instead of every reject file of the run (a ``dup_of`` without them is a TypeError)."""
    if ("dup_of" in extra) != (dup_of_keys is not None):
        raise TypeError("drop_rows: dup_of (the survivors' ids) and dup_of_keys (their row keys) go together")
    keys = np.asarray(row_keys, dtype=np.int64)
    survivors = {} if dup_of_keys is None else {DUP_OF_KEY: pa.array(np.asarray(dup_of_keys, dtype=np.int64), pa.int64())}
    return pa.table(
        {
            "id": _strings(ids),
            "shard": pa.array(shard_of(keys).astype(np.int32), pa.int32()),
            "reason": pa.array([reason] * len(keys), pa.string()),
            "detail": pa.nulls(len(keys), pa.string()) if detail is None else _strings(detail),
            **extra,
            **survivors,
        }
    )


def no_drops(partition_outputs: list[str], inputs: ReduceInputs) -> pa.Table:
    """A ``CombineStep.decide`` that drops no document (the stage's ``apply`` judges them instead)."""
    return drop_rows(np.empty(0, np.int64), [], "")


def state_rows(row_keys: np.ndarray, **columns: pa.Array) -> pa.Table:
    """Per-document state for ``GlobalStage.apply`` (``PartitionResult.state``, ``CombineStep.state``):
    columns shard (each map task reads its own rows), row_key (compared with ``apply``'s row keys),
    then ``columns``."""
    keys = np.asarray(row_keys, dtype=np.int64)
    return pa.table(
        {"shard": pa.array(shard_of(keys).astype(np.int32), pa.int32()), "row_key": pa.array(keys, pa.int64()), **columns}
    )


def _strings(values: pa.Array | pa.ChunkedArray | list[str | None]) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return values.cast(pa.string()) if isinstance(values, pa.Array) else pa.array(values, pa.string())


class GlobalStage(Stage):
    """A stage whose decision needs the whole corpus (dedup).

    The engine runs it in three parts: ``compute`` in the map phase before it (signals per
    document), the corpus-wide ``steps()`` it declares (a ``PartitionStep`` split by key across
    parallel tasks, and/or a ``CombineStep``, one task), and in the map phase after it the
    decisions are joined to each row by id, then ``apply`` edits what they kept.
    The engine knows global stages only by their steps: a new one declares them and is
    registered like any stage (a line of ``datapipe.stages.STAGES``, or an entry point), with no engine change.

    Document references between the map tasks and the steps are *row keys*: one int64 per document,
    ordered as the run is (the lowest key of a group is its earliest document). A step compares and
    forwards them and turns them into decisions with ``drop_rows`` and into ``apply``'s state with
    ``state_rows``; their layout is defined once, in ``datapipe.stages.row_keys``, which the engine uses too.
    """

    signal_columns: ClassVar[tuple[str, ...]] = ()
    transient_columns: ClassVar[tuple[str, ...]] = ()  # dropped once decisions are applied

    @classmethod
    def global_for(cls, options: Any) -> bool:
        return True

    def step_resources(self) -> Resources:
        """What a task of the steps (a partition round, the combine) asks for: ``resources``' CPUs
        unless the options change it (semantic asks for a GPU share: ``SemanticDedup.step_resources``)."""
        return Resources(num_cpus=self.resources.num_cpus)

    @property
    def partitions(self) -> int:
        """The stage's ``partitions`` option as planned (``auto`` resolved by engine/plan.py)."""
        return partition_count(getattr(self.options, "partitions", 1))

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


class MayBeGlobal:
    """Mixed into a ``GlobalStage`` that is global only with some options (classify with a percentile
    rule, annotate with ``sample.max_docs``): with the others it is a per-document stage, planned in
    its map segment like any other, and its steps and ``apply`` are not used. It says which in
    ``global_for``; there is no default."""

    @classmethod
    def global_for(cls, options: Any) -> bool:
        raise NotImplementedError(f"{cls.__name__}: a stage that may be global says when, in global_for")


# The step values live in stages/steps.py (so stages/base.py can name them); this module is where
# a global stage's author imports the whole contract from.
__all__ = [
    "DUP_OF_KEY",
    "CombineStep",
    "GlobalStage",
    "GlobalStep",
    "MayBeGlobal",
    "PartitionResult",
    "PartitionStep",
    "ReduceInputs",
    "checked_steps",
    "drop_rows",
    "no_drops",
    "state_rows",
    "step_of",
]
