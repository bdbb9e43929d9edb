"""The driver's own CPU: its threads' without Ray's, told apart by thread name (runtime/own_cpu.py)."""

from __future__ import annotations

import ctypes
import sys
import threading
import time

import pytest

from datapipe.runtime.own_cpu import OwnCpu, Sections

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")


def _burn(seconds: float, name: bytes | None = None, cpu: OwnCpu | None = None) -> None:
    """Spin ``seconds`` of CPU in a new thread, named ``name`` (its ``comm``, as Ray's threads are);
    ``cpu`` reads the threads once while it is still alive (Ray's live as long as their driver's run)."""
    spun, leave = threading.Event(), threading.Event()

    def work() -> None:
        if name is not None:
            ctypes.CDLL(None).prctl(15, name, 0, 0, 0)  # PR_SET_NAME
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass
        spun.set()
        leave.wait()

    t = threading.Thread(target=work)
    t.start()
    spun.wait()
    if cpu is not None:
        cpu.own()
    leave.set()
    t.join()


def test_ray_threads_left_out_own_threads_counted() -> None:
    cpu = OwnCpu()
    cpu.own()  # sees the threads alive now
    before = cpu.own()
    _burn(0.3, b"grpc_global_tim", cpu)  # a gRPC thread's name: Ray's, even after it ended
    ray_side = cpu.own() - before
    _burn(0.3, b"python", cpu)
    own_side = cpu.own() - before - ray_side
    assert ray_side < 0.1, ray_side
    assert own_side > 0.25, own_side


def test_sections_add_up_by_name() -> None:
    s = Sections()
    s.mark("start")
    _burn(0.1)
    s.mark("phase:a")
    _burn(0.1)
    s.mark("phase:a")
    rec = s.record()
    assert set(rec) == {"start", "phase:a"}
    assert 0.18 < rec["phase:a"] < 0.5, rec
