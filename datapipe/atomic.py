"""Atomic file writes: write to a temporary name in the same folder, then rename.

A reader (or a resumed run) therefore sees either the old file, the complete new
file, or nothing; never half a file. Temporary names carry TMP_MARK so a resumed
run can sweep leftovers of a killed one.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

TMP_MARK = ".tmp-"


def temp_path_for(path: Path) -> Path:
    """A unique temporary sibling of ``path`` (same folder, so rename is atomic)."""
    return path.with_name(f"{path.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path to write; on success it is renamed to ``path``."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(final)
    try:
        yield tmp
        if tmp.exists():
            _fsync_file(tmp)
            os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def sweep_temp_files(root: Path) -> int:
    """Delete temporary files left by a killed run under ``root``; returns how many."""
    removed = 0
    if not root.exists():
        return 0
    for p in root.rglob(f"*{TMP_MARK}*"):
        if p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)
            removed += 1
    return removed


def _fsync_file(path: Path) -> None:
    # Durability matters for resume after a machine crash, not only a process kill.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
