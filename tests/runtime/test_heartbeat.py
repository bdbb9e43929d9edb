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


def test_phase_line_says_tasks_documents_elapsed_and_eta() -> None:
    progress = PhaseProgress("map0", total=40, done=4, unit="shards", enabled=False)
    progress._start = time.perf_counter()
    assert progress.line(3.0) == "map0: 4/40 shards, 4 already done, 3s elapsed"  # no task of this attempt yet
    for _ in range(12):
        progress.advance(10_000)
    line = progress.line(60.0)
    assert line.startswith("map0: 16/40 shards, 4 already done, 120,000 docs (")
    assert line.endswith("docs/s), 1m00s elapsed, ETA 2m00s")  # 5 s per task this attempt, 24 left
