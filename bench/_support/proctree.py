"""Wall time, CPU time and peak memory of a command's whole process tree, from /proc.

A timer around ``subprocess.run`` sees only the child; Ray's raylet, GCS and workers, or
datatrove's pool workers, are grandchildren (some of them orphaned when their parent exits),
so their CPU and memory are missed. Method:

* This process makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``): every
  process of the tree whose parent exits is re-parented to us instead of to init, so the whole
  tree stays our descendants, and nothing of it escapes to be counted nowhere.
* **CPU time, exact (cgroup):** where the cgroup-v1 ``cpuacct`` hierarchy is writable, the command
  starts inside a fresh cgroup (it moves itself there before exec, so every descendant is born
  inside) and ``cpuacct.usage`` after the run is the CPU time of every process that ever ran in
  the tree, exited ones included. This is the figure reported as ``cpu_s`` when available.
* **CPU time, exact (reaping):** when a process is reaped, the kernel adds its utime+stime (and that of
  the children it reaped) to its reaper's ``RUSAGE_CHILDREN``. After the command exits we reap
  every orphan left to us, so the growth of our ``RUSAGE_CHILDREN`` over the run is the CPU
  time of every process of the tree, including those that lived shorter than a sampling
  interval. (A parent that sets SIGCHLD to SIG_IGN would drop its children's times; the sampled
  figure below catches that case, and both are reported.)
* **CPU time, sampled** (cross-check): every ``interval`` seconds all descendants are listed
  from /proc/*/stat (ppid links) and each one's utime+stime is remembered, keyed by (pid,
  start time) so a reused pid is a new process; the sum of the last values seen. It misses what
  a process spent after its last sample, so it is a lower bound.
* **Peak tree memory:** at each sample, the sum of RSS over the tree (and of PSS, from
  smaps_rollup, which splits shared pages such as Ray's object store fairly); the maximum over
  samples. RSS sums count shared pages once per process, so PSS is the fairer figure.
"""

from __future__ import annotations

import ctypes
import os
import re
import resource
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")
CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def _new_cgroup() -> Path | None:
    """A fresh cpuacct cgroup for one run, or None where cgroups are not writable here."""
    if not os.access(CPUACCT, os.W_OK):
        return None
    path = CPUACCT / f"datapipe-bench-{os.getpid()}-{time.monotonic_ns()}"
    try:
        path.mkdir()
        return path
    except OSError:
        return None


def become_subreaper() -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> tuple[int, int, int, int] | None:
    """(ppid, utime+stime ticks, start time, rss pages) of a process, None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    f = raw[raw.rindex(b")") + 2 :].split()  # fields after "(comm)": state is f[0] = field 3
    return int(f[1]), int(f[11]) + int(f[12]), int(f[19]), int(f[21])


def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def descendants(root: int, exclude: frozenset[tuple[int, int]] = frozenset()) -> dict[int, tuple[int, int, int, int]]:
    """Every live descendant of ``root`` with its _stat(), leaving out the subtrees of the processes in
    ``exclude`` ((pid, start time) pairs)."""
    stats = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            s = _stat(int(d))
            if s is not None:
                stats[int(d)] = s
    children: dict[int, list[int]] = {}
    for pid, s in stats.items():
        children.setdefault(s[0], []).append(pid)
    out, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if (pid, stats[pid][2]) in exclude:
            continue
        out[pid] = stats[pid]
        todo.extend(children.get(pid, []))
    return out


def _reap_all(deadline_s: float, exclude: frozenset[tuple[int, int]] = frozenset()) -> int:
    """Wait for every remaining child of ours (orphans of the tree); kill them past the deadline.
    ``exclude``: children the caller had before the run (an embedded Ray in a test session), never
    waited for or killed."""
    me, end, killed = os.getpid(), time.monotonic() + deadline_s, 0
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            return killed
        left = descendants(me, exclude)
        if not left:
            return killed
        if time.monotonic() > end:
            for pid in left:  # only processes of the measured tree: our own descendants
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except OSError:
                    pass
            end = time.monotonic() + 5
        time.sleep(0.05)


def run_tree(
    cmd: list[str],
    interval: float = 0.1,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    log: Path | None = None,
    pss: bool = True,
    timeline: list[tuple[float, int, int, int]] | None = None,
    wrapped: bool = False,
) -> dict[str, Any]:
    """Run ``cmd`` to completion and measure its whole process tree (see the module docstring).

    ``wrapped``: ``cmd`` is a wrapper (``strace -f ... CMD``) whose one child is the measured command: the
    "command's own process" (timeline, ``driver_cpu_s``) is that child, and the wrapper's own CPU is
    reported apart (``wrapper_cpu_s``, sampled) so a caller can leave it out.

    ``timeline``, when given, gets one entry per sample: (time.time(), tree RSS, RSS of the command's
    own process, largest RSS of any other process of the tree), in bytes, so a caller can attribute
    memory to what the command was doing at the time (bench/scaling/scale.py: per pipeline phase)."""
    subreaper = become_subreaper()
    me = os.getpid()
    # Processes of ours from before the run (e.g. an embedded Ray's, when a test calls this) are not
    # the measured tree: not counted, not reaped, never killed.
    theirs = frozenset((pid, s[2]) for pid, s in descendants(me).items() if s[0] == me)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    last_cpu: dict[tuple[int, int], int] = {}
    peak = {"rss": 0, "pss": 0, "procs": 0}
    samples = 0
    stop = threading.Event()
    own: dict[str, tuple[int, int] | None] = {"driver": None, "wrapper": None}  # (pid, start) keys of last_cpu
    threads: dict[int, tuple[str, int]] = {}  # the driver's threads: tid -> (name, CPU ticks), last seen

    def sample() -> None:
        nonlocal samples
        tree = descendants(me, theirs)
        rss = 0
        for pid, (_, ticks, start, pages) in tree.items():
            last_cpu[(pid, start)] = ticks
            rss += pages * _PAGE
        peak["rss"] = max(peak["rss"], rss)
        peak["procs"] = max(peak["procs"], len(tree))
        driver = proc.pid
        if wrapped:
            driver = min((pid for pid, s in tree.items() if s[0] == proc.pid), default=-1)
            if proc.pid in tree:
                own["wrapper"] = (proc.pid, tree[proc.pid][2])
        if driver in tree:
            own["driver"] = (driver, tree[driver][2])
            threads.update(_thread_ticks(driver))
        if timeline is not None:
            top = tree.get(driver)
            others = [pages for pid, (_, _, _, pages) in tree.items() if pid not in (driver, proc.pid)]
            timeline.append((time.time(), rss, (top[3] if top else 0) * _PAGE, max(others, default=0) * _PAGE))
        if pss:
            peak["pss"] = max(peak["pss"], sum(_pss_kib(p) for p in tree) * 1024)
        samples += 1

    def loop() -> None:
        while not stop.is_set():
            sample()
            stop.wait(interval)

    cg = _new_cgroup()

    def enter_cgroup() -> None:  # runs in the child before exec: its descendants are born inside
        if cg is not None:
            try:
                (cg / "cgroup.procs").write_text(str(os.getpid()))
            except OSError:
                pass

    out = open(log, "wb") if log else subprocess.DEVNULL
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=enter_cgroup)
    th = threading.Thread(target=loop, daemon=True)
    th.start()
    rc = proc.wait()
    wall = time.perf_counter() - t0
    killed = _reap_all(deadline_s=30.0, exclude=theirs)
    drained = time.perf_counter() - t0
    stop.set()
    th.join()
    if log:
        out.close()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_reaped = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cpu_cgroup = None
    if cg is not None:
        try:
            cpu_cgroup = int((cg / "cpuacct.usage").read_text()) / 1e9
            cg.rmdir()  # empty now: every process of the tree has been reaped
        except (OSError, ValueError):
            pass
    return {
        "rc": rc,
        "wall_s": wall,
        "drained_s": drained,
        "cpu_s": cpu_cgroup if cpu_cgroup is not None else cpu_reaped,
        "cpu_method": "cgroup cpuacct" if cpu_cgroup is not None else "RUSAGE_CHILDREN after reaping the tree",
        "cpu_cgroup_s": cpu_cgroup,
        "cpu_reaped_s": cpu_reaped,
        "cpu_user_s": after.ru_utime - before.ru_utime,
        "cpu_sys_s": after.ru_stime - before.ru_stime,
        "cpu_sampled_s": sum(last_cpu.values()) / _TICK,
        # The command's own process (the driver of a datapipe run), sampled: misses at most one interval.
        "driver_cpu_s": last_cpu[own["driver"]] / _TICK if own["driver"] else None,
        "wrapper_cpu_s": last_cpu[own["wrapper"]] / _TICK if own["wrapper"] else 0.0,
        # The driver's CPU by thread: Ray's own threads (named by Ray and gRPC: submission, results,
        # event loops, timers) run beside the driver's Python threads and the store's, not in turn.
        "driver_threads_cpu_s": _by_role(threads),
        "peak_rss_mib": peak["rss"] / 2**20,
        "peak_pss_mib": peak["pss"] / 2**20,
        "max_procs": peak["procs"],
        "processes_seen": len(last_cpu),
        "samples": samples,
        "interval_s": interval,
        "subreaper": subreaper,
        "killed_leftovers": killed,
    }


# Thread names (``comm``, 15 characters) of Ray's core worker and gRPC in a driver process; every
# other thread (Python's, named ``python``; the store client's; DuckDB's) is the driver's own work.
# The same as datapipe/runtime/own_cpu.py's (the driver's own record by section), kept here so this
# module also measures code that has none (bench/scaling/driver_scale.py runs main's code beside this one).
RAY_THREADS = re.compile(
    r"^(client\.poll|server\.poll|worker\.|nexting_thread|event_engine|task_event_buf|grpc|timer_manager|"
    r"jemalloc_bg|gcs_client|default-execut|global\.accessor|resolver-execu|core_worker|ray_|io_context|"
    r"periodical|metrics|signal_handler|object_recovery|memory_monitor|log_|ray::)"
)


def _thread_ticks(pid: int) -> dict[int, tuple[str, int]]:
    out: dict[int, tuple[str, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                text = f.read()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        rest = text[text.rindex(")") + 2 :].split()
        out[int(tid)] = (name, int(rest[11]) + int(rest[12]))
    return out


def _by_role(threads: dict[int, tuple[str, int]]) -> dict[str, float]:
    ray = sum(t for name, t in threads.values() if RAY_THREADS.match(name))
    total = sum(t for _, t in threads.values())
    return {"ray": ray / _TICK, "own": (total - ray) / _TICK}
