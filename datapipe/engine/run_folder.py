"""The run folder: where every output of one pipeline run lives, and how resume finds its place.

    <run>/docs/<source>/<shard>.parquet       kept documents with their signals
    <run>/rejected/<source>/<shard>.<n>-<stage>.parquet
                                              dropped documents: stage, reason, detail, text
    <run>/shards/<source>/<split>-NNNNN.arrow packed token shards (Arrow IPC, uncompressed)
    <run>/shards/manifest.parquet             one row per shard
    <run>/stats.duckdb                        the audit database
    <run>/run.json                            config, versions, inputs, timings, counts
    <run>/_work/                              intermediate outputs and completion markers
    <run>/.datapipe.lock, .datapipe.lock.json the driver's lock and who holds it (engine/run_lock.py)

A task's outputs are renamed into place before its marker is written, so a marker
means "done and durable"; work without a marker is redone on resume. Outputs are read
only by their final names (``*.parquet``, ``*.arrow``, markers by name), never by a
temporary one, and the driver sweeps temporary files of killed processes under its lock.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from datapipe.atomic import is_temp_name, sweep_temp_files, write_text_atomic
from datapipe.shard_format import MANIFEST_NAME, SHARDS_DIR, shard_file_name

DOCS_DIR, REJECTED_DIR, WORK_DIR, STATS_DB, RUN_JSON = "docs", "rejected", "_work", "stats.duckdb", "run.json"
MANAGED = (DOCS_DIR, REJECTED_DIR, SHARDS_DIR, WORK_DIR, STATS_DB, RUN_JSON)
LOCK_FILE = ".datapipe.lock"  # never deleted, not even by --fresh: see run_lock.py
LOCK_RECORD = ".datapipe.lock.json"


# Phase names: each is the folder of its completion markers (``_work/markers/<phase>/``) and, for
# map, shuffle and reduce, of its outputs, so a resumed run finds work by these exact names.
LINES_PHASE = "lines"  # pre-pass: newlines per JSONL range, for global line numbers
PACK_PHASE = "pack"


def map_phase(segment: int) -> str:
    return f"map{segment}"


def shuffle_phase(segment: int, round: int = 0) -> str:
    """A shuffle round's phase: round 0 keeps the name runs had before rounds."""
    return f"shuffle{segment}" if round == 0 else f"shuffle{segment}r{round}"


def reduce_phase(segment: int) -> str:
    return f"reduce{segment}"


def partition_key(partition: int) -> str:
    """The task key (marker name) of one partition of a shuffle round."""
    return f"{partition:05d}"


class RunFolderError(RuntimeError):
    pass


class RunFolder:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    # --- layout -------------------------------------------------------------
    @property
    def run_json(self) -> Path:
        return self.root / RUN_JSON

    @property
    def stats_db(self) -> Path:
        return self.root / STATS_DB

    @property
    def work(self) -> Path:
        return self.root / WORK_DIR

    @property
    def shards_dir(self) -> Path:
        return self.root / SHARDS_DIR

    @property
    def manifest(self) -> Path:
        return self.shards_dir / MANIFEST_NAME

    def shard_file(self, source: str, split: str, index: int) -> Path:
        """A packed token shard (shard_format.py names it: the loader needs the name without the engine)."""
        return self.shards_dir / shard_file_name(source, split, index)

    @property
    def docs_dir(self) -> Path:
        return self.root / DOCS_DIR

    @property
    def rejected_dir(self) -> Path:
        return self.root / REJECTED_DIR

    def docs_file(self, shard_key: str) -> Path:
        return self.docs_dir / f"{shard_key}.parquet"

    def reject_file(self, shard_key: str, position: int, stage: str) -> Path:
        return self.rejected_dir / f"{shard_key}.{position:02d}-{stage}.parquet"

    def map_output(self, segment: int, shard_key: str) -> Path:
        return self.work / map_phase(segment) / f"{shard_key}.parquet"

    def decisions_file(self, segment: int, shard_key: str) -> Path:
        return self.work / reduce_phase(segment) / f"{shard_key}.parquet"

    def shuffle_file(self, segment: int, shard_key: str) -> Path:
        return self.work / shuffle_phase(segment) / f"{shard_key}.parquet"

    def partition_output(self, segment: int, partition: int, round: int = 0) -> Path:
        name = f"{partition_key(partition)}.parquet" if round == 0 else f"r{round}-{partition_key(partition)}.parquet"
        return self.work / f"{reduce_phase(segment)}-parts" / name

    def forward_file(self, segment: int, round: int, partition: int) -> Path:
        """Rows partition ``partition`` of round ``round`` hands to the next round, by their ``part``."""
        return self.work / f"{shuffle_phase(segment)}-r{round}" / f"{partition_key(partition)}.parquet"

    def scratch_dir(self, segment: int) -> Path:
        """Spill space of the global stage ending ``segment`` (DuckDB, sorts)."""
        return self.work / f"{reduce_phase(segment)}-scratch"

    def state_file(self, segment: int) -> Path:
        return self.work / f"{reduce_phase(segment)}-state.parquet"

    @property
    def tokens_dir(self) -> Path:
        return self.work / "tokens"

    def tokens_file(self, shard_key: str) -> Path:
        return self.tokens_dir / f"{shard_key}.arrow"

    @property
    def markers_dir(self) -> Path:
        return self.work / "markers"

    def marker(self, phase: str, task: str) -> Path:
        return self.markers_dir / phase / f"{task}.json"

    # --- markers ------------------------------------------------------------
    def read_marker(self, phase: str, task: str) -> dict[str, Any] | None:
        path = self.marker(phase, task)
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except ValueError:
            return None  # a marker is written atomically; an unreadable one means redo

    def write_marker(self, phase: str, task: str, data: dict[str, Any]) -> None:
        write_text_atomic(self.marker(phase, task), json.dumps(data, sort_keys=True))

    # --- lifecycle ----------------------------------------------------------
    def load_run_json(self) -> dict[str, Any] | None:
        if not self.run_json.is_file():
            return None
        return json.loads(self.run_json.read_text())

    def save_run_json(self, data: dict[str, Any]) -> None:
        write_text_atomic(self.run_json, json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")

    def is_run_folder(self) -> bool:
        return self.run_json.is_file()

    def check_usable(self) -> None:
        """Refuse to write into a non-empty folder that is not a datapipe run: it may be the user's data."""
        if self.root.exists() and not self.root.is_dir():
            raise RunFolderError(f"output {self.root} exists and is not a folder")
        if self.root.is_dir() and not self.is_run_folder() and any(
                p.name not in (LOCK_FILE, LOCK_RECORD) and not is_temp_name(p.name) for p in self.root.iterdir()):
            raise RunFolderError(f"output folder {self.root} is not empty and holds no run.json; "
                                 f"refusing to write there (choose an empty or new folder with --output)")

    def wipe(self) -> None:
        """Delete a previous run's outputs (--fresh). Only the names datapipe manages are touched."""
        self.check_usable()
        for name in MANAGED:
            p = self.root / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()

    def sweep(self) -> int:
        """Remove temporary files of killed writers anywhere in the folder; only under the run lock."""
        return sweep_temp_files(self.root)
