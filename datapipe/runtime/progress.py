"""Progress per phase: tasks done of all, documents so far and per second, elapsed time, ETA.

Drawn as a rich bar on a terminal. Elsewhere (a log file, CI, nohup, ``| tee``) a bar would be
noise, so plain lines instead: one every ``DATAPIPE_PROGRESS_INTERVAL`` seconds (default 15,
``runtime/heartbeat.py``) while the phase runs, so a long phase is never silent in a log, and one
when it ends.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from datapipe.runtime.heartbeat import Heartbeat, duration, eta


class PhaseProgress:
    def __init__(self, phase: str, total: int, done: int, unit: str, enabled: bool = True) -> None:
        self.phase, self.total, self.done, self.unit = phase, total, done, unit
        self.resumed = done
        self.docs = 0
        self.console = Console(stderr=True)
        self.live = enabled and self.console.is_terminal  # otherwise: plain lines (see the module doc)
        self._progress: Progress | None = None
        self._heartbeat: Heartbeat | None = None

    def __enter__(self) -> PhaseProgress:
        self._start = time.perf_counter()
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]{task.description:<8}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(self.unit),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.phase, total=self.total, completed=self.done, rate="")
        else:
            self._heartbeat = Heartbeat(self.line).__enter__()
        return self

    def advance(self, docs: int) -> None:
        self.done += 1
        self.docs += docs
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done, rate=self._rate())

    def _rate(self) -> str:
        elapsed = max(time.perf_counter() - self._start, 1e-6)
        return f"{self.docs / elapsed:,.0f} docs/s" if self.docs else ""

    def line(self, elapsed: float) -> str:
        """The periodic line: ``map0: 12/40 shards, 120,345 docs (2,345 docs/s), 51s elapsed, ETA 2m10s``."""
        parts = [f"{self.phase}: {self.done}/{self.total} {self.unit}"]
        if self.resumed:
            parts.append(f"{self.resumed} already done")
        if self.docs:
            parts.append(f"{self.docs:,} docs ({self._rate()})")
        parts.append(f"{duration(elapsed)} elapsed")
        left = eta(elapsed, self.done - self.resumed, self.total - self.resumed)
        if left is not None:
            parts.append(f"ETA {left}")
        return ", ".join(parts)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()
            return
        if self._heartbeat is not None:
            self._heartbeat.__exit__(exc_type, exc, tb)
        elapsed = time.perf_counter() - self._start
        resumed = f", {self.resumed} already done" if self.resumed else ""
        rate = f", {self._rate()}" if self.docs else ""
        print(
            f"{self.phase}: {self.done}/{self.total} {self.unit}{resumed} in {elapsed:.1f}s{rate}",
            file=sys.stderr,
            flush=True,
        )
