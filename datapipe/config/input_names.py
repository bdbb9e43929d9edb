"""How an input file is named in document ids: the same on every machine and after moving the data.

A document id is ``<source>/<input name>#<record>``. The input name is

- the path relative to the pipeline file's folder, for inputs inside it (as always), or
- for inputs outside it, the path relative to the fixed (wildcard-free) folder at the start
  of the ``paths`` pattern that matched it: ``/data/cc/**/*.warc.gz`` names
  ``/data/cc/2024/a.warc.gz`` as ``2024/a.warc.gz``; a pattern without wildcards names the file
  by its file name.

Paths are taken as written (made absolute and normalized, symlinks *not* resolved), so the
same data reached through a symlink, a different mount point or another checkout gets the
same ids, and no id holds an absolute path (or the ``//`` that used to follow the source).
File names that are not valid UTF-8 keep their bytes as ``\\xNN`` escapes.
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path


def lexical(path: Path | str) -> str:
    """Absolute and normalized without touching the file system (symlinks stay as written)."""
    return os.path.normpath(os.path.abspath(os.fspath(path)))


def fixed_prefix(pattern: str) -> str:
    """The folder a glob pattern starts from: its leading components without wildcards."""
    parts = Path(lexical(pattern)).parts
    fixed: list[str] = []
    for part in parts:
        if glob.has_magic(part):
            break
        fixed.append(part)
    else:
        fixed = fixed[:-1]  # no wildcard at all: the pattern is the file itself
    return os.path.join(*fixed) if fixed else os.sep


def input_name(path: Path, pattern: str, base: Path) -> str:
    """The name of ``path`` (matched by ``pattern``, both as the config resolved them) in document ids."""
    p, root = lexical(path), lexical(base)
    if os.path.commonpath([p, root]) != root:
        root = fixed_prefix(pattern)
        if os.path.commonpath([p, root]) != root:  # cannot happen for a path glob matched; stay relative
            root = os.path.dirname(p)
    return display_name(Path(os.path.relpath(p, root)).as_posix())


def display_name(path: str) -> str:
    """A path as text that is valid UTF-8: a file name that is not (its bytes were decoded by
    ``os.fsdecode`` with surrogateescape) keeps those bytes as ``\\xNN`` escapes. Stable: the same
    bytes give the same name on every run, so run.json can record and compare it."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


_ESCAPED_BYTE = re.compile(rb"\\x([0-9a-f]{2})")


def path_of_display_name(name: str) -> str:
    """The file-system path behind ``display_name(path)``: its ``\\xNN`` escapes turned back into the
    raw bytes, decoded as ``os.fsdecode`` does. A name that exists as written (a file whose name really
    holds a backslash and an x) is taken as it is."""
    if "\\x" not in name or os.path.lexists(name):
        return name
    return os.fsdecode(_ESCAPED_BYTE.sub(lambda m: bytes([int(m.group(1), 16)]), name.encode("utf-8")))
