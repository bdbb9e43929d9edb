"""What one task used in its worker process: CPU seconds and peak resident memory.

Ray reuses a worker process for many tasks, so the process's lifetime peak (``VmHWM``) mixes
the task at hand with every task before it. On Linux, writing ``5`` to ``/proc/self/clear_refs``
resets ``VmHWM`` to the current RSS, so the peak read when the task ends is the highest RSS
the process reached *while this task ran* (what it already held included: imports, cached
stages, heap the allocator kept). Where the reset is refused (not Linux, a locked-down
/proc) the figure is the process's lifetime peak, and ``peak_scope`` says so. Ray runs one
task at a time in a worker process, so no other task shares the figure.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _reset_peak() -> bool:
    try:
        _CLEAR_REFS.write_text("5")  # 5: reset the peak RSS (VmHWM) to the current RSS
        return True
    except OSError:
        return False


def rss_mib() -> float | None:
    """This process's resident memory now, in MiB (None where /proc has no figure)."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib / 1024


class TaskUsage:
    """Started before a task's work, ``finish()`` after it: the marker fields it adds."""

    def __init__(self) -> None:
        self.scope = "task" if _reset_peak() else "process"
        self.rss_start = _status_kib("VmRSS")
        self.cpu_started = time.process_time()

    def finish(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cpu_seconds": round(time.process_time() - self.cpu_started, 3)}
        peak = _status_kib("VmHWM")
        if peak is not None and self.rss_start is not None:
            # The kernel folds threads' RSS counters into VmRSS/VmHWM lazily, so either can trail the
            # other by a few pages; the task's peak is at least what it started with and what it ends with.
            peak = max(peak, self.rss_start, _status_kib("VmRSS") or 0)
            out.update(peak_rss_mib=round(peak / 1024, 1), rss_start_mib=round(self.rss_start / 1024, 1), peak_scope=self.scope)
        return out
