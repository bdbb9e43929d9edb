"""The run folder: where every output of one pipeline run lives, and how resume finds its place.

    <run>/docs/<source>/<shard>.parquet       kept documents with their signals
    <run>/rejected/<source>/<shard>.<n>-<stage>.parquet
                                              dropped documents: stage, reason, detail, text
    <run>/copies/<source>/<shard>.<n>-<stage>.parquet
                                              the copies a dedup stage dropped in favour of this
                                              shard's documents, by survivor (what `explain` lists)
    <run>/shards/<source>/<split>-NNNNN.arrow packed token shards (Arrow IPC, uncompressed)
    <run>/shards/manifest.parquet             one row per shard
    <run>/shards/manifest.json                the same rows for the loader (JSON columns, stamped)
    <run>/stats.duckdb                        the audit database
    <run>/run.json                            config, versions, inputs, timings, counts
    <run>/models/stageNN-<stage>/             files a global stage keeps (a model classify trained on the run)
    <run>/_work/markers/<phase>/<task>.json   completion markers (run_folder/markers.py)
    <run>/_work/tokens/<shard>.arrow          a map task's encoded tokens, which packing (and export) read
    <run>/_work/...                           the engine's own intermediate files (engine/work_files.py)
    <run>/.datapipe.lock, .datapipe.lock.json the driver's lock and who holds it (run_folder/lock.py)

This is the run folder's public face: what the audit, the exports, training and the loader read.
A task's outputs are renamed into place before its marker is written, so a marker
means "done and durable"; work without a marker is redone on resume. Outputs are read
only by their final names (``*.parquet``, ``*.arrow``, markers by name), never by a
temporary one, and the driver sweeps temporary files of killed processes under its lock.

A run folder in object storage (``s3://bucket/run``) is this layout in a local mirror, committed
to the store by the markers, which then name the files their task uploaded: see
``run_folder/remote.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datapipe.config.input_names import display_name
from datapipe.errors import DatapipeError
from datapipe.run_folder.markers import MarkerStore
from datapipe.storage import uri as storage
from datapipe.storage.atomic import is_temp_name, sweep_temp_files, write_text_atomic
from datapipe.tokens.shard_format import MANIFEST_NAME, SHARDS_DIR, shard_file_name

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pyarrow.parquet as pq

DOCS_DIR, REJECTED_DIR, WORK_DIR, STATS_DB, RUN_JSON = "docs", "rejected", "_work", "stats.duckdb", "run.json"
MODELS_DIR, COPIES_DIR, AGGREGATES_DIR = "models", "copies", "aggregates"
MANAGED = (DOCS_DIR, REJECTED_DIR, COPIES_DIR, AGGREGATES_DIR, SHARDS_DIR, MODELS_DIR, WORK_DIR, STATS_DB, RUN_JSON)
LOCK_FILE = ".datapipe.lock"  # never deleted, not even by --fresh: see run_folder/lock.py
LOCK_RECORD = ".datapipe.lock.json"


MARKERS_DIR = f"{WORK_DIR}/markers"  # completion markers: run_folder/markers.py
# The two phases whose markers more than the engine reads (each phase's name is the folder of its
# markers, so a resumed run finds work by these exact names; the engine's others: engine/work_files.py).
LINES_PHASE = "lines"  # pre-pass: newlines per JSONL range, for global line numbers
PACK_PHASE = "pack"  # its markers hold the manifest rows of the shards it wrote (run_folder/integrity.py)
# Phases whose markers a later task reads (a map task numbers its records from the pre-pass's line
# counts: engine/tasks/map.py ``_first_record``): in a remote folder the driver hands them over with
# the phase's files (``MarkerStore.committed``). Every other task reads files only.
MARKERS_READ_BY_TASKS = (LINES_PHASE,)


_PRUNED: dict[str, set[str]] = {}  # mirror root -> the folders this process deleted from it (``prune``)


class RunFolderError(DatapipeError, RuntimeError):
    pass


def _utf8_names(value: Any) -> Any:
    """``value`` with every string that is not valid UTF-8 (surrogate-escaped bytes) as its display name."""
    if isinstance(value, str):
        return display_name(value)
    if isinstance(value, dict):
        return {_utf8_names(k): _utf8_names(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_utf8_names(v) for v in value]
    return value


class RunFolder:
    def __init__(self, root: Path | str) -> None:
        # A URI (s3://bucket/run) is worked on in its local mirror and committed to the store by
        # markers (run_folder/remote.py); ``remote`` is that URI, None for a local folder.
        # A mirror path handed over from another process (a task's spec holds the driver's) names
        # the same URI, worked on in this process's own mirror: each node has its own cache folder,
        # as separate machines do, even where several share one file system (loopback clusters).
        uri = str(root) if storage.is_uri(root) else storage.remote_of(root)
        self.root = (storage.mirror_of(uri) if uri else Path(root)).resolve()
        self.remote = storage.remote_of(self.root)
        self.markers = MarkerStore(self.root, MARKERS_DIR, self.remote, MARKERS_READ_BY_TASKS)

    @property
    def location(self) -> str:
        """The run folder as the user named it (the URI of a remote one), for messages."""
        return self.remote or str(self.root)

    # --- layout -------------------------------------------------------------
    @property
    def run_json(self) -> Path:
        return self.root / RUN_JSON

    @property
    def stats_db(self) -> Path:
        return self.root / STATS_DB

    @property
    def work(self) -> Path:
        """The engine's working area: its completion markers (``markers``) and files no reader of a
        finished run needs (engine/work_files.py), but the tokens of packing (``tokens_dir``)."""
        return self.root / WORK_DIR

    @property
    def shards_dir(self) -> Path:
        return self.root / SHARDS_DIR

    @property
    def manifest(self) -> Path:
        return self.shards_dir / MANIFEST_NAME

    def shard_file(self, source: str, split: str, index: int) -> Path:
        """A packed token shard (tokens/shard_format.py names it: the loader needs the name without the engine)."""
        return self.shards_dir / shard_file_name(source, split, index)

    @property
    def docs_dir(self) -> Path:
        return self.root / DOCS_DIR

    @property
    def rejected_dir(self) -> Path:
        return self.root / REJECTED_DIR

    def docs_file(self, shard_key: str) -> Path:
        return self._local(self.docs_dir / f"{shard_key}.parquet")

    def reject_file(self, shard_key: str, position: int, stage: str) -> Path:
        return self._local(self.rejected_dir / f"{shard_key}.{position:02d}-{stage}.parquet")

    def copies_file(self, shard_key: str, position: int, stage: str) -> Path:
        """The copies the stage at ``position`` dropped in favour of this shard's documents (``dup_of``
        one of them), sorted by ``dup_of``: written by the shard's map task after the stage."""
        return self._local(self.root / COPIES_DIR / f"{shard_key}.{position:02d}-{stage}.parquet")

    def aggregates_file(self, segment: int, shard_key: str) -> Path:
        """The counts a map task's documents add to the run's aggregate tables (``audit/aggregates.py``),
        written by that task beside its kept and rejected files."""
        return self.root / AGGREGATES_DIR / f"{shard_key}.map{segment}.parquet"

    def rel(self, path: Path) -> str:
        """``path`` (under the root) as a path in the run folder, as text: a string cut, not pathlib's
        ``relative_to`` (~10x slower), since the driver names every task's inputs this way."""
        text, root = str(path), str(self.root)
        if text.startswith(root) and text[len(root) : len(root) + 1] == "/":
            return text[len(root) + 1 :]
        return path.relative_to(self.root).as_posix()

    def fetched(self, path: Path) -> Path:
        """``path`` of a task's output, downloaded first in a remote folder (see ``_local``)."""
        return self._local(path)

    def parquet(self, path: Path) -> pq.ParquetFile:
        """A task's Parquet output (a path asked with ``fetch=False``) opened for reading; in a remote
        folder read in place unless this node has it whole, so a task reading some of its row groups
        moves only those through the store (run_folder/remote.py, ``open_parquet``)."""
        if self.remote is None:
            import pyarrow.parquet as pq

            return pq.ParquetFile(path)
        from datapipe.run_folder import remote as remote_folder

        return remote_folder.open_parquet(self.root, self.remote, path)

    def prune(self, rels: Sequence[str]) -> None:
        """A remote folder's mirror: delete these folders (paths in the run folder) that no later phase
        reads; the store keeps them (a resumed run, or a task redone, reads them there). Each once per
        process. No-op locally: a local run folder is the record itself."""
        if self.remote is None:
            return
        done = _PRUNED.setdefault(str(self.root), set())
        for rel in rels:
            if rel not in done:
                shutil.rmtree(self.root / rel, ignore_errors=True)
                done.add(rel)

    def open_run(self, rel: str, size: int = 0, footer: int | None = None) -> pq.ParquetFile:
        """A Parquet file of a task (its path in the run folder) opened for reading with the size and footer
        length its writer's marker recorded, as a task is handed them for its inputs: in a remote folder
        this node's copy when it holds it whole, else read in place from the store (only the byte ranges
        read cross it), with nothing listed or looked up. Without a size: as ``parquet``."""
        from datapipe.storage.parquet_reads import local_parquet

        path = self.root / rel
        if self.remote is None or (size and path.is_file() and path.stat().st_size == size):
            return local_parquet(path)
        if not size:
            return self.parquet(path)
        from datapipe.storage.parquet_reads import remote_parquet

        return remote_parquet(storage.child(self.remote, rel), size, footer)

    def is_committed(self, path: Path) -> bool:
        """Whether a task's output exists, without downloading it in a remote folder."""
        if self.remote is None:
            return path.exists()
        from datapipe.run_folder import remote as remote_folder

        return remote_folder.is_committed(self.root, self.remote, path)

    @property
    def models_dir(self) -> Path:
        return self.root / MODELS_DIR

    def stage_outputs_dir(self, position: int, stage: str) -> Path:
        """Files a global stage's step keeps as outputs of the run (``ReduceInputs.outputs_dir``): the
        model classify trains on the run's annotations, with its meta and evaluation."""
        return self.models_dir / f"stage{position:02d}-{stage}"

    @property
    def tokens_dir(self) -> Path:
        return self.work / "tokens"

    def tokens_file(self, shard_key: str, fetch: bool = True) -> Path:
        """A map task's token file; ``fetch=False``: its path only, never downloaded (the driver naming a
        pack task's inputs must not pull every token file of the run through its own mirror)."""
        path = self.tokens_dir / f"{shard_key}.arrow"
        return self._local(path) if fetch else path

    def _local(self, path: Path) -> Path:
        """A path of a task's output; in a remote folder, fetched first if a committed marker names it
        and it is not here (every read of another task's output asks for its path here). A reader of
        a part of it asks ``parquet`` and ``is_committed`` with the path alone."""
        if self.remote is None:
            return path
        from datapipe.run_folder import remote as remote_folder

        return remote_folder.fetch(self.root, self.remote, path)

    # --- a remote folder: the store and this mirror -----------------------------------------
    def pull(self, full: bool = False, files: tuple[str, ...] = ()) -> None:
        """A remote folder: read the markers other processes committed, and download the files they
        name under the folders ``files`` (others come when their path is asked for). No-op locally.
        The driver's (at the start of a run, and of commands reading a finished run); tasks ``install``."""
        if self.remote is not None:
            from datapipe.run_folder import remote as remote_folder

            remote_folder.pull(self.root, self.remote, full=full, files=files)

    def publish(self, *names: str) -> None:
        """A remote folder: upload files the driver wrote (run.json, stats.duckdb, the manifest)."""
        if self.remote is not None:
            from datapipe.run_folder import remote as remote_folder

            for name in names:
                remote_folder.publish(self.root, self.remote, name)

    # --- lifecycle ----------------------------------------------------------
    def load_run_json(self) -> dict[str, Any] | None:
        if not self.run_json.is_file():
            return None
        try:
            run = json.loads(self.run_json.read_bytes().decode("utf-8"))
        except ValueError:  # JSONDecodeError and UnicodeDecodeError
            run = None
        if not isinstance(run, dict):
            # It records the run's plan (how inputs were split into tasks), without which finished
            # work cannot be matched to tasks: nothing in the folder can be trusted to resume from.
            raise RunFolderError(
                f"{self.location}/{RUN_JSON} is damaged (truncated or not a JSON object), so the "
                f"finished work in {self.location} cannot be resumed",
                hint="run again with --fresh to start over (or --output to write elsewhere)",
            )
        return run

    def save_run_json(self, data: dict[str, Any]) -> None:
        text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a path that is not UTF-8 (e.g. the pipeline file's): named with escapes
            text = json.dumps(_utf8_names(data), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        write_text_atomic(self.run_json, text)
        self.publish("run.json")

    def is_run_folder(self) -> bool:
        return self.run_json.is_file()

    def check_usable(self) -> None:
        """Refuse to write into a non-empty folder that is not a datapipe run: it may be the user's data."""
        if self.remote is not None:
            from datapipe.run_folder import remote as remote_folder

            remote_folder.check_usable(self.remote, (LOCK_FILE, LOCK_RECORD))
            return  # the mirror is this folder's own cache: the store decides
        if self.root.exists() and not self.root.is_dir():
            raise RunFolderError(f"output {self.root} exists and is not a folder")
        if (
            self.root.is_dir()
            and not self.is_run_folder()
            and any(p.name not in (LOCK_FILE, LOCK_RECORD) and not is_temp_name(p.name) for p in self.root.iterdir())
        ):
            raise RunFolderError(
                f"output folder {self.root} is not empty and holds no run.json; "
                f"refusing to write there (choose an empty or new folder with --output)"
            )

    def wipe(self, keep: tuple[str, ...] = ()) -> None:
        """Delete a previous run's outputs (--fresh). Only the names datapipe manages are touched.

        ``keep``: glob patterns, relative to the folder, of local paths inside those names that stay
        (the engine's record of work paid for once, such as a model's answers found by what was asked)."""
        self.check_usable()
        self.markers.forget()
        if self.remote is not None:
            from datapipe.run_folder import remote as remote_folder

            remote_folder.wipe(self.root, self.remote, MANAGED)
        kept = {p for pattern in keep for p in self.root.glob(pattern) if not p.is_symlink()}
        for name in MANAGED:
            _remove_except(self.root / name, kept)

    def sweep(self) -> int:
        """Remove temporary files of killed writers anywhere in the folder; only under the run lock."""
        removed = sweep_temp_files(self.root)
        if self.remote is not None:
            from datapipe.run_folder import remote as remote_folder

            # The markers held here (every one the driver adopted or read) are not read again.
            removed += remote_folder.sweep(self.remote, self.root, self.markers.known_files())
        return removed


def _remove_except(path: Path, kept: set[Path]) -> None:
    """Delete ``path`` (never following a symlink), all but the paths in ``kept`` and the folders above them."""
    if path in kept:
        return
    if path.is_dir() and not path.is_symlink():
        if any(path in k.parents for k in kept):
            for child in path.iterdir():
                _remove_except(child, kept)
        else:
            shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
