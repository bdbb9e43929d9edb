"""Per-code-point lookup tables kept on disk, so a process loads them instead of rebuilding them.

Tables such as the shingle normalizer's (``dedup/shingles.py``) call ``unicodedata`` or ``str``
methods once per code point: 1.1M Python calls, about 0.5 s of CPU each, in every process that
runs the stage (each Ray worker, and every small run's driver). Their values depend only on the
Unicode database of the running Python, so a table is stored under datapipe's cache, named by its
builder's version, a digest of the builder's source file and of what else it reads (``depends``:
e.g. the character ranges it is built from) and ``unicodedata.unidata_version``, and rebuilt
whenever that file is missing, unreadable or not of the expected dtype and shape. The digest is
what keeps an edited builder (or edited ranges in another module) from loading a stale table:
a version number someone must remember to bump would not.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import sys
import unicodedata
from collections.abc import Callable
from pathlib import Path

import numpy as np

SIZE = 0x110000


def _digest(build: Callable[[], np.ndarray], depends: str) -> str:
    h = hashlib.sha256(depends.encode("utf-8", "surrogatepass"))
    h.update(Path(__file__).read_bytes())  # builders call this module's helpers (composing_marks)
    try:
        source = inspect.getsourcefile(build)
        if source:
            h.update(Path(source).read_bytes())
    except (OSError, TypeError):
        h.update(b"no-source")
    return h.hexdigest()[:12]


def _path(name: str, version: int, build: Callable[[], np.ndarray] | None = None, depends: str = "") -> Path:
    from datapipe.storage.cache import cache_dir

    py = f"py{sys.version_info[0]}{sys.version_info[1]}"
    digest = f"-{_digest(build, depends)}" if build is not None else ""
    return cache_dir() / "tables" / f"{name}-v{version}{digest}-unicode{unicodedata.unidata_version}-{py}.npy"


def cached_table(name: str, version: int, dtype: type, build: Callable[[], np.ndarray], depends: str = "") -> np.ndarray:
    """``build()`` (an array of ``SIZE`` entries of ``dtype``), read from the cache when present.
    ``depends``: a text form of whatever else ``build`` reads (ranges defined in other modules);
    the builder's own source file is digested too."""
    path = _path(name, version, build, depends)
    try:
        table = np.load(path, allow_pickle=False)
        if table.dtype == np.dtype(dtype) and table.shape == (SIZE,):
            return table
    except (OSError, ValueError, EOFError):
        pass
    table = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.save(f, table, allow_pickle=False)
        os.replace(tmp, path)  # whole or absent: a concurrent reader never sees half a table
    except OSError:
        pass  # a read-only cache only costs the rebuild
    return table


def composing_marks() -> np.ndarray:
    """bool per code point: the characters a per-character mapping must leave to a real normaliser,
    because what they become depends on their neighbours: combining marks (canonical reordering) and
    the second members of canonical pairs (NFC_QC = Maybe: composed with the character before them),
    the Hangul V and T jamo among them (algorithmic pairs, in no decomposition entry)."""
    marks = np.zeros(SIZE, dtype=bool)
    marks[0x1161:0x1176] = marks[0x11A8:0x11C3] = True
    for c in range(SIZE):
        ch = chr(c)
        if unicodedata.combining(ch):
            marks[c] = True
        d = unicodedata.decomposition(ch)
        if d and not d.startswith("<"):
            parts = d.split()
            if len(parts) == 2:
                marks[int(parts[1], 16)] = True
    return marks
