"""Resume after SIGKILL of the driver: the rerun does only what is left and the outputs are identical."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow


def datapipe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "datapipe.cli", *args, "--no-progress"], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=300)


def fingerprint(root: Path) -> dict[str, object]:
    """Everything a user gets, in a comparable form: shard bytes, kept and rejected rows, the documents table."""
    shards = {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
              for p in sorted((root / "shards").glob("**/*.arrow"))}
    docs = pq.read_table(root / "docs").sort_by("id").to_pylist()
    rejected = sorted((r["id"], r["stage"], r["reason"]) for p in (root / "rejected").glob("**/*.parquet")
                      for r in pq.read_table(p, columns=["id", "stage", "reason"]).to_pylist())
    with duckdb.connect(str(root / "stats.duckdb"), read_only=True) as con:
        table = con.execute("select id, status, stage, reason, n_tokens from documents order by id").fetchall()
    manifest = pq.read_table(root / "shards" / "manifest.parquet").to_pylist()
    return {"shards": shards, "docs": docs, "rejected": rejected, "documents": table, "manifest": manifest}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> tuple[Path, dict[str, object]]:
    from tests.shared_data import PROJECT_ROOT

    root = tmp_path_factory.mktemp("baseline")
    proc = datapipe("run", str(PROJECT_ROOT / "pipelines" / "demo.yaml"), "--output", str(root / "out"))
    assert proc.returncode == 0, proc.stderr
    return root / "out", fingerprint(root / "out")


@pytest.mark.parametrize("kill_at", ["map0:1", "reduce0:1", "map1:3", "pack:1", "stats:1"])
def test_sigkill_then_rerun_gives_identical_outputs(baseline, tmp_path: Path, kill_at: str) -> None:
    from tests.shared_data import PROJECT_ROOT

    out = tmp_path / "out"
    args = ("run", str(PROJECT_ROOT / "pipelines" / "demo.yaml"), "--output", str(out))
    killed = datapipe(*args, env={"DATAPIPE_FAULT_KILL_AT": kill_at})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert '"status": "running"' in (out / "run.json").read_text()
    resumed = datapipe(*args)
    assert resumed.returncode == 0, resumed.stderr
    assert "already done" in resumed.stderr  # the finished work was not redone
    assert fingerprint(out) == baseline[1]


def test_external_sigkill_at_an_arbitrary_moment(baseline, tmp_path: Path) -> None:
    """No hook: kill the driver from outside as soon as the first task has finished."""
    from tests.shared_data import PROJECT_ROOT

    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "datapipe.cli", "run", str(PROJECT_ROOT / "pipelines" / "demo.yaml"),
           "--output", str(out), "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if any((out / "_work" / "markers").glob("**/*.json")):
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait(timeout=60)
    resumed = datapipe("run", str(PROJECT_ROOT / "pipelines" / "demo.yaml"), "--output", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert fingerprint(out) == baseline[1]
