"""Atomic file writes: write to a temporary name in the same folder, then rename.

A reader (or a resumed run) therefore sees either the old file, the complete new
file, or nothing; never half a file. Temporary names are ``<final name>.tmp-<pid>-<8 hex>``
(plus whatever suffix a writer adds to its file, such as DuckDB's ``.wal``), so a
resumed run can recognise and sweep every leftover of a killed process, and nothing
that reads outputs (globs of ``*.parquet``, ``*.arrow``, markers by exact name) ever
matches one.

Testing hook: ``DATAPIPE_FAULT_ENOSPC_AT=<phase>[:<task>]`` (fnmatch patterns, e.g.
``map0:web_zh/*``, ``reduce0``, ``pack``, ``stats``) makes every temporary file the
matching task asks for fail with ``OSError(ENOSPC)``, as a full disk would; the engine
names the task with :func:`fault_scope`. It lets CI cover disk-full handling in every
phase without filling a real disk.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

TMP_MARK = ".tmp-"
# What temp_path_for makes, anywhere in a name: a writer may add its own suffix (DuckDB
# writes <db>.wal beside its database and may spill into a <db>.tmp folder).
TEMP_NAME = re.compile(r"\.tmp-\d+-[0-9a-f]{8}")

_fault_task: str | None = None  # "<phase>:<task>" of the task writing now (see fault_scope)
_written: list[Path] | None = None  # final paths written while recording_writes is active


def temp_path_for(path: Path) -> Path:
    """A unique temporary sibling of ``path`` (same folder, so rename is atomic)."""
    _fault_enospc(path)
    return path.with_name(path.name + _temp_suffix())


def _temp_suffix() -> str:
    """What a temporary file adds to its final name: unique per process and call, and what
    ``is_temp_name``, ``final_name`` and the sweep recognise."""
    return f"{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}"


def is_temp_name(name: str) -> bool:
    return TEMP_NAME.search(name) is not None


def final_name(path: str) -> str:
    """The file a temporary path stands for (for messages: the temporary file is gone by then)."""
    return re.sub(r"\.tmp-\d+-[0-9a-f]{8}[^/]*$", "", path)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], record: bool = True) -> Iterator[Path]:
    """Yield a temporary path to write; on success it is renamed to ``path``. ``record=False``: not
    one of the task's outputs (a copy of another task's file, downloaded), so never uploaded as its own."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(final)
    try:
        yield tmp
        if tmp.exists():
            _fsync_file(tmp)
            os.replace(tmp, final)
            if record:
                note_written(final)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_copy(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary name and a rename, as ``write_bytes_atomic``, but
    without the fsync and unrecorded: for a local copy of an object the store already holds (the
    driver's mirror copy of a marker its task committed, ``run_folder/remote.adopt``). A machine crash
    may leave the copy short; the store's object is the record, and the next run's pull compares the
    two and writes the copy again. The driver does this for every task that ran on another node
    (63 of 64 on 64 nodes): ~0.05 ms of CPU, against ~0.25 ms and a disk round trip's wait (the
    fsync) for ``write_bytes_atomic``, in the run's one serial process."""
    tmp = path + _temp_suffix()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        fd = os.open(tmp, flags, 0o644)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(tmp, flags, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def sweep_temp_files(root: Path) -> int:
    """Delete every temporary file or folder a killed process left under ``root``; returns how many.

    Only names temp_path_for makes are touched, and symlinks are never followed. The caller
    must hold the run folder's lock: a live writer's temporary files look the same.
    """
    removed = 0
    if not root.is_dir():
        return 0
    # The name is checked first: a path object per file of the run (thousands) was most of the walk's CPU.
    for folder, dirs, files in os.walk(root):
        for name in files:
            if not is_temp_name(name):
                continue
            p = Path(folder) / name
            if not p.is_symlink():
                p.unlink(missing_ok=True)
                removed += 1
        for name in list(dirs):
            if not is_temp_name(name):
                continue
            p = Path(folder) / name
            if not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
                dirs.remove(name)
                removed += 1
    return removed


@contextlib.contextmanager
def recording_writes() -> Iterator[list[Path]]:
    """Collect the final path of every file written atomically meanwhile: the files a task wrote,
    which a run folder in object storage uploads and names in the task's marker (run_folder/remote.py).
    One task runs at a time in a process (Ray workers, in-process runs), so one list suffices."""
    global _written
    previous, _written = _written, []
    try:
        yield _written
    finally:
        _written = previous


def note_written(path: Path) -> None:
    """Record a finished file (a writer that renames its temporary file itself calls this)."""
    if _written is not None:
        _written.append(Path(path))


@contextlib.contextmanager
def fault_scope(phase: str, task: str) -> Iterator[None]:
    """Name the task whose writes follow, for the DATAPIPE_FAULT_ENOSPC_AT hook."""
    global _fault_task
    previous, _fault_task = _fault_task, f"{phase}:{task}"
    try:
        yield
    finally:
        _fault_task = previous


def _fault_enospc(path: Path) -> None:
    pattern = os.environ.get("DATAPIPE_FAULT_ENOSPC_AT")
    if not pattern or _fault_task is None:
        return
    if ":" not in pattern:
        pattern += ":*"
    if fnmatch.fnmatchcase(_fault_task, pattern):
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (DATAPIPE_FAULT_ENOSPC_AT={pattern})", str(path))


def _fsync_file(path: Path) -> None:
    # Durability matters for resume after a machine crash, not only a process kill.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
