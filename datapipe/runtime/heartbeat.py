"""Progress lines at a steady interval, for output that is read as a log (a file, CI, nohup, ``| tee``).

A phase that only speaks when it ends leaves a log silent for as long as it runs (hours at scale),
and a silent job cannot be told from a hung one. ``Heartbeat`` prints a line that its owner
describes (tasks done of all, documents so far, elapsed, ETA) every ``DATAPIPE_PROGRESS_INTERVAL``
seconds (default 15; 0 turns the lines off) from a daemon thread, to stderr, so standard output
stays the command's result. The line is built in the thread from plain counters the owner updates;
reading an int that another thread is incrementing is safe under the GIL.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

from datapipe.errors import UsageError

INTERVAL_ENV = "DATAPIPE_PROGRESS_INTERVAL"
DEFAULT_INTERVAL_S = 15.0


def progress_interval() -> float:
    """Seconds between progress lines: $DATAPIPE_PROGRESS_INTERVAL, else 15; 0 (or less): none."""
    raw = os.environ.get(INTERVAL_ENV, "").strip()
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        return max(float(raw), 0.0)
    except ValueError:
        raise UsageError(f"{INTERVAL_ENV}={raw!r} is not a number of seconds (e.g. 15, 0.5; 0 for no progress lines)") from None


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``: short enough for a log line, exact enough to plan by."""
    s = int(seconds + 0.5)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def eta(elapsed: float, done: int, total: int) -> str | None:
    """Time left at the pace so far (``done`` of ``total`` units in ``elapsed``); None before the first."""
    if done <= 0 or total <= done:
        return None
    return duration(elapsed / done * (total - done))


def size(n: float) -> str:
    """Bytes or characters in a short human form: ``812``, ``45.3M``, ``1.20G``."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{int(n)}"


class Heartbeat:
    """A context: ``describe(elapsed_seconds)`` printed as one line every ``interval`` seconds while it is open.

    ``interval``: None reads $DATAPIPE_PROGRESS_INTERVAL; 0 prints nothing. The first line comes one
    interval after entering, so a step shorter than that stays silent."""

    def __init__(self, describe: Callable[[float], str], interval: float | None = None, file: TextIO | None = None) -> None:
        self.describe = describe
        self.interval = progress_interval() if interval is None else interval
        self.file = file
        self.lines = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        self.started = time.perf_counter()
        if self.interval > 0:
            self._thread = threading.Thread(target=self._beat, name="datapipe-progress", daemon=True)
            self._thread.start()
        return self

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            line = self.describe(self.elapsed())
            out = self.file or sys.stderr  # looked up per line: tests swap sys.stderr
            try:
                out.write(line + "\n")
                out.flush()
            except (OSError, ValueError):  # a closed pipe or stream: progress is not worth failing for
                return
            self.lines += 1

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
