"""The ``datapipe`` program ends without the interpreter's teardown (cli._Program): its exit
status, its output through a pipe and its exit handlers must be as with a normal exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, code: str = "") -> subprocess.CompletedProcess:
    prog = f"{code}\nfrom datapipe.cli import main\nmain()" if code else None
    cmd = [sys.executable, "-c", prog, *args] if prog else [sys.executable, "-m", "datapipe.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_status_and_piped_output_survive_the_fast_exit(tmp_path: Path) -> None:
    ok = _cli("--version")
    assert ok.returncode == 0 and "datapipe, version" in ok.stdout
    bad = _cli("run", str(tmp_path / "missing.yaml"))
    assert bad.returncode == 2 and "pipeline file not found" in bad.stderr
    usage = _cli("no-such-command")
    assert usage.returncode == 2 and "No such command" in usage.stderr


def test_exit_handlers_still_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    r = _cli("--version", code=f"import atexit, pathlib\natexit.register(pathlib.Path({str(marker)!r}).touch)")
    assert r.returncode == 0 and marker.exists()
