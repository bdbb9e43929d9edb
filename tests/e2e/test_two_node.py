"""A two-node Ray cluster on loopback, started inside the test: `--ray-address` joins it and both nodes work."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.shared_data import PROJECT_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_run_on_a_two_node_cluster_uses_both_nodes(tmp_path: Path) -> None:
    # Ray's socket paths must stay under 107 bytes: pytest's tmp_path is too deep for them.
    ray_dir = tempfile.mkdtemp(prefix="dp2n-", dir="/tmp")
    os.makedirs(os.path.join(ray_dir, "ray"))
    # RAY_TMPDIR keeps Ray's cluster address file out of the machine-wide /tmp/ray.
    env = {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TMPDIR": ray_dir,
    }
    # The cluster lives in a child process so this test process keeps no Ray state of its own.
    script = f"""
import json, os, sys, time, subprocess
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, connect=False,
                  head_node_args={{"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False,
                                   "temp_dir": {ray_dir!r}}})
cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
cluster.wait_for_nodes()
proc = subprocess.run([sys.executable, "-m", "datapipe.cli", "run", {str(PROJECT_ROOT / "pipelines" / "demo.yaml")!r},
                       "--output", {str(tmp_path / "out")!r}, "--ray-address", cluster.address, "--no-progress"],
                      capture_output=True, text=True)
print(json.dumps({{"rc": proc.returncode, "stderr": proc.stderr[-3000:], "address": cluster.address,
                  "nodes": [n.node_id for n in cluster.list_all_nodes()]}}))
cluster.shutdown()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=400)
    shutil.rmtree(ray_dir, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["rc"] == 0, report["stderr"]
    assert report["address"].startswith("127.0.0.1:")
    markers = [json.loads(p.read_text()) for p in (tmp_path / "out" / "_work" / "markers").glob("map*/**/*.json")]
    nodes_used = {m["node"] for m in markers}
    assert nodes_used == set(report["nodes"]) and len(nodes_used) == 2
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["status"] == "complete" and run["counts"]["documents"] == run["counts"]["kept"] + run["counts"]["rejected"]
