"""A run folder in object storage: the store is the record, a local mirror is where tasks work.

Tasks read and write the run folder's local mirror (``storage.mirror_of``) exactly as they do a
local run folder. What makes the store the record:

* **The marker is the commit point.** When a task finishes, every file it wrote (collected by
  ``atomic.recording_writes``) is uploaded, and only then its marker, which names those files
  with their sizes. An object store shows an object only once its upload completed, so a marker
  that exists names files that exist whole.
* **Readers trust only what a marker names.** The driver holds every committed marker: those of
  the markers on the store when it starts (:func:`pull`, once, under the run lock) and each of its
  tasks' markers, which come back with their results (:func:`adopt`). A task learns what earlier
  phases committed from the driver, not from the store: each finished phase as one
  :class:`CommittedPhase` (the files its markers name, with sizes and footer lengths), which the
  executor hands to every task of later phases (on Ray, one object per phase in Ray's object
  store), and which a process installs once (:func:`install`); so a task lists nothing and reads
  no marker, whatever the size of the run. A file a committed phase names is downloaded when a task
  asks the run folder for its path (:func:`fetch`, through ``RunFolder``'s path methods) and it is
  missing locally or differs in size, so a node fetches the inputs of its own tasks, not the whole
  run. A task that reads a part of a Parquet file (a partition its row
  groups, a map task its shard's decisions) opens it with :func:`open_parquet` instead: read in
  place, only that part crosses the store. The driver downloads the kept and rejected documents before it
  builds the statistics. A file a killed attempt uploaded without its marker is never read, and it
  is deleted by :func:`sweep` under the run lock.
* The driver's own files (``run.json``, ``stats.duckdb``, the shard manifest) are uploaded when
  written; ``run.json`` last, so ``status: complete`` on the store means everything else is there.

So a run killed anywhere resumes from the store alone: a fresh machine with an empty mirror pulls
the committed work and redoes the rest, with byte-identical outputs.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import pyarrow.parquet as pq

from datapipe.run_folder.files import describe_files
from datapipe.storage import parquet_reads
from datapipe.storage import uri as storage
from datapipe.storage.atomic import is_temp_name, write_bytes_atomic, write_copy

MARKERS = "_work/markers"
# Written by the driver itself, not by a task: kept by the sweep although no marker names them.
DRIVER_FILES = storage.RUN_FILES
MANAGED_PREFIXES = ("docs/", "rejected/", "copies/", "shards/", "models/", "_work/")

# Markers read from the store at once (pull, sweep): each read is a round trip, and one at a time the
# driver spent a round trip per task of the run before each phase and again at its end.
MARKER_FETCHERS = 16
MARKER_SLICE = 512
_seen: dict[str, set[str]] = {}  # remote root -> markers already pulled or committed by this process
_named: dict[str, dict[str, int]] = {}  # remote root -> {file a pulled marker names: its size}
_footers: dict[str, dict[str, int]] = {}  # remote root -> {Parquet file a pulled marker names: its footer's length}
_given: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}  # remote root -> phase -> task -> marker (install)
# remote root -> the CommittedPhase values installed here, by id (held, so an id is not reused meanwhile)
_installed: dict[str, dict[int, CommittedPhase]] = {}
_lock = threading.Lock()


@dataclass(frozen=True, eq=False)
class CommittedPhase:
    """What one finished phase committed, as the driver holds it, for the tasks of later phases:
    every file its markers name (path in the run folder -> bytes, Parquet footer length or None),
    and the markers themselves for a phase whose markers tasks read (``markers``, task key ->
    marker: the pre-pass's line counts; empty for the others, whose markers can be large).
    Built once per phase by the driver (``MarkerStore.committed``) and never changed: a phase whose
    work is discarded and redone gets a new one."""

    phase: str
    files: dict[str, tuple[int, int | None]]
    markers: dict[Any, dict[str, Any]]  # task key (or, handed to one task, (phase, task key)) -> marker


def install(uri: str, phases: Sequence[CommittedPhase]) -> None:
    """A task's view of the committed work it reads (in a worker process, before each task): what the
    driver handed it (``CommittedPhase``: the files it reads by path, with sizes and footer lengths,
    and the markers it reads), and nothing else: the tables a previous task installed are replaced, so a
    worker holds its current task's inputs, however many files the run has (before, each worker
    installed every committed phase: +148 MiB at 450k files, issue 48)."""
    with _lock:
        _named[uri] = {rel: size for p in phases for rel, (size, _) in p.files.items()}
        _footers[uri] = {rel: f for p in phases for rel, (_, f) in p.files.items() if f is not None}
        given: dict[str, dict[str, dict[str, Any]]] = {}
        for p in phases:
            for (phase, task), marker in p.markers.items() if p.phase == HANDED else ():
                given.setdefault(phase, {})[task] = marker
            if p.phase != HANDED and p.markers:
                given.setdefault(p.phase, {}).update(p.markers)
        _given[uri] = given
        _installed[uri] = {id(p): p for p in phases}


# ``CommittedPhase.phase`` of what the driver hands one task: its markers are keyed (phase, task key).
HANDED = "<task inputs>"


def handed(uri: str, files: Iterable[str], markers: dict[tuple[str, str], dict[str, Any]]) -> CommittedPhase:
    """The committed entries of ``files`` (paths in the run folder; those no marker names are left out:
    never written, like a shard's combine decisions when it has none) as this process holds them, and
    ``markers``: what the driver hands one task (``install``)."""
    with _lock:
        named, footers = _named.get(uri, {}), _footers.get(uri, {})
        entries = {rel: (named[rel], footers.get(rel)) for rel in files if rel in named}
    return CommittedPhase(HANDED, entries, dict(markers))


def given_marker(uri: str, phase: str, task: str) -> dict[str, Any] | None:
    """A marker an installed phase handed over (``CommittedPhase.markers``), or None."""
    with _lock:
        return _given.get(uri, {}).get(phase, {}).get(task)


class _MarkerFile(TypedDict):
    """One file a marker names: its path in the run folder and its size."""

    path: str
    bytes: int


def commit(root: Path, uri: str, rel_marker: str, data: dict[str, Any], written: list[Path]) -> bytes:
    """Upload a task's files, then its marker naming them; returns the marker's bytes."""
    files = describe_files(root, written)
    for f in files:
        storage.upload(root / f["path"], storage.child(uri, f["path"]))
    data["files"] = files
    body = json.dumps(data, sort_keys=True).encode("utf-8")
    storage.write_bytes(storage.child(uri, rel_marker), body)
    with _lock:
        _seen.setdefault(uri, set()).add(rel_marker)
        _note(uri, files)
    return body


def adopt(root: Path, uri: str, rel_marker: str, marker: dict[str, Any], body: bytes) -> None:
    """A marker the driver received as its task's result (the task committed it to the store first):
    noted as pulled, with the files it names, and written to this mirror, so that neither the pull
    before the next phase nor the end of the run's sweep reads it back from the store. ``body``: its
    bytes as the task committed them (``commit`` returns them), ``marker`` parsed from them."""
    local = f"{root}/{rel_marker}"
    try:  # on a node that ran the task, its mirror holds the same bytes already
        with open(local, "rb") as f:
            same = f.read() == body
    except FileNotFoundError:
        same = False
    if not same:  # the task ran on another node: a copy of what the store holds, not fsynced
        write_copy(local, body)
    with _lock:
        _seen.setdefault(uri, set()).add(rel_marker)
        _note(uri, marker.get("files", []))


def _note(uri: str, files: list[Any]) -> None:
    """Remember the files a marker names (sizes, footer lengths); under ``_lock``."""
    _named.setdefault(uri, {}).update({f["path"]: f["bytes"] for f in files})
    _footers.setdefault(uri, {}).update({f["path"]: f["footer"] for f in files if "footer" in f})


def forget(uri: str, rel_marker: str, files: list[str]) -> None:
    """Un-commit a task whose files are damaged (run_folder/integrity.py): its marker deleted on the
    store and forgotten here with the damaged files, so the task is redone and they are not fetched."""
    storage.delete(storage.child(uri, rel_marker))
    with _lock:
        _seen.get(uri, set()).discard(rel_marker)
        for rel in files:
            _named.get(uri, {}).pop(rel, None)
            _footers.get(uri, {}).pop(rel, None)
            parquet_reads.forget(storage.child(uri, rel))


def publish(root: Path, uri: str, rel: str) -> None:
    """Upload one file the driver wrote (or delete its remote copy when it is gone locally)."""
    local = root / rel
    if local.is_file():
        storage.upload(local, storage.child(uri, rel))
    else:
        storage.delete(storage.child(uri, rel))


def fetch(root: Path, uri: str, path: Path) -> Path:
    """``path`` (in the mirror), downloaded first when a pulled marker names it and it is not here whole."""
    rel = path.relative_to(root).as_posix()
    with _lock:
        size = _named.get(uri, {}).get(rel)
    if size is not None and not (path.is_file() and path.stat().st_size == size):
        storage.download(storage.child(uri, rel), path)
    return path


def open_parquet(root: Path, uri: str, path: Path) -> pq.ParquetFile:
    """A Parquet file of the run (in the mirror) opened for reading: the mirror's copy when this node
    has it whole (it wrote it, or downloaded it), else the object read in place, only the row groups
    asked for (storage/parquet_reads.py). A node reading a part of another node's file moves that
    part through the store, not the whole file."""
    rel = path.relative_to(root).as_posix()
    with _lock:
        size = _named.get(uri, {}).get(rel)
        footer = _footers.get(uri, {}).get(rel)
    if size is None or (path.is_file() and path.stat().st_size == size):
        return pq.ParquetFile(path)
    return parquet_reads.remote_parquet(storage.child(uri, rel), size, footer)


def is_committed(root: Path, uri: str, path: Path) -> bool:
    """Whether a pulled marker names ``path`` (in the mirror), without downloading it."""
    with _lock:
        return path.relative_to(root).as_posix() in _named.get(uri, {})


def pull(root: Path, uri: str, full: bool = False, files: tuple[str, ...] = ()) -> int:
    """Bring the mirror up to date with the committed work on the store; returns files downloaded.

    ``full`` (the driver, under the run lock, at the start of a run) also drops local markers the
    store does not have (a mirror left by an older run of this folder) and takes run.json from the store.
    ``files``: folders (``docs/``) whose named files are downloaded now rather than when asked for.
    """
    remote_markers = {f.uri[len(storage.child(uri, "")) :]: f for f in storage.list_files(storage.child(uri, MARKERS))}
    remote_markers = {rel: f for rel, f in remote_markers.items() if rel.endswith(".json") and not is_temp_name(rel)}
    downloaded = 0
    named: set[str] = set(DRIVER_FILES) | set(remote_markers)
    if full:
        with _lock:
            _seen.pop(uri, None)
            _named.pop(uri, None)
            _footers.pop(uri, None)
            _given.pop(uri, None)
            _installed.pop(uri, None)
        local_dir = root / MARKERS
        if local_dir.is_dir():
            for p in local_dir.rglob("*.json"):
                if p.relative_to(root).as_posix() not in remote_markers:
                    p.unlink()
        run_json = storage.info(storage.child(uri, "run.json"))
        if run_json is None:
            (root / "run.json").unlink(missing_ok=True)
        else:
            storage.download(run_json.uri, root / "run.json")
            downloaded += 1
    with _lock:
        seen = set(_seen.get(uri, set()))
    unseen = {f.uri: rel for rel, f in sorted(remote_markers.items()) if rel not in seen}
    for u, body in _read_all(list(unseen)):
        rel = unseen[u]
        if body is None:
            continue
        try:
            marker = json.loads(body)
        except ValueError:
            continue  # never the case for a completed upload; an unreadable marker means redo
        named.update(e["path"] for e in marker.get("files", []))
        with _lock:
            _note(uri, marker.get("files", []))
        local_marker = root / rel
        if not (local_marker.is_file() and local_marker.read_bytes() == body):
            write_bytes_atomic(local_marker, body)
        with _lock:
            _seen.setdefault(uri, set()).add(rel)
    with _lock:
        wanted = [rel for rel in _named.get(uri, {}) if rel.startswith(files)] if files else []
    for rel in wanted:
        local = root / rel
        if not local.is_file():
            downloaded += 1
        fetch(root, uri, local)
    if full:  # files of an older run in the mirror must not be globbed into this one's statistics
        for prefix in MANAGED_PREFIXES:
            folder = root / prefix
            for p in sorted(folder.rglob("*")) if folder.is_dir() else []:
                if p.is_file() and p.relative_to(root).as_posix() not in named:
                    p.unlink()
    return downloaded


def named_files(uri: str, root: Path | None = None, known: Mapping[str, Iterable[str]] | None = None) -> set[str]:
    """Every path (relative to the run folder) the store's markers name, and the markers themselves.
    ``known``: markers the caller holds parsed (marker path -> the files it names), not read again.
    ``root``: this process's mirror, whose copies of the other markers it committed, pulled or adopted
    are read instead of the store's (the same bytes: a marker is written once, and ``forget`` drops a
    deleted one); only the rest are read from the store."""
    known = known or {}
    keep: set[str] = set(DRIVER_FILES)
    prefix = storage.child(uri, "")
    with _lock:
        seen = set(_seen.get(uri, set())) if root is not None else set()
    listed = [f.uri for f in storage.list_files(storage.child(uri, MARKERS))]
    local: list[tuple[str, bytes | None]] = []
    remote: list[str] = []
    for u in listed:
        rel = u[len(prefix) :]
        if rel in known:  # the caller holds it parsed: not read again, not even from the mirror
            keep.add(rel)
            keep.update(known[rel])
            continue
        path = root / rel if root is not None and rel in seen else None
        body = path.read_bytes() if path is not None and path.is_file() else None
        if body is None:
            remote.append(u)
        else:
            local.append((u, body))
    for u, body in [*local, *_read_all(remote)]:
        rel = u[len(prefix) :]
        try:
            marker = json.loads(body) if body is not None else None
        except ValueError:
            marker = None
        if isinstance(marker, dict):
            keep.add(rel)
            keep.update(e["path"] for e in marker.get("files", []))
    return keep


def _read_all(uris: list[str]) -> Iterator[tuple[str, bytes | None]]:
    """Each object's bytes (None: gone), in order, MARKER_FETCHERS reads at a time; a slice of them held
    at once, not every marker of the run."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=MARKER_FETCHERS) as pool:
        for i in range(0, len(uris), MARKER_SLICE):
            chunk = uris[i : i + MARKER_SLICE]
            yield from zip(chunk, pool.map(storage.read_bytes, chunk))


def sweep(uri: str, root: Path | None = None, known: Mapping[str, Iterable[str]] | None = None) -> int:
    """Delete objects under the managed folders that no marker names: uploads of a killed attempt.
    Only under the run lock (a live task's upload looks the same until its marker exists).
    ``root``, ``known``: the markers this process already holds (``named_files``)."""
    keep = named_files(uri, root, known)
    removed = 0
    prefix = storage.child(uri, "")
    for f in storage.list_files(uri):
        rel = f.uri[len(prefix) :]
        if rel.startswith(MANAGED_PREFIXES) and rel not in keep or is_temp_name(rel):
            storage.delete(f.uri)
            removed += 1
    return removed


def wipe(root: Path, uri: str, managed: tuple[str, ...]) -> None:
    """--fresh: delete the managed names on the store and in the mirror."""
    for name in managed:
        target = storage.child(uri, name)
        if storage.info(target) is not None:
            storage.delete(target)
        else:
            storage.delete_tree(target)
    with _lock:
        _seen.pop(uri, None)
    for name in managed:
        p = root / name
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)


def check_usable(uri: str, lock_names: tuple[str, ...]) -> None:
    """Refuse a non-empty remote folder that is not a datapipe run, as for a local one."""
    storage.check_bucket(uri)
    if storage.info(storage.child(uri, "run.json")) is not None:
        return
    prefix = storage.child(uri, "")
    for f in storage.list_files(uri):
        rel = f.uri[len(prefix) :]
        if rel not in lock_names and not is_temp_name(rel) and not rel.startswith(MANAGED_PREFIXES):
            raise storage.StorageError(
                f"output folder {uri} is not empty and holds no run.json; refusing to "
                f"write there (choose an empty or new folder with --output)"
            )
