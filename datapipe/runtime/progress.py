"""Progress per phase: what it does, tasks done of all, documents so far and per second, elapsed time, ETA.

A phase is shown by what it does for a person, the stage and its step (``minhash: verifying pairs
(round 3 of 56)``, ``semantic: training vectors and clustering the sample``), not by the name of its
marker folder (``shuffle4r2``). Drawn as a rich bar on a terminal. Elsewhere (a log file, CI, nohup,
``| tee``) a bar would be noise, so plain lines instead: one every ``DATAPIPE_PROGRESS_INTERVAL``
seconds (default 15, ``runtime/heartbeat.py``) while the phase runs, so a long phase is never silent
in a log, and one when it ends, saying how it ended: done, with failed tasks, or interrupted.

The ETA is honest or absent. It is estimated when a task finishes (the tasks left at the pace of
those done so far) and counts down from there; it is not stretched while nothing finishes, so on the
last task it does not grow for ever. Once the estimate has run out with tasks still running, no ETA
is shown ("overdue"): the tasks left are slower than the ones done, and nothing says by how much.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from datapipe.runtime.heartbeat import Heartbeat, duration


class PhaseProgress:
    def __init__(self, phase: str, total: int, done: int, unit: str, enabled: bool = True, label: str = "") -> None:
        self.phase, self.total, self.done, self.unit = phase, total, done, unit
        self.label = label or phase  # what the phase does, as a person reads it
        self.resumed = done
        self.docs = 0
        self.failed = 0
        self.console = Console(stderr=True)
        self.live = enabled and self.console.is_terminal  # otherwise: plain lines (see the module doc)
        self._progress: Progress | None = None
        self._heartbeat: Heartbeat | None = None
        self._estimate: tuple[float, float] | None = None  # (when estimated, seconds left then)

    def __enter__(self) -> PhaseProgress:
        self._start = time.perf_counter()
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(self.unit),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                TextColumn("{task.fields[eta]}"),
                console=self.console,
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=self.total, completed=self.done, rate="", eta="")
        else:
            self._heartbeat = Heartbeat(self.line).__enter__()
        return self

    def advance(self, docs: int, failed: bool = False) -> None:
        self.done += 1
        self.docs += docs
        self.failed += failed
        now = time.perf_counter()
        ran = self.done - self.resumed
        left = self.total - self.done
        # Re-estimated only here, when a task ends: the pace of the tasks done so far, times those left.
        self._estimate = (now, (now - self._start) / ran * left) if ran > 0 and left > 0 else None
        if self._progress is not None:
            left_text = self.eta(now)
            self._progress.update(self._task, completed=self.done, rate=self._rate(), eta=f"ETA {left_text}" if left_text else "")

    def eta(self, now: float | None = None) -> str | None:
        """Time left: the last estimate, counted down since; None before the first task ends, when the
        phase is done, or when the estimate has run out with tasks still running (see the module doc)."""
        if self._estimate is None:
            return None
        at, left = self._estimate
        remaining = left - ((time.perf_counter() if now is None else now) - at)
        return duration(remaining) if remaining >= 1 else None

    def _rate(self) -> str:
        elapsed = max(time.perf_counter() - self._start, 1e-6)
        return f"{self.docs / elapsed:,.0f} docs/s" if self.docs else ""

    def line(self, elapsed: float) -> str:
        """The periodic line: ``minhash: verifying pairs (round 3 of 56): 12/40 partitions, 51s elapsed, ETA 2m10s``."""
        parts = [f"{self.label}: {self.done}/{self.total} {self.unit}"]
        if self.resumed:
            parts.append(f"{self.resumed} already done")
        if self.failed:
            parts.append(f"{self.failed} failed")
        if self.docs:
            parts.append(f"{self.docs:,} docs ({self._rate()})")
        parts.append(f"{duration(elapsed)} elapsed")
        left = self.eta()
        if left is not None:
            parts.append(f"ETA {left}")
        elif self._estimate is not None and self.done < self.total:
            parts.append(f"ETA overdue: the last {self.total - self.done} run longer than the others took")
        return ", ".join(parts)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        elapsed = time.perf_counter() - self._start
        if exc_type is not None:
            how = "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "stopped by an error"
            ending = f"{self.label}: {how} at {self.done}/{self.total} {self.unit} after {elapsed:.1f}s"
        else:
            resumed = f", {self.resumed} already done" if self.resumed else ""
            failed = f", {self.failed} failed" if self.failed else ""
            rate = f", {self._rate()}" if self.docs else ""
            ending = f"{self.label}: {self.done}/{self.total} {self.unit}{resumed}{failed} in {elapsed:.1f}s{rate}"
        if self._progress is not None:
            self._progress.stop()
            if exc_type is None and not self.failed:
                return  # the bar, full, says it
        if self._heartbeat is not None:
            self._heartbeat.__exit__(exc_type, exc, tb)
        print(ending, file=sys.stderr, flush=True)
