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

A run folder in object storage (``s3://bucket/run``) is this layout in a local mirror, committed
to the store by the markers, which then name the files their task uploaded: see
``engine/remote_folder.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from datapipe import storage
from datapipe.atomic import is_temp_name, sweep_temp_files, write_bytes_atomic, write_text_atomic

MANAGED = ("docs", "rejected", "shards", "_work", "stats.duckdb", "run.json")
LOCK_FILE = ".datapipe.lock"  # never deleted, not even by --fresh: see run_lock.py
LOCK_RECORD = ".datapipe.lock.json"


class RunFolderError(RuntimeError):
    pass


class RunFolder:
    def __init__(self, root: Path | str) -> None:
        # A URI (s3://bucket/run) is worked on in its local mirror and committed to the store by
        # markers (engine/remote_folder.py); ``remote`` is that URI, None for a local folder.
        self.root = (storage.mirror_of(str(root)) if storage.is_uri(root) else Path(root)).resolve()
        self.remote = storage.remote_of(self.root)

    @property
    def location(self) -> str:
        """The run folder as the user named it (the URI of a remote one), for messages."""
        return self.remote or str(self.root)

    # --- layout -------------------------------------------------------------
    @property
    def run_json(self) -> Path:
        return self.root / "run.json"

    @property
    def stats_db(self) -> Path:
        return self.root / "stats.duckdb"

    @property
    def work(self) -> Path:
        return self.root / "_work"

    @property
    def shards_dir(self) -> Path:
        return self.root / "shards"

    def docs_file(self, shard_key: str) -> Path:
        return self._local(self.root / "docs" / f"{shard_key}.parquet")

    def reject_file(self, shard_key: str, position: int, stage: str) -> Path:
        return self._local(self.root / "rejected" / f"{shard_key}.{position:02d}-{stage}.parquet")

    def map_output(self, segment: int, shard_key: str) -> Path:
        return self._local(self.work / f"map{segment}" / f"{shard_key}.parquet")

    def decisions_file(self, segment: int, shard_key: str) -> Path:
        return self._local(self.work / f"reduce{segment}" / f"{shard_key}.parquet")

    def shuffle_file(self, segment: int, shard_key: str) -> Path:
        return self._local(self.work / f"shuffle{segment}" / f"{shard_key}.parquet")

    def partition_output(self, segment: int, partition: int, round: int = 0) -> Path:
        name = f"{partition:05d}.parquet" if round == 0 else f"r{round}-{partition:05d}.parquet"
        return self._local(self.work / f"reduce{segment}-parts" / name)

    def forward_file(self, segment: int, round: int, partition: int) -> Path:
        """Rows partition ``partition`` of round ``round`` hands to the next round, by their ``part``."""
        return self._local(self.work / f"shuffle{segment}-r{round}" / f"{partition:05d}.parquet")

    def state_file(self, segment: int) -> Path:
        return self._local(self.work / f"reduce{segment}-state.parquet")

    def tokens_file(self, shard_key: str) -> Path:
        return self._local(self.work / "tokens" / f"{shard_key}.arrow")

    def _local(self, path: Path) -> Path:
        """A path of a task's output; in a remote folder, fetched first if a committed marker names it
        and it is not here (every read of another task's output asks for its path here)."""
        if self.remote is None:
            return path
        from datapipe.engine import remote_folder

        return remote_folder.fetch(self.root, self.remote, path)

    def marker(self, phase: str, task: str) -> Path:
        return self.work / "markers" / phase / f"{task}.json"

    # --- markers ------------------------------------------------------------
    def read_marker(self, phase: str, task: str) -> dict[str, Any] | None:
        path = self.marker(phase, task)
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except ValueError:
            return None  # a marker is written atomically; an unreadable one means redo

    def write_marker(self, phase: str, task: str, data: dict[str, Any], written: list[Path] | None = None) -> None:
        """``written``: the files the task wrote; a remote folder uploads them before the marker."""
        if self.remote is None:
            write_text_atomic(self.marker(phase, task), json.dumps(data, sort_keys=True))
            return
        from datapipe.engine import remote_folder

        rel = self.marker(phase, task).relative_to(self.root).as_posix()
        write_bytes_atomic(self.marker(phase, task),
                           remote_folder.commit(self.root, self.remote, rel, data, list(written or [])))

    def pull(self, full: bool = False, files: tuple[str, ...] = ()) -> None:
        """A remote folder: read the markers other processes committed, and download the files they
        name under the folders ``files`` (others come when their path is asked for). No-op locally."""
        if self.remote is not None:
            from datapipe.engine import remote_folder

            remote_folder.pull(self.root, self.remote, full=full, files=files)

    def publish(self, *names: str) -> None:
        """A remote folder: upload files the driver wrote (run.json, stats.duckdb, the manifest)."""
        if self.remote is not None:
            from datapipe.engine import remote_folder

            for name in names:
                remote_folder.publish(self.root, self.remote, name)

    # --- lifecycle ----------------------------------------------------------
    def load_run_json(self) -> dict[str, Any] | None:
        if not self.run_json.is_file():
            return None
        return json.loads(self.run_json.read_text())

    def save_run_json(self, data: dict[str, Any]) -> None:
        write_text_atomic(self.run_json, json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        self.publish("run.json")

    def is_run_folder(self) -> bool:
        return self.run_json.is_file()

    def check_usable(self) -> None:
        """Refuse to write into a non-empty folder that is not a datapipe run: it may be the user's data."""
        if self.remote is not None:
            from datapipe.engine import remote_folder

            remote_folder.check_usable(self.remote, (LOCK_FILE, LOCK_RECORD))
            return  # the mirror is this folder's own cache: the store decides
        if self.root.exists() and not self.root.is_dir():
            raise RunFolderError(f"output {self.root} exists and is not a folder")
        if self.root.is_dir() and not self.is_run_folder() and any(
                p.name not in (LOCK_FILE, LOCK_RECORD) and not is_temp_name(p.name) for p in self.root.iterdir()):
            raise RunFolderError(f"output folder {self.root} is not empty and holds no run.json; "
                                 f"refusing to write there (choose an empty or new folder with --output)")

    def wipe(self) -> None:
        """Delete a previous run's outputs (--fresh). Only the names datapipe manages are touched."""
        self.check_usable()
        if self.remote is not None:
            from datapipe.engine import remote_folder

            remote_folder.wipe(self.root, self.remote, MANAGED)
        for name in MANAGED:
            p = self.root / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()

    def sweep(self) -> int:
        """Remove temporary files of killed writers anywhere in the folder; only under the run lock."""
        removed = sweep_temp_files(self.root)
        if self.remote is not None:
            from datapipe.engine import remote_folder

            removed += remote_folder.sweep(self.remote)
        return removed
