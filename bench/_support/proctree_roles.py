"""Per-process memory by role (map worker, Ray process, driver), sampled from smaps_rollup: worker_memory.py.

Sampling the memory of a process tree from /proc (Linux): a `datapipe run` driver, the Ray
processes it starts, and Ray's workers, each classified by its role.

RSS counts shared pages (Python's shared libraries, pyarrow, the mmapped Ray object store) in
every process that maps them, so per-process RSS summed over a tree overstates it; PSS splits
shared pages between the processes that share them (so PSS sums to the tree's real use) and USS
(private pages) is what the process would free on exit.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field

RAY_OWN = ("gcs_server", "raylet", "dashboard", "agent", "log_monitor", "monitor.py", "runtime_env")


@dataclass
class Peak:
    pid: int
    role: str
    titles: set[str] = field(default_factory=set)
    rss: int = 0  # bytes
    pss: int = 0
    uss: int = 0


def _children_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        out.setdefault(parent, []).append(int(d))
    return out


def descendants(root: int) -> list[int]:
    kids, out, todo = _children_map(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _rollup(pid: int) -> tuple[int, int, int] | None:
    """(RSS, PSS, USS) in bytes from smaps_rollup."""
    vals: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                    vals[parts[0][:-1]] = int(parts[1]) * 1024
    except OSError:
        return None
    return vals.get("Rss", 0), vals.get("Pss", 0), vals.get("Private_Clean", 0) + vals.get("Private_Dirty", 0)


def role_of(pid: int, root: int, cmd: str) -> str:
    if pid == root:
        return "driver"
    exe = cmd.split()[0] if cmd else ""
    if exe.endswith(("raylet", "gcs_server")):
        return "ray:" + exe.rsplit("/", 1)[-1]
    if cmd.startswith("ray::") or "default_worker.py" in cmd:
        return "worker"
    if "WATCHDOG" in cmd or ("import os, select, signal" in cmd):
        return "watchdog"
    if any(k in cmd for k in RAY_OWN):
        return "ray:" + next(k for k in RAY_OWN if k in cmd)
    return "other"


class TreeSampler:
    """Samples every descendant of ``root`` every ``interval`` seconds in a thread; keeps the
    peak per process and the peak of the whole tree's PSS sum."""

    def __init__(self, root: int, interval: float = 0.2) -> None:
        self.root, self.interval = root, interval
        self.peaks: dict[int, Peak] = {}
        self.tree_pss_peak = 0
        self.tree_rss_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            pss_sum = rss_sum = 0
            for pid in descendants(self.root):
                cmd = cmdline(pid)
                mem = _rollup(pid)
                if mem is None or not cmd:
                    continue
                peak = self.peaks.get(pid)
                if peak is None:
                    peak = self.peaks[pid] = Peak(pid, role_of(pid, self.root, cmd))
                if peak.role == "worker":
                    peak.titles.add(cmd.split()[0])
                peak.rss, peak.pss, peak.uss = max(peak.rss, mem[0]), max(peak.pss, mem[1]), max(peak.uss, mem[2])
                pss_sum += mem[1]
                rss_sum += mem[0]
            self.tree_pss_peak = max(self.tree_pss_peak, pss_sum)
            self.tree_rss_peak = max(self.tree_rss_peak, rss_sum)
            self._stop.wait(self.interval)


def run_sampled(cmd: list[str], env: dict[str, str] | None = None, interval: float = 0.2) -> tuple[int, float, TreeSampler]:
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    with TreeSampler(proc.pid, interval) as sampler:
        _, err = proc.communicate()
    if proc.returncode != 0:
        print(err[-3000:])
    return proc.returncode, time.perf_counter() - started, sampler


def mib(n: int) -> str:
    return f"{n / 2**20:7.0f}"
