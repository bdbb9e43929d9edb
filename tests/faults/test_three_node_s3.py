"""Three loopback Ray nodes, one store: inputs and run folder on a loopback S3 server (moto), each
node with its own local mirror (its own DATAPIPE_CACHE_DIR, as separate machines would have), and a
worker node killed in the middle of a shuffle (an exact-dedup partition task held on it between its
outputs and its marker). The run finishes with the outputs of a single-node local run."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_resume import fingerprint
from tests.support.shared_data import PROJECT_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.ray]
moto_server = pytest.importorskip("moto.server", reason="needs moto[server] (the test extras)")
boto3 = pytest.importorskip("boto3")

BUCKET = "datapipe-three"
DATA = PROJECT_ROOT / "pipelines" / "demo" / "data"


def _pipeline(folder: Path, data: str, partitions: int) -> Path:
    """The demo data through exact dedup and MinHash (4 parts each, rounds in tasks of 40 rows, merge
    levels of fan-in 2) and packing, in 32 KB map tasks (7) so every node gets some."""
    config = {
        "name": "three",
        "sources": [
            {"name": "web_zh", "kind": "web", "format": "jsonl", "paths": [f"{data}/web_zh-*.jsonl"]},
            {"name": "web_en", "kind": "web", "paths": [f"{data}/web_en-*.jsonl"]},
        ],
        "stages": [
            {"length": {"min_chars": 20}},
            {"dedup": {"exact": True, "partitions": partitions}},
            {"minhash": {"threshold": 0.7, "fold_script": True, "partitions": partitions}},
        ],
        "tokenize": {"tokenizer": str(PROJECT_ROOT / "tokenizer" / "demo.json"), "seq_len": 512, "rows_per_shard": 64},
        "split": {
            "target_bytes": 32768,
            "min_bytes": 4096,
            "group_small_files": False,
            "shuffle_fan_in": 2,
            "partition_rows": 40,
        },
    }
    path = folder / "three.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True, sort_keys=False))
    return path


def test_three_nodes_on_one_store_with_a_node_killed_mid_shuffle_equal_one_node(tmp_path: Path) -> None:
    ref = subprocess.run(
        [sys.executable, "-m", "datapipe.cli", "run", str(_pipeline(tmp_path, str(DATA), 4)), "--output", str(tmp_path / "ref")]
        + ["--in-process", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ref.returncode == 0, ref.stderr

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    aws = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    hold = tmp_path / "hold"
    ray_dir = tempfile.mkdtemp(prefix="dp3n-", dir="/tmp")  # Ray's socket paths must stay short
    os.makedirs(os.path.join(ray_dir, "ray"))
    try:
        client = boto3.client(
            "s3",
            endpoint_url=aws["AWS_ENDPOINT_URL"],
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
        )
        client.create_bucket(Bucket=BUCKET)
        for f in sorted(DATA.glob("*.jsonl")):
            client.upload_file(str(f), BUCKET, f"data/{f.name}")
        (tmp_path / "s3").mkdir()
        pipeline = _pipeline(tmp_path / "s3", f"s3://{BUCKET}/data", 4)
        env = {
            **os.environ,
            **aws,
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_TMPDIR": ray_dir,
            "DATAPIPE_CACHE_DIR": str(tmp_path / "cache-driver"),  # the driver's own mirror, fresh
        }
        caches = [str(tmp_path / f"cache-{i}") for i in range(3)]
        # The first worker node holds its exact-dedup partition tasks (shuffle0) between outputs and
        # marker (runtime/faults.py); it is killed once one is held there. Each node works in its own
        # mirror. shuffle0's tasks are spread over the nodes; MinHash's (shuffle1) follow the nodes that
        # wrote their map outputs (PartitionStep.owner_reads), which may leave the doomed node none.
        script = f"""
import glob, json, subprocess, sys, time
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, connect=False,
                  head_node_args={{"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False,
                                   "temp_dir": {ray_dir!r}, "env_vars": {{"DATAPIPE_CACHE_DIR": {caches[0]!r}}},
                                   "_system_config": {{"health_check_period_ms": 300,
                                                       "health_check_failure_threshold": 3}}}})
doomed = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1",
                          env_vars={{"DATAPIPE_FAULT_HOLD_AT": "shuffle0", "DATAPIPE_FAULT_HOLD_FILE": {str(hold)!r},
                                     "DATAPIPE_CACHE_DIR": {caches[1]!r}}})
other = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", env_vars={{"DATAPIPE_CACHE_DIR": {caches[2]!r}}})
try:
  cluster.wait_for_nodes()
  driver = subprocess.Popen([sys.executable, "-m", "datapipe.cli", "run", {str(pipeline)!r},
                             "--output", "s3://{BUCKET}/runs/three", "--ray-address", cluster.address, "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 300
  while not glob.glob({str(hold)!r} + ".held.*") and driver.poll() is None and time.time() < deadline:
      time.sleep(0.05)
  held = sorted(open(p).read() for p in glob.glob({str(hold)!r} + ".held.*"))
  cluster.remove_node(doomed, allow_graceful=False)  # SIGKILL: the node crashes mid-shuffle
  _, err = driver.communicate(timeout=400)
  print(json.dumps({{"rc": driver.returncode, "stderr": err[-3000:], "held": held, "doomed": doomed.node_id,
                    "nodes": [cluster.head_node.node_id, other.node_id]}}))
finally:
  if "driver" in globals() and driver.poll() is None:
    driver.kill()
  cluster.shutdown()
"""
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=800)
        hold.touch()
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["held"], "no shuffle0 task was placed on the doomed node"
        assert report["rc"] == 0, report["stderr"]
        got = tmp_path / "got"
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="runs/three/"):
            for obj in page.get("Contents", []):
                if obj["Key"].endswith("/"):
                    continue
                target = got / obj["Key"][len("runs/three/") :]
                target.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(BUCKET, obj["Key"], str(target))
        markers = {
            p.relative_to(got / "_work" / "markers").as_posix(): json.loads(p.read_text())
            for p in (got / "_work" / "markers").glob("**/*.json")
        }
        for key in report["held"]:  # the held tasks were redone on a surviving node
            assert markers[f"shuffle0/{key}.json"]["node"] in report["nodes"]
        assert set(report["nodes"]) <= {m["node"] for m in markers.values()}  # both surviving nodes worked
        assert any(phase.startswith("merge1") for phase in markers)  # the shuffles were merged
        assert fingerprint(got) == fingerprint(tmp_path / "ref")
    finally:
        hold.touch()
        shutil.rmtree(ray_dir, ignore_errors=True)
        server.stop()
