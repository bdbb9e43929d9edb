"""Testing hooks at exact points of a run, set by environment variables (no timing races).

The driver's hooks (``fault_point``) kill or pause the driver after n tasks of a phase; the
task's hook (``fault_hold``) holds a task between its outputs and its marker. The disk-full hook
(``DATAPIPE_FAULT_ENOSPC_AT``) lives where files are written (storage/atomic.py); ``fault_env``
hands it to Ray's workers.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any


def fault_point(phase: str, done: int) -> None:
    """A point after n tasks of a phase (``lock:1``: right after the lock is taken and run.json
    written; ``stats:1``: after statistics).

    DATAPIPE_FAULT_KILL_AT=<phase>:<n> SIGKILLs the driver there: a real SIGKILL, so nothing
    gets a chance to clean up. DATAPIPE_FAULT_PAUSE_AT=<phase>:<n> with DATAPIPE_FAULT_PAUSE_FILE=F
    creates F.paused and waits there until F exists: a driver holding its lock mid-run, for
    tests of a second driver and of Ctrl-C.
    """
    here = f"{phase}:{done}"
    if os.environ.get("DATAPIPE_FAULT_KILL_AT") == here:
        os.kill(os.getpid(), signal.SIGKILL)
    pause = os.environ.get("DATAPIPE_FAULT_PAUSE_FILE")
    if pause and os.environ.get("DATAPIPE_FAULT_PAUSE_AT") == here:
        Path(pause + ".paused").touch()
        while not Path(pause).exists():
            time.sleep(0.05)


def fault_hold(phase: str, key: str) -> None:
    """Inside a task, between its outputs and its marker (the window a lost node leaves behind:
    files written, no marker). DATAPIPE_FAULT_HOLD_AT=<phase> with DATAPIPE_FAULT_HOLD_FILE=F
    writes the task key to F.held.<key, / as %> and waits until F exists. Set it in one node's
    environment only: every task of that phase placed there is held in flight, so a test can
    remove the node with tasks on it at a known point instead of racing them.
    """
    hold = os.environ.get("DATAPIPE_FAULT_HOLD_FILE")
    if hold and os.environ.get("DATAPIPE_FAULT_HOLD_AT") == phase:
        tmp = Path(f"{hold}.tmp-{os.getpid()}")
        tmp.write_text(key)
        tmp.replace(f"{hold}.held.{key.replace('/', '%')}")  # whole, so a watcher never reads it half-written
        while not Path(hold).exists():
            time.sleep(0.05)


def fault_env() -> dict[str, Any]:
    """Ray task options handing the disk-full hook's setting to the workers when Ray was started
    before it was set (tests share one Ray): workers of an embedded Ray otherwise inherit the
    driver's environment."""
    env = {k: v for k, v in os.environ.items() if k == "DATAPIPE_FAULT_ENOSPC_AT"}
    return {"runtime_env": {"env_vars": env}} if env else {}
