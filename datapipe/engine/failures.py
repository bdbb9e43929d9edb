"""Failed tasks told once, in datapipe's words: Ray's own retry notices kept off the terminal, and
the full tracebacks of a failed phase in a log file that its one-line error names.

Ray's driver prints every failed attempt of a task that it will retry (``(raylet) Task ray_run_task
failed. There are 3 retries remaining, so the task will be retried. Error: User exception: ...``,
with its traceback) as it happens, from its error-listening thread. A run whose tasks fail for a
cause no retry cures (a full disk, a broken stage) showed a screen of those, tracebacks of pyarrow's
``OSError: [Errno 28]`` and all, before datapipe's own line saying what to do.
``hold_retry_notices`` holds those notices of datapipe's tasks back (Ray's other messages, such as
a worker killed for memory, still print); the runner writes them, with each failed task's
traceback, to ``<run>/_work/failures.log`` when a phase fails (``write_log``), and its error names
that file.
"""

from __future__ import annotations

import re
import threading
import time
import traceback
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from datapipe.storage.atomic import write_text_atomic

LOG_NAME = "failures.log"  # in the run folder's _work/
# Ray's notice of an attempt it retries (ray/src/ray/core_worker/task_manager.cc): "Task <name> failed.
# There are N retries remaining, so the task will be retried. Error: ..."; OOM and preemption alike.
RETRY_NOTICE = re.compile(r"Task (\S+) failed\b.*\b(?:retries remaining|will be retried)\b", re.S)
HELD_MAX = 200  # notices kept (the last ones): a log of what was retried, bounded however long the run

_held: deque[tuple[float, str]] = deque(maxlen=HELD_MAX)
_tasks: set[str] = set()  # remote functions whose retry notices are held
_installed: list[Any] = []  # Ray's printer, once replaced
_lock = threading.Lock()


def held() -> list[tuple[float, str]]:
    """The retry notices held back so far (time, text), oldest first."""
    with _lock:
        return list(_held)


def hold_retry_notices(task: str) -> None:
    """From now on in this process, Ray's notices of attempts of the remote function named ``task``
    that it retries are held (``held``) instead of printed; the notices held so far are dropped
    (they are an earlier run's). Called when a run's Ray executor opens; never undone, since the
    notice of a task's last retried attempt can reach the driver after its failure was reported
    (ray.shutdown() ends the thread that prints them), and it holds nothing but notices about
    ``task``: other tasks of a Ray session shared with the caller's code print as before.

    Ray prints them from its error-listening thread through ``ray._private.worker.print_to_stdstream``,
    looked up by name at each message: that name is replaced once. A Ray without it (renamed,
    moved) prints them as before."""
    with _lock:
        _held.clear()
        _tasks.add(task)
        if _installed:
            return
        try:
            from ray._private import worker as ray_worker
        except ImportError:
            return
        printer = vars(ray_worker).get("print_to_stdstream")
        if printer is None:
            return

        def filtered(data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
            lines = [str(line) for line in data.get("lines") or ()]
            if data.get("pid") == "raylet" and lines and all(_ours(line) for line in lines):
                with _lock:
                    _held.extend((time.time(), line) for line in lines)
                return
            printer(data, *args, **kwargs)

        ray_worker.print_to_stdstream = filtered
        _installed.append(printer)


def _ours(line: str) -> bool:
    """Whether ``line`` is Ray's notice of a retried attempt of one of the held tasks."""
    match = RETRY_NOTICE.match(line)
    return match is not None and match.group(1) in _tasks


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
