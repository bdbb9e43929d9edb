"""Progress lines at an interval (runtime/heartbeat.py) and the run's phase lines off a terminal
(runtime/progress.py): what a line says, that lines keep coming while a step runs, and the
DATAPIPE_PROGRESS_INTERVAL setting."""

from __future__ import annotations

import io
import time

import pytest
from click.testing import CliRunner

from datapipe.cli import main
from datapipe.errors import UsageError
from datapipe.runtime.heartbeat import INTERVAL_ENV, Heartbeat, duration, eta, progress_interval, size
from datapipe.runtime.progress import PhaseProgress


def test_durations_eta_and_sizes_read_as_a_person_would_write_them() -> None:
    assert [duration(s) for s in (0.2, 42, 185, 7620)] == ["0s", "42s", "3m05s", "2h07m"]
    assert eta(10.0, 0, 8) is None and eta(10.0, 8, 8) is None
    assert eta(30.0, 2, 10) == "2m00s"  # 15 s per task, 8 tasks left
    assert [size(n) for n in (812, 45_300_000, 1_204_000_000)] == ["812", "45.3M", "1.2G"]


def test_lines_keep_coming_while_the_step_runs_and_stop_with_it() -> None:
    out = io.StringIO()
    with Heartbeat(lambda elapsed: f"step: {elapsed:.2f}s elapsed", interval=0.02, file=out) as beat:
        deadline = time.time() + 60  # waits for lines, never on how fast they come
        while beat.lines < 3:
            assert time.time() < deadline
            time.sleep(0.01)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3 and all(line.startswith("step: ") for line in lines)
    time.sleep(0.1)
    assert out.getvalue().splitlines() == lines  # nothing after the step ended


def test_interval_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INTERVAL_ENV, raising=False)
    assert progress_interval() == 15.0
    monkeypatch.setenv(INTERVAL_ENV, "0.5")
    assert progress_interval() == 0.5
    monkeypatch.setenv(INTERVAL_ENV, "0")
    out = io.StringIO()
    with Heartbeat(lambda _: "never", file=out):
        time.sleep(0.05)
    assert out.getvalue() == ""  # 0: no lines, no thread
    monkeypatch.setenv(INTERVAL_ENV, "soon")
    with pytest.raises(UsageError, match=INTERVAL_ENV):
        progress_interval()
    res = CliRunner().invoke(main, ["stats", "/nonexistent"], env={INTERVAL_ENV: "soon"})
    assert res.exit_code == 2 and INTERVAL_ENV in res.output  # refused before the command does anything


class _Clock:
    """perf_counter as the test sets it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_phase_line_says_what_the_phase_does_tasks_documents_elapsed_and_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    import datapipe.runtime.progress as progress_module

    clock = _Clock()
    monkeypatch.setattr(progress_module.time, "perf_counter", clock)
    progress = PhaseProgress("shuffle4r2", total=40, done=4, unit="partitions", enabled=False, label="minhash: round 3 of 25")
    progress._start = clock()
    assert progress.line(3.0) == "minhash: round 3 of 25: 4/40 partitions, 4 already done, 3s elapsed"  # nothing ran yet
    for _ in range(12):  # 12 tasks of this attempt in 60 s: 5 s each, 24 left
        clock.now += 5
        progress.advance(10_000)
    line = progress.line(60.0)
    assert line.startswith("minhash: round 3 of 25: 16/40 partitions, 4 already done, 120,000 docs (")
    assert line.endswith("docs/s), 1m00s elapsed, ETA 2m00s")


def test_eta_counts_down_between_tasks_and_is_dropped_when_it_runs_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 50 item 2: an ETA that grew for ever on the last task. It is estimated when a task ends and
    counts down; when it has run out with tasks still running it is not stretched, it is dropped."""
    import datapipe.runtime.progress as progress_module

    clock = _Clock()
    monkeypatch.setattr(progress_module.time, "perf_counter", clock)
    progress = PhaseProgress("shuffle4", total=4, done=0, unit="partitions", enabled=False, label="semantic: training vectors")
    progress._start = clock()
    for _ in range(3):
        clock.now += 10
        progress.advance(0)
    assert progress.eta() == "10s"  # 10 s per partition, one left
    clock.now += 4
    assert progress.eta() == "6s"  # counted down, not re-estimated as 34 s / 3 x 1
    clock.now += 30  # the last partition runs far longer than the others did
    assert progress.eta() is None
    line = progress.line(clock.now - progress._start)
    assert "ETA overdue" in line and "ETA 1" not in line
    clock.now += 600
    assert progress.eta() is None  # never an ETA that grows with the wait
    progress.advance(0)
    assert progress.eta() is None and "ETA" not in progress.line(700.0)  # done: nothing left to estimate


def test_an_interrupted_or_failed_phase_is_not_printed_as_finished(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(KeyboardInterrupt):
        with PhaseProgress("map0", total=8, done=0, unit="shards", enabled=False, label="map: langid, length") as progress:
            progress.advance(100)
            raise KeyboardInterrupt
    err = capsys.readouterr().err
    assert "map: langid, length: interrupted at 1/8 shards after" in err and " in 0." not in err
    with PhaseProgress("map0", total=3, done=0, unit="shards", enabled=False, label="map: langid") as progress:
        progress.advance(100)
        progress.advance(0, failed=True)
        progress.advance(100)
    assert "map: langid: 3/3 shards, 1 failed in " in capsys.readouterr().err
