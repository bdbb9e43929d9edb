"""The run folder: where every output of one pipeline run lives, and how resume finds its place.

    <run>/docs/<source>/<shard>.parquet       kept documents with their signals
    <run>/rejected/<source>/<shard>.<n>-<stage>.parquet
                                              dropped documents: stage, reason, detail, text
    <run>/copies/<source>/<shard>.<n>-<stage>.parquet
                                              the copies a dedup stage dropped in favour of this
                                              shard's documents, by survivor (what `explain` lists)
    <run>/shards/<source>/<split>-NNNNN.arrow packed token shards (Arrow IPC, uncompressed)
    <run>/shards/manifest.parquet             one row per shard
    <run>/stats.duckdb                        the audit database
    <run>/run.json                            config, versions, inputs, timings, counts
    <run>/models/stageNN-<stage>/             files a global stage keeps (a model classify trained on the run)
    <run>/_work/                              intermediate outputs and completion markers
    <run>/_work/stageNN-<stage>/<shard>/      a stage's own per-task files (annotate's answers journal)
    <run>/.datapipe.lock, .datapipe.lock.json the driver's lock and who holds it (run_folder/lock.py)

A task's outputs are renamed into place before its marker is written, so a marker
means "done and durable"; work without a marker is redone on resume. Outputs are read
only by their final names (``*.parquet``, ``*.arrow``, markers by name), never by a
temporary one, and the driver sweeps temporary files of killed processes under its lock.

A run folder in object storage (``s3://bucket/run``) is this layout in a local mirror, committed
to the store by the markers, which then name the files their task uploaded: see
``run_folder/remote.py``.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datapipe.config.input_names import display_name
from datapipe.errors import DatapipeError
from datapipe.run_folder.files import describe_files
from datapipe.storage import uri as storage
from datapipe.storage.atomic import is_temp_name, sweep_temp_files, write_bytes_atomic, write_text_atomic
from datapipe.tokens.shard_format import MANIFEST_NAME, SHARDS_DIR, shard_file_name

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pyarrow.parquet as pq

    from datapipe.run_folder.remote import CommittedPhase

DOCS_DIR, REJECTED_DIR, WORK_DIR, STATS_DB, RUN_JSON = "docs", "rejected", "_work", "stats.duckdb", "run.json"
MODELS_DIR, COPIES_DIR, AGGREGATES_DIR = "models", "copies", "aggregates"
MANAGED = (DOCS_DIR, REJECTED_DIR, COPIES_DIR, AGGREGATES_DIR, SHARDS_DIR, MODELS_DIR, WORK_DIR, STATS_DB, RUN_JSON)
LOCK_FILE = ".datapipe.lock"  # never deleted, not even by --fresh: see run_folder/lock.py
LOCK_RECORD = ".datapipe.lock.json"


# Threads reading markers (``RunFolder.read_markers``): file reads and JSON parsing of ~1-10 KB each.
MARKER_READERS = 8
MARKER_BATCH = 64  # markers per thread at least: fewer are read in this thread


def _list_markers(folder: Path, prefix: str = "") -> list[str]:
    """The task keys of the markers under ``folder`` (a phase's), by one walk of its directory tree."""
    keys: list[str] = []
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return keys
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            keys += _list_markers(Path(entry.path), f"{prefix}{entry.name}/")
        elif entry.name.endswith(".json") and not is_temp_name(entry.name):
            keys.append(prefix + entry.name[: -len(".json")])
    return sorted(keys)


def _load_marker(path: Path, shared: dict[int, list[Any]] | None = None) -> dict[str, Any] | None:
    """A marker, or None. ``shared``: the column lists of ``audit_files`` seen so far (``_share``),
    so that thousands of cached markers hold one copy of each (a file's ~100 [name, type] pairs are
    most of a map marker, and the same in every task of a source)."""
    try:
        return _parse_marker(path.read_bytes(), shared)
    except FileNotFoundError:
        return None


def _parse_marker(body: bytes, shared: dict[int, list[Any]] | None = None) -> dict[str, Any] | None:
    try:
        marker = json.loads(body)
    except ValueError:
        return None  # a marker is written atomically; an unreadable one means redo
    if shared is not None and isinstance(marker, dict):
        for entry in marker.get("audit_files") or ():
            entry["columns"] = _share(shared, entry["columns"])
    return marker


# Column lists kept per length for sharing (``_share``): a run has a few layouts per source; past
# this many of one length, a new one is kept as it is (memory only: it is not shared).
SHARED_PER_LENGTH = 16


def _share(shared: dict[int, list[Any]], columns: Any) -> Any:
    """The list equal to ``columns`` seen before, else ``columns`` (remembered). Found by comparing
    lists of its length: ~5 us for 100 columns, where their ``repr`` as a key took ~55 us (a map
    task's marker names several files, and the driver adopts one per task)."""
    if not isinstance(columns, list):
        return columns
    bucket = shared.setdefault(len(columns), [])
    for known in bucket:
        if known == columns:
            return known
    if len(bucket) < SHARED_PER_LENGTH:
        bucket.append(columns)
    return columns


def _load_markers(folder: Path, keys: list[str], shared: dict[int, list[Any]]) -> list[dict[str, Any] | None]:
    """Markers in bulk, with the cyclic garbage collector paused: parsed JSON has no cycles, and a
    collection every few hundred new containers rescans all those kept so far (reading 3,000
    markers into the cache took 6x the CPU of parsing them)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return [_load_marker(folder / f"{k}.json", shared) for k in keys]
    finally:
        if paused:
            gc.enable()


# Phase names: each is the folder of its completion markers (``_work/markers/<phase>/``) and, for
# map, shuffle and reduce, of its outputs, so a resumed run finds work by these exact names.
LINES_PHASE = "lines"  # pre-pass: newlines per JSONL range, for global line numbers
PACK_PHASE = "pack"
# Phases whose markers a later task reads (a map task numbers its records from the pre-pass's line
# counts: engine/tasks/map.py ``_first_record``): in a remote folder the driver hands them over with
# the phase's files (``RunFolder.committed``). Every other task reads files only.
MARKERS_READ_BY_TASKS = (LINES_PHASE,)


def map_phase(segment: int) -> str:
    return f"map{segment}"


def shuffle_phase(segment: int, round: int = 0) -> str:
    """A shuffle round's phase: round 0 keeps the name runs had before rounds."""
    return f"shuffle{segment}" if round == 0 else f"shuffle{segment}r{round}"


def merge_phase(segment: int, round: int = 0) -> str:
    """The merge before a shuffle round: its inputs combined into a few files (engine/tasks/merge.py)."""
    return f"merge{segment}" if round == 0 else f"merge{segment}r{round}"


def merge_outputs_phase(segment: int) -> str:
    """The merge of a deciding shuffle's partition outputs, after its last round (engine/tasks/merge.py)."""
    return f"merge{segment}d"


def reduce_phase(segment: int) -> str:
    return f"reduce{segment}"


# What a deciding partition writes for the next map tasks, each file sorted by ``shard``: its
# decisions, its ``PartitionResult.state`` and the copies it dropped, by their survivor's shard.
OUTPUT_KINDS = ("decisions", "state", "copies")


def partition_key(partition: int) -> str:
    """The task key (marker name) of one partition of a shuffle round."""
    return f"{partition:05d}"


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
        # Parsed markers, phase -> task -> marker: a marker is written once, when its task is done,
        # and only deleted (``forget_markers``) when its work is discarded, so what was read stays
        # true and the driver reads each marker once per run (resume check, counts, statistics).
        self._markers: dict[str, dict[str, dict[str, Any]]] = {}
        self._columns: dict[int, list[Any]] = {}  # audit_files column lists, shared by the cached markers (``_share``)

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

    def map_output(self, segment: int, shard_key: str, fetch: bool = True) -> Path:
        """``fetch=False``: its path in the mirror, not downloaded (``fetched`` and ``is_committed``
        then ask): a reader of a few map outputs must not pull every one onto its node."""
        path = self.work / map_phase(segment) / f"{shard_key}.parquet"
        return self._local(path) if fetch else path

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

    def is_committed(self, path: Path) -> bool:
        """Whether a task's output exists, without downloading it in a remote folder."""
        if self.remote is None:
            return path.exists()
        from datapipe.run_folder import remote as remote_folder

        return remote_folder.is_committed(self.root, self.remote, path)

    def decisions_file(self, segment: int, shard_key: str) -> Path:
        return self._local(self.work / reduce_phase(segment) / f"{shard_key}.parquet")

    def shuffle_file(self, segment: int, shard_key: str, fetch: bool = True) -> Path:
        return self._local(self.work / shuffle_phase(segment) / f"{shard_key}.parquet", fetch)

    def partition_output(self, segment: int, partition: int, round: int = 0, fetch: bool = True) -> Path:
        name = f"{partition_key(partition)}.parquet" if round == 0 else f"r{round}-{partition_key(partition)}.parquet"
        return self._local(self.work / f"{reduce_phase(segment)}-parts" / name, fetch)

    def partition_state(self, segment: int, partition: int, round: int = 0, fetch: bool = True) -> Path:
        """A partition's rows for the applying map tasks (``PartitionResult.state``)."""
        name = f"state-r{round}-{partition_key(partition)}.parquet"
        return self._local(self.work / f"{reduce_phase(segment)}-parts" / name, fetch)

    def partition_copies(self, segment: int, partition: int, round: int = 0, fetch: bool = True) -> Path:
        """The copies a partition dropped, by their survivor's shard: for the survivors' map tasks."""
        name = f"copies-r{round}-{partition_key(partition)}.parquet"
        return self._local(self.work / f"{reduce_phase(segment)}-parts" / name, fetch)

    def partition_file(self, kind: str, segment: int, partition: int, round: int = 0, fetch: bool = True) -> Path:
        """A deciding partition's output of one ``kind`` (``OUTPUT_KINDS``)."""
        assert kind in OUTPUT_KINDS, kind
        by_kind = {"decisions": self.partition_output, "state": self.partition_state, "copies": self.partition_copies}
        return by_kind[kind](segment, partition, round, fetch)

    def forward_file(self, segment: int, round: int, partition: int, fetch: bool = True) -> Path:
        """Rows partition ``partition`` of round ``round`` hands to the next round, by their ``part``."""
        return self._local(self.work / f"{shuffle_phase(segment)}-r{round}" / f"{partition_key(partition)}.parquet", fetch)

    def merged_file(self, segment: int, round: int, group: int, fetch: bool = True, rng: int | None = None) -> Path:
        """A group of a shuffle round's input files, merged: rows sorted by ``part``, a row group per part;
        ``rng``: of one range of parts only (engine/tasks/merge.py, ``KEYS_PER_FILE``)."""
        cut = "" if rng is None else f"-{partition_key(rng)}"
        return self._local(self.work / f"{merge_phase(segment, round)}" / f"{partition_key(group)}{cut}.parquet", fetch)

    def merged_outputs(
        self,
        segment: int,
        group: int,
        kind: str = "decisions",
        fetch: bool = True,
        rng: int | None = None,
        cut: int | None = None,
    ) -> Path:
        """A group of a deciding shuffle's partition outputs of one ``kind`` (``OUTPUT_KINDS``: decisions,
        states, copies), of every round, merged: rows sorted by ``shard``, a row group per shard;
        ``rng``: of one range of shards only; ``cut``: of one file of that range's (engine/tasks/merge.py,
        ``KEYS_PER_FILE``)."""
        assert kind in OUTPUT_KINDS, kind
        suffix = "" if rng is None else f"-{partition_key(rng)}"
        suffix += "" if cut is None else f"-{partition_key(cut)}"
        name = f"{kind}-{partition_key(group)}{suffix}.parquet"
        return self._local(self.work / merge_outputs_phase(segment) / name, fetch)

    def scratch_dir(self, segment: int) -> Path:
        """Spill space of the global stage ending ``segment`` (DuckDB, sorts)."""
        return self.work / f"{reduce_phase(segment)}-scratch"  # local spill space, never committed

    def stage_work_dir(self, position: int, stage: str, shard_key: str) -> Path:
        """A stage's own folder for one map task (``Stage.start_task``): kept across attempts of the
        task, so what the stage paid for once (a model's answers) is not asked again. Local to the
        node that runs the task, like the spill space: never committed to a remote run folder."""
        return self.work / f"stage{position:02d}-{stage}" / shard_key

    @property
    def models_dir(self) -> Path:
        return self.root / MODELS_DIR

    def stage_outputs_dir(self, position: int, stage: str) -> Path:
        """Files a global stage's step keeps as outputs of the run (``ReduceInputs.outputs_dir``): the
        model classify trains on the run's annotations, with its meta and evaluation."""
        return self.models_dir / f"stage{position:02d}-{stage}"

    def state_file(self, segment: int) -> Path:
        return self._local(self.work / f"{reduce_phase(segment)}-state.parquet")

    def combine_copies_file(self, segment: int) -> Path:
        """The copies the combine step dropped, sorted by their survivor's shard (each map task reads its own)."""
        return self._local(self.work / f"{reduce_phase(segment)}-copies.parquet")

    @property
    def tokens_dir(self) -> Path:
        return self.work / "tokens"

    def tokens_file(self, shard_key: str) -> Path:
        return self._local(self.tokens_dir / f"{shard_key}.arrow")

    @property
    def markers_dir(self) -> Path:
        return self.work / "markers"

    def _local(self, path: Path, fetch: bool = True) -> Path:
        """A path of a task's output; in a remote folder, fetched first if a committed marker names it
        and it is not here (every read of another task's output asks for its path here).
        ``fetch=False``: the path only; a reader of a part of it asks ``parquet`` and ``is_committed``."""
        if self.remote is None or not fetch:
            return path
        from datapipe.run_folder import remote as remote_folder

        return remote_folder.fetch(self.root, self.remote, path)

    def marker(self, phase: str, task: str) -> Path:
        return self.markers_dir / phase / f"{task}.json"

    # --- markers ------------------------------------------------------------
    def read_marker(self, phase: str, task: str) -> dict[str, Any] | None:
        cached = self._markers.get(phase, {}).get(task)
        if cached is not None:
            return cached
        if self.remote is not None:  # a task of a remote folder: the driver handed it over (``install``)
            from datapipe.run_folder import remote as remote_folder

            given = remote_folder.given_marker(self.remote, phase, task)
            if given is not None:
                return given
        marker = _load_marker(self.marker(phase, task))
        if marker is not None:
            self._markers.setdefault(phase, {})[task] = marker
        return marker

    def read_markers(self, phase: str) -> dict[str, dict[str, Any]]:
        """Every readable marker of ``phase``, task key -> marker: one listing of the phase's folder,
        then the markers not read before, in parallel (on an object store's mirror or a network file
        system a read is a round trip; one at a time, 37k of them took minutes)."""
        folder = self.markers_dir / phase
        listed = _list_markers(folder)  # task keys name subfolders: <source>/<shard>
        cache = self._markers.setdefault(phase, {})
        missing = [key for key in listed if key not in cache]
        # A thread per slice of the keys, not per key: fewer hand-offs of the interpreter lock.
        step = max(MARKER_BATCH, -(-len(missing) // MARKER_READERS))
        slices = [missing[i : i + step] for i in range(0, len(missing), step)]
        shared = self._columns
        if len(slices) > 1:
            with ThreadPoolExecutor(max_workers=len(slices)) as pool:
                loaded = [m for part in pool.map(lambda keys: _load_markers(folder, keys, shared), slices) for m in part]
        else:
            loaded = _load_markers(folder, missing, shared)
        for key, marker in zip(missing, loaded):
            if isinstance(marker, dict):
                cache[key] = marker
        return {key: cache[key] for key in listed if key in cache}

    def forget_markers(self, phase: str | None = None, task: str | None = None) -> None:
        """Drop markers read before (of one task, one phase, or all): their work was discarded."""
        if phase is None:
            self._markers.clear()
        elif task is None:
            self._markers.pop(phase, None)
        else:
            self._markers.get(phase, {}).pop(task, None)

    def write_marker(self, phase: str, task: str, data: dict[str, Any], written: list[Path] | None = None) -> bytes:
        """``written``: the files the task wrote, named in the marker with their sizes (``files``; see
        ``describe_files``), so a later start can tell a damaged output (run_folder/integrity.py);
        a remote folder uploads them before the marker. Returns the marker's bytes as committed."""
        if self.remote is None:
            if written is not None:
                data["files"] = describe_files(self.root, written)
            body = json.dumps(data, sort_keys=True).encode("utf-8")
            write_bytes_atomic(self.marker(phase, task), body)
            return body
        from datapipe.run_folder import remote as remote_folder

        rel = self.marker(phase, task).relative_to(self.root).as_posix()
        body = remote_folder.commit(self.root, self.remote, rel, data, list(written or []))
        write_bytes_atomic(self.marker(phase, task), body)
        return body

    def adopt_marker(self, phase: str, task: str, marker: dict[str, Any] | bytes) -> dict[str, Any] | None:
        """A marker the driver received as its task's result (its bytes as committed, or the dict):
        cached, so the driver never reads it back; in a remote folder also noted as pulled and written
        to the mirror (``remote.adopt``), so the next ``pull`` and the end of the run's sweep do not
        fetch it from the store. The task's own commit (files, then the marker on the store) stays the
        commit point. Returns the marker as cached (None: not JSON, so not cached: read, or redone)."""
        # As read from the file (lists, not tuples; shared column lists), so cached markers are alike.
        # Bytes (what a Ray task returns) are parsed once; a dict is written out first (~0.07 ms for a
        # map task's marker, as much as parsing it).
        body = marker if isinstance(marker, bytes) else json.dumps(marker, sort_keys=True).encode("utf-8")
        parsed = _parse_marker(body, self._columns)
        if parsed is None or not isinstance(parsed, dict):
            return None
        if self.remote is not None:
            from datapipe.run_folder import remote as remote_folder

            # The marker's path as text (``marker`` and ``relative_to`` in pathlib cost ~0.1 ms a task).
            remote_folder.adopt(self.root, self.remote, f"{WORK_DIR}/markers/{phase}/{task}.json", parsed, body)
        self._markers.setdefault(phase, {})[task] = parsed
        return parsed

    def committed(self, phase: str) -> CommittedPhase:
        """What ``phase`` committed, for the tasks of later phases (a remote folder's workers learn it
        from the driver instead of listing and reading markers): the files its markers name, and the
        markers of a phase in ``MARKERS_READ_BY_TASKS``. From the cached markers: no read of the store."""
        from datapipe.run_folder.remote import CommittedPhase

        markers = self.read_markers(phase)
        files = {f["path"]: (f["bytes"], f.get("footer")) for m in markers.values() for f in m.get("files", ())}
        return CommittedPhase(phase, files, dict(markers) if phase in MARKERS_READ_BY_TASKS else {})

    def install(self, phases: Sequence[CommittedPhase]) -> None:
        """A task's view of a remote folder: what the finished ``phases`` committed, as handed over by
        the driver (``committed``); their files are then fetched when asked for. No-op locally."""
        if self.remote is not None:
            from datapipe.run_folder import remote as remote_folder

            remote_folder.install(self.remote, phases)

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

    def wipe(self) -> None:
        """Delete a previous run's outputs (--fresh). Only the names datapipe manages are touched."""
        self.check_usable()
        self.forget_markers()
        if self.remote is not None:
            from datapipe.run_folder import remote as remote_folder

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
            from datapipe.run_folder import remote as remote_folder

            # The markers cached here (every one the driver adopted or read) are not read again.
            known = {
                f"{WORK_DIR}/markers/{phase}/{task}.json": [f["path"] for f in marker.get("files", ())]
                for phase, markers in self._markers.items()
                for task, marker in markers.items()
            }
            removed += remote_folder.sweep(self.remote, self.root, known)
        return removed
