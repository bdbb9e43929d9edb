"""A run folder's completion markers: one JSON file per finished task, ``<dir>/<phase>/<task>.json``.

A marker is the commit point of its task: written after the task's outputs are in place (in an
object store, after they were uploaded: ``run_folder/remote.py``), it names those files with their
sizes, so a marker that exists means "done and durable". It is written once and only deleted when
its work is discarded, so a marker read once stays true: the store caches every marker it read or
adopted, and the driver reads each at most once per run (resume check, counts, statistics).
"""

from __future__ import annotations

import gc
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from sys import intern
from typing import TYPE_CHECKING, Any

from datapipe.run_folder.files import describe_files
from datapipe.storage.atomic import is_temp_name, write_bytes_atomic

if TYPE_CHECKING:
    from collections.abc import Sequence

    from datapipe.run_folder.remote import CommittedPhase

# Threads reading markers (``MarkerStore.read_all``): file reads and JSON parsing of ~1-10 KB each.
MARKER_READERS = 8
MARKER_BATCH = 64  # markers per thread at least: fewer are read in this thread
# Column lists kept per length for sharing (``_share``): a run has a few layouts per source; past
# this many of one length, a new one is kept as it is (memory only: it is not shared).
SHARED_PER_LENGTH = 16


class MarkerStore:
    """The markers of a run folder whose root (a local folder, or a remote one's mirror) is ``root``,
    kept under ``root / rel_dir``. ``remote``: the run folder's URI in object storage, else None.
    ``read_by_tasks``: the phases whose markers a later task reads (``committed`` hands them over)."""

    def __init__(self, root: Path, rel_dir: str, remote: str | None, read_by_tasks: tuple[str, ...] = ()) -> None:
        self.root, self.rel_dir, self.remote, self.read_by_tasks = root, rel_dir, remote, read_by_tasks
        self.dir = root / rel_dir
        # Parsed markers, phase -> task -> marker (see the module docstring).
        self._markers: dict[str, dict[str, dict[str, Any]]] = {}
        self._columns: dict[int, list[Any]] = {}  # audit_files column lists, shared by the cached markers (``_share``)
        # Phases whose every marker is held (``seal``): read without listing their folder again.
        self._sealed: set[str] = set()

    def path(self, phase: str, task: str) -> Path:
        return self.dir / phase / f"{task}.json"

    def rel(self, phase: str, task: str) -> str:
        """The marker's path in the run folder, as text (``path`` and ``relative_to`` in pathlib are slower)."""
        return f"{self.rel_dir}/{phase}/{task}.json"

    def read(self, phase: str, task: str, full: bool = False) -> dict[str, Any] | None:
        """A marker as held (``compact``: what the run's planning reads), or None; ``full``: whole, as
        written (its files' hashes, counts per stage: the checks of an earlier run's files), not kept."""
        if full:
            return _load_marker(self.path(phase, task))
        cached = self._markers.get(phase, {}).get(task)
        if cached is not None:
            return cached
        if self.remote is not None:  # a task of a remote folder: the driver handed it over (``install``)
            from datapipe.run_folder import remote as remote_folder

            given = remote_folder.given_marker(self.remote, phase, task)
            if given is not None:
                return given
        marker = _load_marker(self.path(phase, task))
        if marker is not None:
            marker = self._markers.setdefault(phase, {})[task] = compact(marker)
        return marker

    def read_all(self, phase: str, full: bool = False) -> dict[str, dict[str, Any]]:
        """Every readable marker of ``phase``, task key -> marker: one listing of the phase's folder,
        then the markers not read before, in parallel (on an object store's mirror or a network file
        system a read is a round trip; one at a time, tens of thousands take minutes). As held
        (``compact``: counts, files, node), unless ``full``: then read whole from this folder (a remote
        one's mirror holds every marker the driver adopted) and not kept, for the end of the run's
        statistics and checks, which read each phase once."""
        if not full and phase in self._sealed:
            return dict(self._markers[phase])  # held whole: no listing (a phase's is O(its tasks))
        folder = self.dir / phase
        listed = _list_markers(folder)  # task keys name subfolders: <source>/<shard>
        cache: dict[str, dict[str, Any]] = {} if full else self._markers.setdefault(phase, {})
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
                cache[key] = marker if full else compact(marker)
        return {key: cache[key] for key in listed if key in cache}

    def seal(self, phase: str) -> None:
        """Every task of ``phase`` has finished and its marker is held here (the driver, once a phase ran
        without failures: the run lock keeps other drivers out, and a marker changes only when its work
        is discarded, which ``forget``s it): later ``read_all`` calls of the phase answer from what is
        held instead of listing its folder (one listing is O(the phase's tasks), and planning the next
        phases asks many times: at 372,530 map tasks, seconds each). Its markers were listed when the phase
        started (``read_all``) and each one since came back with its task's result (``adopt``)."""
        held = self._markers.get(phase, {})
        self._markers[phase] = {key: held[key] for key in sorted(held)}  # in listing order
        self._sealed.add(phase)

    def forget(self, phase: str | None = None, task: str | None = None) -> None:
        """Drop markers read before (of one task, one phase, or all): their work was discarded."""
        if phase is None:
            self._markers.clear()
            self._sealed.clear()
        elif task is None:
            self._markers.pop(phase, None)
            self._sealed.discard(phase)
        else:
            self._markers.get(phase, {}).pop(task, None)
            self._sealed.discard(phase)

    def write(self, phase: str, task: str, data: dict[str, Any], written: list[Path] | None = None) -> bytes:
        """``written``: the files the task wrote, named in the marker with their sizes (``files``; see
        ``describe_files``), so a later start can tell a damaged output (run_folder/integrity.py);
        a remote folder uploads them before the marker. Returns the marker's bytes as committed."""
        if self.remote is None:
            if written is not None:
                data["files"] = describe_files(self.root, written)
            body = json.dumps(data, sort_keys=True).encode("utf-8")
            write_bytes_atomic(self.path(phase, task), body)
            return body
        from datapipe.run_folder import remote as remote_folder

        body = remote_folder.commit(self.root, self.remote, self.rel(phase, task), data, list(written or []))
        write_bytes_atomic(self.path(phase, task), body)
        return body

    def adopt(self, phase: str, task: str, marker: dict[str, Any] | bytes) -> dict[str, Any] | None:
        """A marker the driver received as its task's result (its bytes as committed, or the dict):
        cached, so the driver never reads it back; in a remote folder also noted as pulled and written
        to the mirror (``remote.adopt``), so the next ``pull`` and the end of the run's sweep do not
        fetch it from the store. The task's own commit (files, then the marker on the store) stays the
        commit point. Returns the marker as cached (None: not JSON, so not cached: read, or redone)."""
        # As read from the file (lists, not tuples; shared column lists), so cached markers are alike.
        # Bytes (what a Ray task returns) are parsed once; a dict is written out first.
        body = marker if isinstance(marker, bytes) else json.dumps(marker, sort_keys=True).encode("utf-8")
        parsed = _parse_marker(body, self._columns)
        if parsed is None or not isinstance(parsed, dict):
            return None
        if self.remote is not None:
            from datapipe.run_folder import remote as remote_folder

            remote_folder.adopt(self.root, self.remote, self.rel(phase, task), parsed, body)
        self._markers.setdefault(phase, {})[task] = compact(parsed)
        return parsed

    def committed(self, phase: str) -> CommittedPhase:
        """What ``phase`` committed, for the tasks of later phases (a remote folder's workers learn it
        from the driver instead of listing and reading markers): the files its markers name, and the
        markers of a phase in ``read_by_tasks``. From the cached markers: no read of the store."""
        from datapipe.run_folder.remote import CommittedPhase

        markers = self.read_all(phase)
        files = {f["path"]: (f["bytes"], f.get("footer")) for m in markers.values() for f in m.get("files", ())}
        return CommittedPhase(phase, files, dict(markers) if phase in self.read_by_tasks else {})

    def handed(self, files: Sequence[str], markers: Sequence[tuple[str, str]]) -> CommittedPhase:
        """What the driver hands one task of a remote folder (``Task.committed``): the committed entries of
        the ``files`` it reads by path and the ``markers`` ((phase, task key)) it reads."""
        from datapipe.run_folder import remote as remote_folder

        assert self.remote is not None
        given = {(phase, task): m for phase, task in markers if (m := self.read(phase, task)) is not None}
        return remote_folder.handed(self.remote, files, given)

    def install(self, phases: Sequence[CommittedPhase]) -> None:
        """A task's view of a remote folder: what the finished ``phases`` committed, as handed over by
        the driver (``committed``); their files are then fetched when asked for. No-op locally."""
        if self.remote is not None:
            from datapipe.run_folder import remote as remote_folder

            remote_folder.install(self.remote, phases)

    def known_files(self) -> dict[str, list[str]]:
        """Every marker held here (adopted or read), as its path in the run folder -> the files it names."""
        return {
            self.rel(phase, task): [f["path"] for f in marker.get("files", ())]
            for phase, markers in self._markers.items()
            for task, marker in markers.items()
        }


# What a marker holds that only the end of the run reads (the audit's file index, the input reads, the
# counts per stage and reason, a pack task's manifest rows, the task's CPU and memory): not kept by the driver while the run goes
# (``compact``), read back from the folder at its end (``read_all(full=True)``). A map task's marker
# is ~5 kB of JSON and held parsed ~10 KiB; kept whole for every task, the driver grew ~10 KiB per
# task (1.5-2 GB at 149k tasks, ~15 GB at 1.5M: issue 48); compact, a map task's is ~2.3 KiB (its files,
# without their hashes).
END_OF_RUN_ONLY = frozenset(
    "audit_files copies_files reads stage_in stage_skipped stage_recorded rejected stage_edits stage_changed shards"
    " seconds cpu_seconds peak_rss_mib rss_start_mib peak_scope encoder".split()
)


def compact(marker: dict[str, Any]) -> dict[str, Any]:
    """What the driver keeps of a marker while the run goes: its counts, the files it names (path, bytes,
    footer: not their hashes, which only a full read checks: ``read(full=True)``), its node. Its keys
    (and its node's name) interned: JSON parsing makes each marker its own copies of "path", "bytes",
    "footer", ..., a quarter of what a held map marker cost (bench/scaling/driver_crawl.py)."""
    held = {intern(k): v for k, v in marker.items() if k not in END_OF_RUN_ONLY}
    for k, v in held.items():
        if k == "files" and isinstance(v, list):
            held[k] = [{intern(a): b for a, b in f.items() if a != "sha256"} if isinstance(f, dict) else f for f in v]
        elif isinstance(v, dict):
            held[k] = {intern(a) if isinstance(a, str) else a: b for a, b in v.items()}
    if isinstance(held.get("node"), str):
        held["node"] = intern(held["node"])
    return held


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


def _share(shared: dict[int, list[Any]], columns: Any) -> Any:
    """The list equal to ``columns`` seen before, else ``columns`` (remembered). Found by comparing
    lists of its length, cheaper than their ``repr`` as a key (a map task's marker names several
    files, and the driver adopts one per task)."""
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
    collection every few hundred new containers rescans all those kept so far."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return [_load_marker(folder / f"{k}.json", shared) for k in keys]
    finally:
        if paused:
            gc.enable()
