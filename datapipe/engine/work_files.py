"""The engine's own files in a run folder: the phases' names and every ``_work/`` path of a global step.

Nothing outside the engine reads these (the run folder's public face is ``run_folder/layout.py``),
so a global step gains an intermediate file here without changing what the audit, the exports,
training or the loader read. The names on disk are the ones runs have always had: a folder started
by an earlier datapipe resumes (its markers name these phases, its tasks' outputs these files).

    _work/map<S>/<shard>.parquet                 a map task's rows for the global stage ending segment S
    _work/shuffle<S>[r<R>]/<shard>.parquet       a map task's rows routed to partitions (round R)
    _work/merge<S>[r<R>][l<L>]/<group>-<range>.parquet   a shuffle round's runs merged, level L, by part
    _work/merge<S>d[l<L>]/<kind>-<group>-<range>.parquet  a deciding shuffle's outputs merged, by shard
    _work/shuffle<S>-r<R>/<task>.parquet         rows a partition task hands to the next round
    _work/reduce<S>/<shard>.parquet              a combine step's decisions for one shard
    _work/reduce<S>-parts/...                    a deciding partition's decisions, state and copies
    _work/reduce<S>-state.parquet, -copies.parquet   a combine step's state and copies
    _work/reduce<S>-scratch/                     spill space (DuckDB, sorts): local, never committed
    _work/stage<NN>-<stage>/<shard>/             a stage's own files for one map task (local)
    _work/aggregates/l<L>/<first>-<end>.parquet  the map tasks' aggregate files merged, level L of the
                                                 tree (engine/aggregate_tree.py)
"""

from __future__ import annotations

import shutil
from pathlib import Path

from datapipe.run_folder.layout import WORK_DIR, RunFolder
from datapipe.storage.atomic import temp_path_for

# Phase names: each is the folder of its completion markers (``_work/markers/<phase>/``) and, for
# map, shuffle and reduce, of its outputs, so a resumed run finds work by these exact names.
# (The pre-pass ``lines`` and ``pack`` are named in run_folder/layout.py: integrity checks read them.)


def map_phase(segment: int) -> str:
    return f"map{segment}"


def shuffle_phase(segment: int, round: int = 0) -> str:
    """A shuffle round's phase: round 0 keeps the name runs had before rounds."""
    return f"shuffle{segment}" if round == 0 else f"shuffle{segment}r{round}"


def merge_phase(segment: int, round: int = 0, level: int = 1) -> str:
    """A merge level before a shuffle round: its runs merged with bounded fan-in (engine/shuffle_plan.py);
    level 1 keeps the name runs had before levels."""
    name = f"merge{segment}" if round == 0 else f"merge{segment}r{round}"
    return name if level == 1 else f"{name}l{level}"


def merge_outputs_phase(segment: int, level: int = 1) -> str:
    """A merge level of a deciding shuffle's partition outputs, after its last round (engine/shuffle_plan.py)."""
    return f"merge{segment}d" if level == 1 else f"merge{segment}dl{level}"


def reduce_phase(segment: int) -> str:
    return f"reduce{segment}"


def aggregates_phase(level: int) -> str:
    """A level of the tree that merges the map tasks' aggregate files (engine/aggregate_tree.py)."""
    return f"aggregates{level}"


# What a deciding partition writes for the next map tasks, each file sorted by ``shard``: its
# decisions, its ``PartitionResult.state`` and the copies it dropped, by their survivor's shard.
OUTPUT_KINDS = ("decisions", "state", "copies")


def partition_key(partition: int) -> str:
    """The task key (marker name) of one partition of a shuffle round."""
    return f"{partition:05d}"


class WorkFiles:
    """The ``_work/`` paths of ``folder``'s global steps. A path asked with ``fetch`` (the default) is
    downloaded first in a remote run folder when a committed marker names it; ``fetch=False``: its
    path in the mirror only (``RunFolder.is_committed`` and ``RunFolder.parquet`` then ask), so a
    reader of a few files does not pull every one onto its node."""

    def __init__(self, folder: RunFolder) -> None:
        self.folder = folder
        self.dir = folder.work

    def _at(self, path: Path, fetch: bool = True) -> Path:
        return self.folder.fetched(path) if fetch else path

    def map_output(self, segment: int, shard_key: str, fetch: bool = True) -> Path:
        return self._at(self.folder.root / self.map_output_rel(segment, shard_key), fetch)

    @staticmethod
    def map_output_rel(segment: int, shard_key: str) -> str:
        """``map_output`` as a path in the run folder, as text: the driver names each task's inputs so,
        and pathlib's joins and ``relative_to`` were most of a map task's planning (issue 48)."""
        return f"{WORK_DIR}/{map_phase(segment)}/{shard_key}.parquet"

    def decisions_file(self, segment: int, shard_key: str) -> Path:
        return self._at(self.folder.root / self.decisions_rel(segment, shard_key))

    @staticmethod
    def decisions_rel(segment: int, shard_key: str) -> str:
        return f"{WORK_DIR}/{reduce_phase(segment)}/{shard_key}.parquet"

    def shuffle_file(self, segment: int, shard_key: str, fetch: bool = True) -> Path:
        return self._at(self.folder.root / self.shuffle_file_rel(segment, shard_key), fetch)

    @staticmethod
    def shuffle_file_rel(segment: int, shard_key: str) -> str:
        """``shuffle_file`` as a path in the run folder, as text (the driver names every map task's so)."""
        return f"{WORK_DIR}/{shuffle_phase(segment)}/{shard_key}.parquet"

    def partition_output(self, segment: int, partition: int, round: int = 0, fetch: bool = True) -> Path:
        return self.partition_file("decisions", segment, partition, round, fetch)

    def partition_state(self, segment: int, partition: int, round: int = 0, fetch: bool = True) -> Path:
        """A partition's rows for the applying map tasks (``PartitionResult.state``)."""
        return self.partition_file("state", segment, partition, round, fetch)

    def partition_copies(self, segment: int, partition: int, round: int = 0, fetch: bool = True) -> Path:
        """The copies a partition dropped, by their survivor's shard: for the survivors' map tasks."""
        return self.partition_file("copies", segment, partition, round, fetch)

    def partition_file(self, kind: str, segment: int, partition: int, round: int = 0, fetch: bool = True) -> Path:
        """A deciding partition's output of one ``kind`` (``OUTPUT_KINDS``)."""
        return self._at(self.folder.root / self.partition_file_rel(kind, segment, partition, round), fetch)

    @staticmethod
    def partition_file_rel(kind: str, segment: int, partition: int, round: int = 0) -> str:
        """``partition_file`` as a path in the run folder, as text (the driver names every partition's so)."""
        assert kind in OUTPUT_KINDS, kind
        key = partition_key(partition)
        if kind == "decisions":
            name = f"{key}.parquet" if round == 0 else f"r{round}-{key}.parquet"
        else:
            name = f"{kind}-r{round}-{key}.parquet"
        return f"{WORK_DIR}/{reduce_phase(segment)}-parts/{name}"

    def forward_file(self, segment: int, round: int, partition: int, fetch: bool = True) -> Path:
        """Rows partition ``partition`` of round ``round`` hands to the next round, by their ``part``."""
        return self._at(self.folder.root / self.forward_file_rel(segment, round, partition), fetch)

    @staticmethod
    def forward_file_rel(segment: int, round: int, partition: int) -> str:
        return f"{WORK_DIR}/{shuffle_phase(segment)}-r{round}/{partition_key(partition)}.parquet"

    def merged_run(self, segment: int, round: int, level: int, key: str, fetch: bool = True) -> Path:
        """A merge task's run of a shuffle round's rows (engine/tasks/merge.py): ``key`` is its (group,
        range) (``shuffle_plan.merge_key``)."""
        return self._at(self.folder.root / self.merged_run_rel(segment, round, level, key), fetch)

    @staticmethod
    def merged_run_rel(segment: int, round: int, level: int, key: str) -> str:
        return f"{WORK_DIR}/{merge_phase(segment, round, level)}/{key}.parquet"

    def merged_outputs(self, segment: int, level: int, kind: str, key: str, fetch: bool = True) -> Path:
        """A merge task's run of a deciding shuffle's partition outputs of one ``kind`` (``OUTPUT_KINDS``:
        decisions, states, copies), sorted by ``shard``."""
        return self._at(self.folder.root / self.merged_outputs_rel(segment, level, kind, key), fetch)

    @staticmethod
    def merged_outputs_rel(segment: int, level: int, kind: str, key: str) -> str:
        assert kind in OUTPUT_KINDS, kind
        return f"{WORK_DIR}/{merge_outputs_phase(segment, level)}/{kind}-{key}.parquet"

    def state_file(self, segment: int) -> Path:
        return self._at(self.folder.root / self.state_rel(segment))

    @staticmethod
    def state_rel(segment: int) -> str:
        return f"{WORK_DIR}/{reduce_phase(segment)}-state.parquet"

    def combine_copies_file(self, segment: int) -> Path:
        """The copies the combine step dropped, sorted by their survivor's shard (each map task reads its own)."""
        return self._at(self.folder.root / self.combine_copies_rel(segment))

    @staticmethod
    def combine_copies_rel(segment: int) -> str:
        return f"{WORK_DIR}/{reduce_phase(segment)}-copies.parquet"

    @staticmethod
    def aggregates_merged_rel(level: int, key: str) -> str:
        """A merge task's aggregate file, relative to the run folder (``key``: the slots it covers)."""
        return f"{WORK_DIR}/aggregates/l{level}/{key}.parquet"

    def aggregates_merged(self, level: int, key: str, fetch: bool = True) -> Path:
        return self._at(self.folder.root / self.aggregates_merged_rel(level, key), fetch)

    def scratch_dir(self, segment: int) -> Path:
        """Spill space of the global stage ending ``segment`` (DuckDB, sorts): local, never committed."""
        return self.dir / f"{reduce_phase(segment)}-scratch"

    def stage_work_dir(self, position: int, stage: str, shard_key: str, earlier: RunFolder | None = None) -> Path:
        """A stage's own folder for one map task (``Stage.start_task``): kept across attempts of the
        task, so what the stage paid for once (a model's answers) is not asked again. Local to the
        node that runs the task, like the spill space: never committed to a remote run folder.

        ``earlier``: the run re-decided from (``run --from``, the same tasks): its folder for this task
        is copied in first, so what the earlier run paid for (annotate's answers, found by request
        hash) is not paid again here."""
        work = self.dir / f"stage{position:02d}-{stage}" / shard_key
        if earlier is not None and not work.exists():
            carry_over(WorkFiles(earlier).stage_work_dir(position, stage, shard_key), work)
        return work


# The stages' own folders (``stage_work_dir``): kept by ``--fresh`` (RunFolder.wipe's ``keep``), since
# what they hold was paid for and is found by what was asked (annotate: the request's hash), never by run.
STAGE_WORK = f"{WORK_DIR}/stage[0-9][0-9]-*"


def carry_over(earlier: Path, work: Path) -> None:
    """A copy of ``earlier`` (a stage's task folder of another run) at ``work``, made whole before it is
    seen there (a copy under a temporary name, renamed), or nothing when there is no such folder."""
    if not earlier.is_dir():
        return
    part = temp_path_for(work)  # a killed copy is swept as any temporary file
    work.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(earlier, part)
    part.rename(work)
