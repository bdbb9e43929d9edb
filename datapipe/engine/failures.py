"""Failed tasks told once, in datapipe's words: the full tracebacks of a failed phase in a log file
that its one-line error names, with the notices of retried attempts that were kept off the terminal.

Ray's driver prints every failed attempt of a task that it will retry (``(raylet) Task ray_run_task
failed. There are 3 retries remaining, so the task will be retried. Error: User exception: ...``,
with its traceback) as it happens. A run whose tasks fail for a cause no retry cures (a full disk,
a broken stage) showed a screen of those, pyarrow's ``OSError: [Errno 28]`` and all, before
datapipe's own line saying what to do. The Ray executor holds those notices back
(``engine/executors/ray/notices.py``, through ``hold`` here); the runner writes them, with each
failed task's traceback, to ``<run>/_work/failures.log`` when a phase fails (``write_log``), and
its error names that file.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from datapipe.storage.atomic import write_text_atomic

LOG_NAME = "failures.log"  # in the run folder's _work/
HELD_MAX = 200  # notices kept (the last ones): a log of what was retried, bounded however long the run

_held: deque[tuple[float, str]] = deque(maxlen=HELD_MAX)
_lock = threading.Lock()


def held() -> list[tuple[float, str]]:
    """The retry notices held back so far (time, text), oldest first."""
    with _lock:
        return list(_held)


def hold(lines: list[str]) -> None:
    """Keep Ray's notices of retried attempts (``executors/ray/notices.py`` calls it) for the log."""
    with _lock:
        _held.extend((time.time(), line) for line in lines)


def clear_held() -> None:
    """Drop the notices held so far: they were an earlier run's (a run's executor opening)."""
    with _lock:
        _held.clear()


def write_log(work: Path, phase: str, failed: Sequence[tuple[str, BaseException]]) -> Path:
    """Append ``phase``'s failed tasks (key, the exception each ended with, its traceback) and the retry
    notices held since the last log to ``work/failures.log``; returns its path."""
    path = work / LOG_NAME
    with _lock:
        notices = list(_held)
        _held.clear()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    parts = [f"=== {stamp}: {len(failed)} {phase} task(s) failed after retries"]
    for key, exc in failed:
        parts.append(f"--- {phase} {key}\n" + "".join(traceback.format_exception(exc)).rstrip())
    if notices:
        parts.append(f"--- Ray's notices of the attempts it retried ({len(notices)})")
        parts += [f"[{time.strftime('%H:%M:%S', time.localtime(t))}] {text.rstrip()}" for t, text in notices]
    before = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    write_text_atomic(path, before + "\n\n".join(parts) + "\n\n")
    return path
