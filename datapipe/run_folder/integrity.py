"""Finished work whose files are no longer what its marker recorded: found, and discarded so it is redone.

A completion marker names the files its task wrote (``files``: path, bytes and sha256;
``run_folder/files.py``; markers of older runs have the sha256 of documents files only) and a pack
marker the sha256 of its shards (its manifest rows). A file that is missing, of another size or
of another sha256 means that task's work is damaged: its marker is deleted, with the damaged file, so the
run does the task again (tasks are deterministic: the redone files are identical to the lost
ones, and work done after it from the same inputs stays valid).

Where the files are looked for: a local run folder on disk; a run folder in object storage on
the store (one listing of it: the store is the record, ``run_folder/remote.py``), where the
marker itself must be too; the sha256 of a remote file is taken of its mirror copy, when there
is one of the right size (the copy statistics and the next tasks read).

Cost: sizes are one ``stat`` per file a marker names (or one LIST of the store), cheap next to
any run. Hashes are read only when asked for (``hashes=True``: once, when a run starts, of the
work of earlier attempts), and only of what the markers record a sha256 of: every file of a run
written by this datapipe, intermediates included (one read of what the earlier attempts wrote).
Markers of runs written before markers named their files are taken as they are.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datapipe.run_folder.layout import MARKERS_DIR, PACK_PHASE, RunFolder
from datapipe.storage import uri as storage
from datapipe.tokens.shard_format import file_sha256


@dataclass(frozen=True)
class Damage:
    """One damaged output: the task (phase, key) that wrote it, the file (relative path), and what is wrong."""

    phase: str
    key: str
    path: str
    what: str


def find_damage(folder: RunFolder, hashes: bool) -> list[Damage]:
    """Every file a marker of ``folder`` names that is missing, of another size or (``hashes``) of
    another sha256 than recorded, with the task that wrote it; a marker a remote store lacks too."""
    listed: dict[str, int] | None = None
    if folder.remote is not None:
        prefix = storage.child(folder.remote, "")
        listed = {f.uri[len(prefix) :]: f.size for f in storage.list_files(folder.remote)}
    found: list[Damage] = []
    # Unreadable markers are left out: MarkerStore.read says None for them, so their tasks are redone anyway.
    # Whole (``full``): a pack marker's shard rows carry the hashes checked; one phase at a time, not kept.
    markers = ((phase, key, m) for phase in _phases(folder) for key, m in folder.markers.read_all(phase, full=True).items())
    # Paths as text, sized with os.stat: building pathlib paths for every marker and file was most of
    # this check's CPU (at the end of a run, where it runs twice).
    root = os.fspath(folder.root)
    to_hash: list[tuple[str, str, str, str]] = []  # phase, key, file, its recorded sha256
    for phase, key, marker in markers:
        if listed is not None and (rel_marker := folder.markers.rel(phase, key)) not in listed:
            found.append(Damage(phase, key, rel_marker, "the marker is not on the store"))
            continue
        damaged, digests = _check_marker(folder, root, phase, key, marker, listed)
        found += damaged
        to_hash += [(phase, key, rel, digest) for rel, digest in sorted(digests.items())]
    if hashes:
        found += _check_hashes(folder, to_hash, listed)
    return found


# Files hashed at once when a run starts again: reading and hashing release the interpreter lock, so
# the earlier attempts' files (every file of a run records its sha256) are read by several threads.
HASHERS = 8


def _check_hashes(folder: RunFolder, to_hash: list[tuple[str, str, str, str]], listed: dict[str, int] | None) -> list[Damage]:
    def check(item: tuple[str, str, str, str]) -> Damage | None:
        phase, key, rel, digest = item
        local = folder.root / rel
        if listed is not None and _size(local) != listed.get(rel):
            return None  # a remote file with no whole mirror copy: sized on the store, not read
        if not local.is_file():
            return Damage(phase, key, rel, "missing")
        if file_sha256(local) != digest:
            return Damage(phase, key, rel, "its sha256 differs from the one recorded (damaged in place)")
        return None

    if len(to_hash) < 2:
        results = [check(item) for item in to_hash]
    else:
        with ThreadPoolExecutor(max_workers=min(HASHERS, len(to_hash))) as pool:
            results = list(pool.map(check, to_hash))
    return [d for d in results if d is not None]


def _phases(folder: RunFolder) -> list[str]:
    """The phases that have markers in the folder (the mirror's, for a remote folder)."""
    base = folder.markers.dir
    return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []


def _check_marker(
    folder: RunFolder, root: str, phase: str, key: str, marker: dict[str, Any], listed: dict[str, int] | None
) -> tuple[list[Damage], dict[str, str]]:
    """The marker's files that are missing or of another size, and the sha256 recorded of the others."""
    out = []
    digests: dict[str, str] = {}
    for entry in marker.get("files") or []:
        rel, size = entry["path"], entry["bytes"]
        have = listed.get(rel) if listed is not None else _size(os.path.join(root, rel))
        if have is None:
            out.append(Damage(phase, key, rel, "missing"))
        elif have != size:
            out.append(Damage(phase, key, rel, f"{have} bytes, {size} recorded (truncated or replaced)"))
        elif "sha256" in entry:
            digests[rel] = entry["sha256"]
    if phase == PACK_PHASE:  # the shards' sha256 are in the marker's manifest rows
        bad = {d.path for d in out}
        digests.update(
            {row["path"]: row["sha256"] for row in marker.get("shards") or [] if row.get("sha256") and row["path"] not in bad}
        )
    return out, digests


def _size(path: str | Path) -> int | None:
    """The size of a regular file (a symlink's target's), or None: one stat."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def discard(folder: RunFolder, damaged: list[Damage], log: Callable[[str], None]) -> int:
    """Delete the markers of the tasks that wrote damaged files, and those files, so the run redoes
    the tasks; returns how many tasks. The caller holds the run folder's lock."""
    tasks: dict[tuple[str, str], list[Damage]] = {}
    for d in damaged:
        tasks.setdefault((d.phase, d.key), []).append(d)
    for (phase, key), found in sorted(tasks.items()):
        first = found[0]
        more = f" (and {len(found) - 1} more of its files)" if len(found) > 1 else ""
        log(f"datapipe: {folder.location}/{first.path}: {first.what}{more}; redoing {phase} {key}")
        marker = folder.markers.path(phase, key)
        files = [d.path for d in found if not d.path.startswith(f"{MARKERS_DIR}/")]
        if folder.remote is not None:
            from datapipe.run_folder import remote as remote_folder

            remote_folder.forget(folder.remote, folder.markers.rel(phase, key), files)
        marker.unlink(missing_ok=True)
        folder.markers.forget(phase, key)
        for rel in files:
            (folder.root / rel).unlink(missing_ok=True)
    return len(tasks)
