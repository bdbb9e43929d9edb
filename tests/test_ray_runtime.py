"""Embedded Ray starts only what a one-node run uses (datapipe/engine/ray_runtime.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _descendants(root: int) -> dict[int, str]:
    """pid -> command line of every process below ``root`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, grew = {root}, True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in found and pid not in found:
                found.add(pid)
                grew = True
    out = {}
    for pid in found - {root}:
        try:
            out[pid] = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            pass
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_embedded_ray_starts_no_cluster_services(ray_local: str) -> None:
    import ray

    @ray.remote
    def pid() -> int:
        return os.getpid()

    workers = set(ray.get([pid.remote() for _ in range(2)]))  # the node works: tasks run
    procs = _descendants(os.getpid())
    commands = " | ".join(procs.values())
    short = [c[:100] for c in procs.values()]  # a raylet's command line alone is ~6 KB
    assert "gcs_server" in commands and "raylet" in commands, short
    assert workers <= set(procs)  # its workers are this session's
    for service in ("autoscaler/_private/monitor.py", "_private/log_monitor.py", "dashboard/dashboard.py"):
        assert service not in commands, f"{service} was started: {short}"
    # Ray's Node class is restored after start-up: a cluster this process joins later is Ray's own.
    from ray._private.node import Node

    from datapipe.engine.ray_runtime import _CLUSTER_SERVICES, _not_started

    assert all(Node.__dict__[name] is not _not_started for name in _CLUSTER_SERVICES)
