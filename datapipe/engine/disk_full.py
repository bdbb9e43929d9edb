"""Recognising a full disk (or an exhausted quota) in whatever wrapping it arrives.

It reaches the driver as an OSError (run.json, statistics), as a RayTaskError whose cause
is one (a task's writes), or only as text: pyarrow and DuckDB put the OS message into
their own exception types. All of them become one line naming the path, and the same
command resumes once space is freed (finished tasks keep their markers).
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass
from pathlib import Path

from datapipe.storage.atomic import final_name

_CODES = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}
_TEXT = re.compile(r"No space left on device|Disk quota exceeded|errno:? ?(?:28|122)\b", re.IGNORECASE)
_QUOTED_PATH = re.compile(r"""["'](/[^"'\n]+)["']""")


@dataclass(frozen=True)
class DiskFull:
    path: str | None
    what: str

    def message(self, root: Path) -> str:
        where = f"writing {self.path}" if self.path else f"writing into {root}"
        return (
            f"disk full ({self.what}) while {where}: free space on that file system (or raise the quota) "
            f"and run the same command again to resume; finished work is kept"
        )


def find_disk_full(exc: BaseException) -> DiskFull | None:
    """The disk-full error inside ``exc`` (its causes, contexts and Ray's wrapped cause), if any."""
    chain = _chain(exc)
    for e in chain:
        if isinstance(e, OSError) and e.errno in _CODES:
            path = e.filename if isinstance(e.filename, str) else None
            return DiskFull(final_name(path) if path else _path_in(str(e)), _CODES[e.errno])
    # Deepest first: a wrapper's text (Ray's) carries a traceback full of source file paths.
    for e in reversed(chain):
        text = str(e)
        if _TEXT.search(text):
            quota = "quota" in text.lower() or re.search(r"errno:? ?122", text, re.IGNORECASE)
            return DiskFull(_path_in(text), _CODES[errno.EDQUOT if quota else errno.ENOSPC])
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop(0)
        if any(e is o for o in out):
            continue
        out.append(e)
        todo += [n for n in (getattr(e, "cause", None), e.__cause__, e.__context__) if isinstance(n, BaseException)]
    return out


def _path_in(text: str) -> str | None:
    m = _QUOTED_PATH.search(text)
    return final_name(m.group(1)) if m else None
