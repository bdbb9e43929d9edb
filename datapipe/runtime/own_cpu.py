"""The CPU a process spent in its own threads, without Ray's: the driver's serial work, by section.

A driver on Ray holds Ray's core-worker and gRPC threads (task submission, results, event loops,
timers) beside its own (the phase loop, the store client's, DuckDB's). Ray's run beside the loop on
the driver node's other cores; the driver's own are the run's serial step (docs/scaling.md). The
runner records its own threads' CPU per section of a run (start, each phase, end) in run.json, so a
bench fits the part per task without the start's imports and planning, whose CPU varies by about
a second between runs and hid ~0.5 ms per task in the whole-process figure.
"""

from __future__ import annotations

import os
import re
import time

# Thread names (``comm``, 15 characters) of Ray's core worker and gRPC in a driver process; every
# other thread (Python's, named ``python``; the store client's; DuckDB's) is the process's own work.
RAY_THREADS = re.compile(
    r"^(client\.poll|server\.poll|worker\.|nexting_thread|event_engine|task_event_buf|grpc|timer_manager|"
    r"jemalloc_bg|gcs_client|default-execut|global\.accessor|resolver-execu|core_worker|ray_|io_context|"
    r"periodical|metrics|signal_handler|object_recovery|memory_monitor|log_|ray::)"
)

_TASKS = "/proc/self/task"


class OwnCpu:
    """``own()``: CPU seconds this process has used so far in threads other than Ray's.

    The process's CPU (every thread's, those that ended included) less what each of Ray's threads
    has used, read from ``/proc/self/task/<tid>/schedstat`` (nanoseconds) and remembered per thread,
    so one that ends (at Ray's shutdown) still counts as Ray's up to its last reading. A thread's
    kind is read once (its name). Without ``/proc``: the whole process."""

    def __init__(self) -> None:
        self._ray_ns: dict[str, int] = {}  # Ray's threads: tid -> CPU ns at their last reading
        self._kind: dict[str, bool] = {}  # tid -> whether it is Ray's
        self._proc = os.path.isdir(_TASKS)

    def own(self) -> float:
        total = time.process_time()
        if not self._proc:
            return total
        try:
            tids = os.listdir(_TASKS)
        except OSError:
            return total - sum(self._ray_ns.values()) / 1e9
        for tid in tids:
            is_ray = self._kind.get(tid)
            try:
                if is_ray is None:
                    with open(f"{_TASKS}/{tid}/comm") as f:
                        is_ray = self._kind[tid] = bool(RAY_THREADS.match(f.read().strip()))
                if is_ray:
                    with open(f"{_TASKS}/{tid}/schedstat") as f:
                        self._ray_ns[tid] = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):  # ended meanwhile: its last reading stands
                continue
        return total - sum(self._ray_ns.values()) / 1e9


class Sections:
    """The process's own CPU by section of a run: ``mark(name)`` closes the section running since the
    last mark (the first one since the process started) and names it; a name marked again adds up."""

    def __init__(self) -> None:
        self._cpu = OwnCpu()
        self._last = 0.0
        self.seconds: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = self._cpu.own()
        self.seconds[name] = self.seconds.get(name, 0.0) + (now - self._last)
        self._last = now

    def record(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in self.seconds.items()}
