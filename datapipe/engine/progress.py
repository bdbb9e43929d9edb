"""A progress bar per phase: tasks done of all, documents per second, elapsed time.

Drawn with rich on a terminal; in logs (CI, batch jobs) a single line per finished
phase instead, so output files stay readable.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class PhaseProgress:
    def __init__(self, phase: str, total: int, done: int, unit: str, enabled: bool = True) -> None:
        self.phase, self.total, self.done, self.unit = phase, total, done, unit
        self.resumed = done
        self.docs = 0
        self.console = Console(stderr=True)
        self.live = enabled and self.console.is_terminal  # otherwise: one line when the phase ends
        self._progress: Progress | None = None

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
        return self

    def advance(self, docs: int) -> None:
        self.done += 1
        self.docs += docs
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done, rate=self._rate())

    def _rate(self) -> str:
        elapsed = max(time.perf_counter() - self._start, 1e-6)
        return f"{self.docs / elapsed:,.0f} docs/s" if self.docs else ""

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()
        else:
            elapsed = time.perf_counter() - self._start
            resumed = f", {self.resumed} already done" if self.resumed else ""
            rate = f", {self._rate()}" if self.docs else ""
            print(
                f"{self.phase}: {self.done}/{self.total} {self.unit}{resumed} in {elapsed:.1f}s{rate}",
                file=sys.stderr,
                flush=True,
            )
