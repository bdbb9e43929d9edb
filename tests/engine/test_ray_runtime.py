"""Embedded Ray starts only what a one-node run uses (datapipe/engine/ray_runtime.py)."""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench._proctree_roles import cmdline, descendants  # noqa: E402


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_embedded_ray_starts_no_cluster_services(ray_local: str) -> None:
    import ray

    @ray.remote
    def pid() -> int:
        return os.getpid()

    workers = set(ray.get([pid.remote() for _ in range(2)]))  # the node works: tasks run
    procs = {p: cmdline(p) for p in descendants(os.getpid()) if p != os.getpid()}
    commands = " | ".join(procs.values())
    short = [c[:100] for c in procs.values()]  # a raylet's command line alone is ~6 KB
    assert "gcs_server" in commands and "raylet" in commands, short
    assert workers <= set(procs)  # its workers are this session's
    for service in ("autoscaler/_private/monitor.py", "_private/log_monitor.py", "dashboard/dashboard.py"):
        assert service not in commands, f"{service} was started: {short}"
    # Nor records what only Ray's dashboard and state API read: the GCS got the settings (which it hands
    # the raylet and every worker) as its base64 JSON --config_list.
    [gcs] = [c.split() for c in procs.values() if c.split()[0].endswith("gcs_server")]
    [config] = [json.loads(base64.b64decode(a.split("=", 1)[1])) for a in gcs if a.startswith("--config_list=")]
    assert config["enable_metrics_collection"] is False and config["task_events_report_interval_ms"] == 0, config
    # Ray's Node class is restored after start-up: a cluster this process joins later is Ray's own.
    from ray._private.node import Node

    from datapipe.engine.ray_runtime import _CLUSTER_SERVICES, _not_started

    assert all(Node.__dict__[name] is not _not_started for name in _CLUSTER_SERVICES)
