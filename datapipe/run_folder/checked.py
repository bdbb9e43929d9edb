"""Reading a finished run's files only as its tasks wrote them: each against the size and sha256
its completion marker recorded (``run_folder/files.py``), refused by name when it differs.

The run itself checks its outputs when it starts again (``run_folder/integrity.py``) and redoes
what is damaged. What reads a finished run afterwards (exports, ``datapipe sql --verify``, a run
re-deciding from it with ``--from``) checks here the files it reads: a documents file whose sha256
is not the recorded one (a bit flipped in a data page keeps its size and, in a compressed page,
often decodes: to other text) is refused with ``DamagedRunFile``, which names the file and says
to run the same `datapipe run` command again: that redoes the task that wrote the file, with the
same bytes.

Where the record is: the completion markers under ``_work/markers`` (of a run folder in object
storage, read from the store). A run whose ``_work`` was deleted has none: nothing can be checked
against it, and ``RecordedFiles.available`` says so.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from datapipe.run_folder.layout import RunFolder, RunFolderError
from datapipe.storage import uri as storage

READ_BLOCK = 1 << 20


class DamagedRunFile(RunFolderError):
    """A file of a finished run is not what the task that wrote it recorded (size or sha256)."""

    hint = (
        "run the same `datapipe run` command again: it finds the damaged file, redoes the task that "
        "wrote it (the same bytes) and finishes the run; then run this command again"
    )


@dataclass(frozen=True)
class Recorded:
    """What a marker says of one file: its size, and its sha256 where the marker has one."""

    phase: str
    task: str
    bytes: int
    sha256: str | None


class RecordedFiles:
    """The files a finished run's markers name (path relative to the run folder -> ``Recorded``),
    and the checks of files read against them; each file is checked once per instance."""

    def __init__(self, folder: RunFolder, location: str | None = None) -> None:
        self.folder = folder
        self.location = location or folder.location  # how messages name the run folder
        self._files: dict[str, Recorded] = {}
        self._checked: set[str] = set()
        base = folder.markers.dir
        phases = sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
        for phase in phases:
            for task, marker in folder.markers.read_all(phase, full=True).items():  # whole: the files' hashes
                for entry in marker.get("files") or ():
                    self._files[entry["path"]] = Recorded(phase, task, int(entry["bytes"]), entry.get("sha256"))
        self.available = bool(self._files)

    def get(self, rel: str) -> Recorded | None:
        return self._files.get(rel)

    def files(self, prefixes: tuple[str, ...]) -> dict[str, Recorded]:
        """The recorded files under ``prefixes`` (paths relative to the run folder)."""
        return {rel: r for rel, r in self._files.items() if rel.startswith(prefixes)}

    def check(self, rel: str, path: str | os.PathLike[str] | None = None, reader: str = "") -> None:
        """Raise ``DamagedRunFile`` unless the file at ``rel`` (read at ``path``: a local path, or the
        mirror path of an object, read from the store) has the recorded size and sha256. A file no
        marker names is not checked (a run of a datapipe before markers named their files)."""
        if rel in self._checked or not self.available:
            return
        recorded = self._files.get(rel)
        if recorded is None:
            return
        local = Path(path) if path is not None else self.folder.root / rel
        what = damage(local, recorded)
        if what is not None:
            raise DamagedRunFile(f"{self.location}/{rel}{reader}: {what}; it is not the file its task wrote")
        self._checked.add(rel)

    def first_damaged(self, rels: list[str]) -> tuple[str, str] | None:
        """(path, what is wrong) of the first of ``rels`` that differs from its record, else None."""
        for rel in rels:
            recorded = self._files.get(rel)
            if recorded is None:
                continue
            what = damage(self.folder.root / rel, recorded)
            if what is not None:
                return rel, what
        return None


def damage(path: Path, recorded: Recorded) -> str | None:
    """What is wrong with ``path`` against ``recorded`` (missing, another size, another sha256), or None."""
    size = _size(path)
    if size is None:
        return "missing"
    if size != recorded.bytes:
        return f"{size} bytes, {recorded.bytes} recorded (truncated or replaced)"
    if recorded.sha256 is not None and sha256_of(path) != recorded.sha256:
        return "its sha256 differs from the one recorded when it was written (damaged in place)"
    return None


def _size(path: Path) -> int | None:
    uri = storage.remote_of(path)
    if uri is None:
        try:
            return path.stat().st_size if path.is_file() else None
        except OSError:
            return None
    found = storage.info(uri)
    return None if found is None else found.size


def sha256_of(path: str | os.PathLike[str]) -> str:
    """sha256 of a local file (plain reads: inside a task, not recorded as one of its inputs), or of an
    object (a mirror path) streamed from the store."""
    h = hashlib.sha256()
    with open(path, "rb") if storage.remote_of(path) is None else storage.open_input(path) as f:
        while block := f.read(READ_BLOCK):
            h.update(block)
    return h.hexdigest()


def recorded_files(folder: RunFolder, location: str | None = None) -> RecordedFiles:
    """The record of ``folder``'s files; a run folder in object storage reads its markers from the store."""
    folder.pull()
    return RecordedFiles(folder, location)
