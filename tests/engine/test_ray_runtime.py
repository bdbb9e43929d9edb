"""Embedded Ray starts only what a one-node run uses (datapipe/engine/executors/ray/runtime.py), with stand-ins
for the raylet's two agents (datapipe/engine/executors/ray/agent_stub.py)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench._support.proctree_roles import cmdline, descendants


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_embedded_ray_starts_no_cluster_services(ray_local: str) -> None:
    import ray

    @ray.remote
    def pid() -> int:
        return os.getpid()

    workers = set(ray.get([pid.remote() for _ in range(2)]))  # the node works: tasks run
    # A process that is exiting (a worker of an earlier test being reaped) reads as an empty command line.
    procs = {p: c for p in descendants(os.getpid()) if p != os.getpid() and (c := cmdline(p)).strip()}
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

    from datapipe.engine.executors.ray.runtime import _CLUSTER_SERVICES, _not_started

    assert all(Node.__dict__[name] is not _not_started for name in _CLUSTER_SERVICES)
    # The raylet's agents are the stand-ins (Ray's own agents' commands follow them, after "--"), and
    # Ray's command builder is its own again.
    from ray._private import services

    from datapipe.engine.executors.ray.runtime import _COMMAND_BUILDER, AGENT_STUB

    stubs = sorted(c.split()[4] for c in procs.values() if c.split()[3:4] == [AGENT_STUB])
    assert stubs == ["dashboard", "runtime-env"], short
    assert getattr(services, _COMMAND_BUILDER).__module__ == "ray._private.services"


def test_runtime_env_reaches_tasks_through_the_lazy_agent(ray_local: str) -> None:
    """A task with a runtime_env needs Ray's runtime-env agent: the stand-in starts it on first use."""
    import ray

    @ray.remote
    def env(name: str) -> str | None:
        return os.environ.get(name)

    for value in ("first", "second"):  # the second is served by the agent the first one started
        assert ray.get(env.options(runtime_env={"env_vars": {"DATAPIPE_TEST_ENV": value}}).remote("DATAPIPE_TEST_ENV")) == value


SESSION = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import ray
from bench._support.proctree_roles import descendants
from datapipe.engine.executors.ray.runtime import ray_session

with ray_session(num_cpus=1):
    @ray.remote
    def env():
        return os.environ.get("DATAPIPE_TEST_ENV")

    assert ray.get(env.options(runtime_env={"env_vars": {"DATAPIPE_TEST_ENV": "x"}}).remote()) == "x"
    print(json.dumps([p for p in descendants(os.getpid()) if p != os.getpid()]))
"""


@pytest.mark.ray  # starts Ray in a subprocess: slow as well (tests/conftest.py), outside the fast tier
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_embedded_ray_processes_end_with_the_session(tmp_path: Path) -> None:
    """Every process of the session (the stand-ins and the agent one of them started included) is gone
    once the session ends."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "DATAPIPE_CACHE_DIR": str(tmp_path)}  # a session folder of its own
    done = subprocess.run([sys.executable, "-c", SESSION, str(root)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    pids = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(pids) >= 6, pids  # GCS, raylet, 2 stand-ins, Ray's runtime-env agent, a worker
    deadline = time.monotonic() + 10
    while (alive := [p for p in pids if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive, [cmdline(p)[:100] for p in alive]


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
