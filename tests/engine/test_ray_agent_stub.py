"""The stand-ins for the raylet's agents, run as the raylet runs them (datapipe/engine/executors/ray/agent_stub.py);
with a raylet: tests/engine/test_ray_runtime.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from datapipe.engine.executors.ray.runtime import AGENT_STUB

NODE = "ab" * 28  # a node id as Ray writes them: 28 bytes in hex


def _stub(*args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-I", "-S", AGENT_STUB, *args], stdin=stdin, stdout=subprocess.PIPE, text=True)


def test_dashboard_stand_in_writes_ray_port_files_and_lives_as_long_as_its_stdin(tmp_path: Path) -> None:
    raylet = pytest.importorskip("ray._raylet")
    names = [raylet.METRICS_AGENT_PORT_NAME, raylet.METRICS_EXPORT_PORT_NAME, raylet.DASHBOARD_AGENT_LISTEN_PORT_NAME]
    command = [sys.executable, "-c", "raise SystemExit(3)", f"--session-dir={tmp_path / 'ours'}", f"--node-id={NODE}"]
    (tmp_path / "ours").mkdir()
    proc = _stub("dashboard", *names, "--", *command, stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while len(list((tmp_path / "ours").iterdir())) < len(names) and time.monotonic() < deadline:
            time.sleep(0.05)
        # What Ray's own (minimal) dashboard agent writes: -1 (no service), in the files the raylet reads.
        (tmp_path / "rays").mkdir()
        for name in names:
            raylet.persist_port(str(tmp_path / "rays"), NODE, name, -1)
        ours = {p.name: p.read_text() for p in (tmp_path / "ours").iterdir()}
        assert ours == {p.name: p.read_text() for p in (tmp_path / "rays").iterdir()}
        time.sleep(0.3)
        assert proc.poll() is None  # it waits while the raylet's pipe is open
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # the raylet ended
    assert proc.wait(timeout=10) == 0


def test_a_command_it_does_not_recognise_runs_as_is(tmp_path: Path) -> None:
    """Without the options it needs (here no --session-dir), a stand-in runs Ray's agent command itself."""
    for mode in ("dashboard", "runtime-env"):
        proc = _stub(mode, "some_port", "--", sys.executable, "-c", "print('Ray agent ran')", f"--node-id={NODE}")
        out, _ = proc.communicate(timeout=30)
        assert out.strip() == "Ray agent ran" and proc.returncode == 0
