"""Losing a worker node mid-run: a two-node loopback Ray cluster, the worker removed while map
tasks are in flight on it; the run finishes with the outputs of a run on one healthy node."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from datapipe.audit.sql import connect as connect_stats
from tests.support.shared_data import PROJECT_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def _pipeline(folder: Path) -> Path:
    """The demo data and tokenizer through a global stage (dedup) and packing, cut into ~14 map
    tasks (16 KB JSONL ranges) so both nodes get several."""
    demo = PROJECT_ROOT / "pipelines"
    config = {
        "name": "nodeloss",
        "sources": [
            {"name": "web_zh", "kind": "web", "format": "jsonl", "paths": [str(demo / "demo/data/web_zh-*.jsonl")]},
            {"name": "web_en", "kind": "web", "paths": [str(demo / "demo/data/web_en-*.jsonl")]},
        ],
        "stages": [
            {"langid": {"keep": ["zh", "en"], "min_score": 0.5}},
            {"length": {"min_chars": 20}},
            {"dedup": {"exact": True}},
        ],
        "tokenize": {
            "tokenizer": str(PROJECT_ROOT / "tokenizer" / "demo.json"),
            "seq_len": 512,
            "val_fraction": 0.05,
            "rows_per_shard": 64,
        },
        "split": {"target_bytes": 16384, "min_bytes": 4096, "group_small_files": False},
    }
    path = folder / "nodeloss.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True, sort_keys=False))
    return path


def _outputs(root: Path) -> dict[str, object]:
    """What a user gets: the bytes of every shard file and the documents table, by id."""
    shards = {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((root / "shards").glob("**/*.arrow"))
    }
    with connect_stats(root) as con:
        documents = con.execute("select * from documents order by id").fetchall()
    return {"shards": shards, "documents": documents}


def test_removing_a_worker_node_mid_run_finishes_with_identical_outputs(tmp_path: Path) -> None:
    pipeline = _pipeline(tmp_path)
    # Reference: the same pipeline on one healthy node (in this machine's process, no cluster).
    ref = subprocess.run(
        [
            sys.executable,
            "-m",
            "datapipe.cli",
            "run",
            str(pipeline),
            "--output",
            str(tmp_path / "ref"),
            "--in-process",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ref.returncode == 0, ref.stderr

    # Ray's socket paths must stay under 107 bytes: pytest's tmp_path is too deep for them.
    ray_dir = tempfile.mkdtemp(prefix="dpnl-", dir="/tmp")
    os.makedirs(os.path.join(ray_dir, "ray"))
    env = {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TMPDIR": ray_dir,
    }
    out, hold = tmp_path / "out", tmp_path / "hold"
    # Only the worker node's raylet (and so its task workers) gets the hold hook: each map0 task
    # placed there writes its outputs, then waits before its marker (runtime/faults.py fault_hold)
    # until the node is gone. No timing: the node is removed once a task is known to be held there.
    # A short health check declares the node dead about a second after it is killed (Ray's default
    # waits for several failed 3 s checks), so the test stays short.
    script = f"""
import glob, json, subprocess, sys, time
from pathlib import Path
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, connect=False,
                  head_node_args={{"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False,
                                   "temp_dir": {ray_dir!r},
                                   "_system_config": {{"health_check_period_ms": 300,
                                                       "health_check_failure_threshold": 3}}}})
worker = cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1",
                          env_vars={{"DATAPIPE_FAULT_HOLD_AT": "map0", "DATAPIPE_FAULT_HOLD_FILE": {str(hold)!r}}})
try:
  cluster.wait_for_nodes()
  driver = subprocess.Popen([sys.executable, "-m", "datapipe.cli", "run", {str(pipeline)!r}, "--output", {str(out)!r},
                             "--ray-address", cluster.address, "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 240
  while not glob.glob({str(hold)!r} + ".held.*") and driver.poll() is None and time.time() < deadline:
      time.sleep(0.05)
  held = sorted(Path(p).read_text() for p in glob.glob({str(hold)!r} + ".held.*"))
  # The held tasks' markers must not exist yet: their outputs are on disk, their completion is not.
  work = Path({str(out)!r}) / "_work"
  marked = [k for k in held if (work / "markers" / "map0" / (k + ".json")).exists()]
  written = {{k: (work / "map0" / (k + ".parquet")).stat().st_ino for k in held if (work / "map0" / (k + ".parquet")).exists()}}
  driver_alive = driver.poll() is None
  cluster.remove_node(worker, allow_graceful=False)  # SIGKILL: the node crashes, nothing cleans up
  _, err = driver.communicate(timeout=300)
  print(json.dumps({{"rc": driver.returncode, "stderr": err[-3000:], "held": held, "marked": marked, "written": written,
                    "driver_alive": driver_alive, "head": cluster.head_node.node_id, "worker": worker.node_id}}))
finally:
  if "driver" in globals() and driver.poll() is None:
    driver.kill()
  cluster.shutdown()
"""
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=500)
    finally:
        hold.touch()  # lets any task process that outlived its node end (none should)
        shutil.rmtree(ray_dir, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["held"], "no map0 task was placed on the worker node"
    # Removed mid-phase, each held task's outputs on the shared disk but not its marker.
    assert report["driver_alive"] and not report["marked"] and set(report["written"]) == set(report["held"])
    # The run finishes in one go: Ray resubmits a task whose node died (max_retries=3) to the head
    # node, which rewrites the held task's outputs (atomic writes, same bytes) and then its marker.
    assert report["rc"] == 0, report["stderr"]
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "complete" and run["attempts"] == 1
    markers = {
        p.relative_to(out / "_work" / "markers").as_posix(): json.loads(p.read_text())
        for p in (out / "_work" / "markers").glob("**/*.json")
    }
    for key in report["held"]:  # redone on the head, not trusted from the orphaned files: rewritten
        assert markers[f"map0/{key}.json"]["node"] == report["head"]
        assert (out / "_work" / "map0" / f"{key}.parquet").stat().st_ino != report["written"][key]
    after = [m["node"] for phase, m in markers.items() if not phase.startswith(("lines/", "map0/"))]
    assert after and set(after) == {report["head"]}  # every later phase ran on the surviving node
    assert _outputs(out) == _outputs(tmp_path / "ref")
