"""The data of global work: the steps a global stage declares (``PartitionStep``, ``CombineStep``), what a
partition returns (``PartitionResult``) and what reduce and combine read (``ReduceInputs``). Plain values with
no behaviour of the stage contract, so ``stages.base`` can name them without importing ``global_stage``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

# ``partitions:`` of a global stage: the parts its keys are hashed into, a number, or "auto", resolved when
# the run is planned to one part per map task (engine/plan.py ``resolve_partitions``). Map tasks already
# grow with the corpus at a bounded size each, so a part holds about one map task's keys at any scale;
# the engine runs a round's parts in tasks of about ``split.partition_rows`` rows (and at most about
# ``split.partition_bytes``) each, a range of parts per task, and calls ``reduce`` once per part
# (engine/shuffles.py).
MAX_PARTITIONS = 1 << 30  # a part number is an int32
Partitions = Annotated[int, Field(ge=1, le=MAX_PARTITIONS)] | Literal["auto"]


def partitions_option(what: str) -> Any:
    """The ``partitions`` field of a global stage's options (``what``: what the partitions are)."""
    return Field(
        "auto",
        description=(
            f"{what}: the parts keys are hashed into (a number), or auto: one per map task, so a part holds about "
            "one map task's keys however large the corpus (resolved when the run is planned; recorded in "
            "run.json). The engine reduces each part on its own, in tasks of about split.partition_rows rows "
            "(fewer when wide rows reach split.partition_bytes)."
        ),
    )


def partition_count(value: int | str) -> int:
    """The number a ``partitions`` option stands for; "auto" must have been resolved by the planner."""
    if isinstance(value, int):
        return value
    raise ValueError("partitions: auto is resolved when the run is planned (engine/plan.py resolve_partitions)")


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
    # Partition p reads rows of the map outputs (``ReduceInputs.read_rows``) of the shards whose
    # ordinal is p modulo ``partitions`` only (minhash: the owner answers for them): the engine
    # places it on the node that wrote those map outputs, which reads them from its own mirror.
    owner_reads: bool = False
    # What each round does, in words, for progress lines ("training vectors"); rounds past the
    # tuple (or all of them, without one) are shown as "round r of R".
    round_names: tuple[str, ...] = ()

    def describe(self, round: int) -> str:
        """What round ``round`` (0-based) is, for a person: ``training vectors``, ``round 3 of 7``,
        ``verifying pairs (round 3 of 7)``."""
        name = self.round_names[round] if round < len(self.round_names) else ""
        if self.rounds == 1:
            return name or "grouping by key"
        where = f"round {round + 1} of {self.rounds}"
        return f"{name} ({where})" if name else where


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
    # False: the step reads map outputs only through ``ReduceInputs.read_rows`` (a few rows of each),
    # never ``files`` by path; in a remote run folder those rows are then read in place instead of
    # every map output being downloaded to the combine task's node first.
    reads_files: bool = True
    name: str = "combining"  # what it does, for progress lines ("finding the sample's threshold")


GlobalStep = PartitionStep | CombineStep


@dataclass(frozen=True)
class PartitionResult:
    output: pa.Table | None  # the partition's result (decisions, when its step ``decides``)
    forward: pa.Table | None = None  # rows for the next round, with an int32 ``part`` column
    # Rows for ``GlobalStage.apply`` (int32 ``shard`` column): each shard's map task reads its rows
    # of every partition's state, as it does those of ``CombineStep.state``.
    state: pa.Table | None = None


@dataclass(frozen=True)
class ReduceInputs(ABC):
    """The map outputs a global stage's steps read, in the run's deterministic shard order.

    The engine provides them (``datapipe.engine.tasks.reduce_inputs``); a step reads documents it
    holds row keys of with ``read_rows``, or whole files (classify's histograms)."""

    files: list[str]  # one Parquet file per shard, in shard order
    shards: list[int]  # shard ordinal of each file
    scratch_dir: str  # for spilling; inside the run folder
    # For a combine step: the rows the last round of the partition step forwarded (Parquet files),
    # i.e. the work its partitions left unfinished.
    forwarded: tuple[str, ...] = ()
    # A folder of the run folder, the stage's own, for files a step keeps as outputs of the run (a
    # model classify trains on the run's annotations); created on first use. "" where there is none.
    outputs_dir: str = ""
    # Called with a file of ``files`` before it is opened (in a remote run folder: downloads it), so a
    # step that reads a few map outputs does not pull every one onto its node. None: read as they are.
    fetch: Callable[[str], str] | None = None

    @abstractmethod
    def read_rows(self, row_keys: np.ndarray, columns: list[str]) -> pa.Table:
        """The given columns of the documents with these row keys, in the order of ``row_keys``."""

    def read_shard(self, ordinal: int, columns: list[str]) -> pa.Table:
        """The given columns of every document of one shard's map output, in row order (row i is the
        document with row key ``row_keys(ordinal, 0, n)[i]``, ``datapipe.stages.row_keys``)."""
        import pyarrow.parquet as pq

        path = self.files[self.shards.index(ordinal)]
        return pq.read_table(self.fetch(path) if self.fetch is not None else path, columns=columns)
