"""One driver per run folder: the lock itself, without Ray (fast). End-to-end drivers: tests/e2e/test_resume.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from datapipe.run_folder.layout import LOCK_RECORD, RunFolder
from datapipe.run_folder.lock import RunLock, RunLockedError, holder_alive, process_start

# A driver stand-in: takes the lock, starts a long-lived child as Ray's raylet would, says so, waits.
HOLDER = """
import subprocess, sys, time
from pathlib import Path
from datapipe.run_folder.lock import RunLock
lock = RunLock(Path(sys.argv[1]), log=lambda m: None)
lock.acquire()
child = subprocess.Popen(["sleep", "60"])
print(child.pid, flush=True)
time.sleep(120)
"""


def start_holder(root: Path) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    grandchild = int(proc.stdout.readline())  # the lock is held once this line arrives
    return proc, grandchild


def test_second_driver_is_refused_naming_the_holder_and_a_killed_holder_releases(tmp_path: Path) -> None:
    root = tmp_path / "run"
    proc, grandchild = start_holder(root)
    try:
        with pytest.raises(RunLockedError) as info:
            RunLock(root, log=lambda m: None).acquire()
        message = str(info.value)
        assert f"pid {proc.pid} on host {socket.gethostname()}" in message
        assert "started 20" in message and "command:" in message and str(root) in message
        record = json.loads((root / LOCK_RECORD).read_text())
        assert record["pid"] == proc.pid and record["pid_start"] == process_start(proc.pid)

        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        # Its child still runs (as Ray's processes may for a moment) but did not inherit the lock.
        assert process_start(grandchild) is not None
        notes: list[str] = []
        with RunLock(root, log=notes.append):
            assert json.loads((root / LOCK_RECORD).read_text())["pid"] == os.getpid()
        assert len(notes) == 1 and f"pid {proc.pid}" in notes[0] and "exited" in notes[0]
        assert not (root / LOCK_RECORD).exists()  # released cleanly: the record goes, the lock file stays
        assert (root / ".datapipe.lock").exists()
    finally:
        proc.kill()
        proc.wait()
        os.kill(grandchild, signal.SIGKILL)


def test_lock_files_do_not_make_an_empty_folder_look_foreign(tmp_path: Path) -> None:
    """A driver killed before writing run.json leaves only the lock files: the next run may use the folder."""
    root = tmp_path / "run"
    with RunLock(root, log=lambda m: None):
        pass
    RunFolder(root).check_usable()


def record(host: str, pid: int, pid_start: str | None) -> dict:
    return {
        "host": host,
        "pid": pid,
        "pid_start": pid_start,
        "started": "2026-01-01T00:00:00+00:00",
        "command": "datapipe run p.yaml",
        "token": "x",
        "heartbeat": time.time(),
    }


def test_same_host_without_os_locks_decides_by_pid_and_start_time() -> None:
    me = socket.gethostname()
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert holder_alive(record(me, os.getpid(), process_start(os.getpid())), False, Path("."))[0]
    alive, why = holder_alive(record(me, dead.pid, "1"), False, Path("."))
    assert not alive and "no longer exists" in why
    alive, why = holder_alive(record(me, os.getpid(), "1"), False, Path("."))  # the pid was reused
    assert not alive and "another process" in why
    assert not holder_alive(record(me, os.getpid(), process_start(os.getpid())), True, Path("."))[0]


def test_other_host_is_taken_over_only_after_its_heartbeat_stops(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "run"
    root.mkdir()
    rec = root / LOCK_RECORD
    rec.write_text(json.dumps(record("other-node-7", 4242, "99")))
    with pytest.raises(RunLockedError, match=r"pid 4242 on host other-node-7.*last heartbeat was \d+ s ago"):
        RunLock(root, log=lambda m: None).acquire()
    monkeypatch.setenv("DATAPIPE_LOCK_STALE_S", "30")
    old = time.time() - 31
    os.utime(rec, (old, old))
    notes: list[str] = []
    with RunLock(root, log=notes.append):
        assert json.loads(rec.read_text())["host"] == socket.gethostname()
    assert "other-node-7" in notes[0] and "no heartbeat for 31 s" in notes[0]
