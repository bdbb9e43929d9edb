"""How much memory and time one audit query may take, so ``datapipe sql`` cannot eat the machine.

Without limits a cross join of ``documents`` with itself grew the process to 4 GB in 13 s
until something outside killed it, and ``select * from range(10000000000) order by x
desc limit 1`` ran for half an hour; on a shared login node that takes everyone down.

- **Memory**: DuckDB's ``memory_limit`` (set on the connection before ``lock_configuration``,
  so no query can raise it) bounds its buffer manager: hash tables, sorts, materialised
  results. It does not cover every allocation (Python objects, Arrow buffers handed to
  Python, pyarrow's readahead over the Parquet files of ``kept_docs``, allocator slack), so a
  :class:`QueryGuard` thread also reads the process's resident size from ``/proc/self/statm``
  every 10 ms and interrupts the query once it has grown by more than the limit since the
  query began. Measured with DuckDB 2.0.1: a sort or hash aggregate past the limit ends within
  about 1% of it either way, but ``run_query`` over a cross join (rows collected in Python)
  grew past 3 GB under a 1 GB ``memory_limit`` with the guard off. ``setrlimit(RLIMIT_AS)``
  is not used: the process maps about 1 GB of address space (jemalloc arenas, thread stacks)
  for 110 MB resident, so an address-space cap fails harmless queries and says nothing clear.
  Default: a quarter of the machine's memory
  (or of the cgroup's limit when lower), at most 16 GB; ``--memory-limit`` or
  ``DATAPIPE_SQL_MEMORY_LIMIT`` (``500MB``, ``2GB``, ``1.5GiB``) sets another.
- **Time**: an hour by default (``DEFAULT_TIMEOUT_S``: a query forgotten on a shared machine
  ends; any query over the shared corpus takes seconds, a scan of a large corpus in object
  storage can rightly take longer); ``--timeout SECONDS`` or ``DATAPIPE_SQL_TIMEOUT`` sets
  another (0: none), and the same guard thread interrupts the query once it has run that long.
- **Ctrl-C**: DuckDB runs a query in C++ with the main thread inside it, where Python's SIGINT
  handler cannot run until the query returns (it went on 25-36 s after SIGINT, and a hash join
  far longer). While a query runs in the main thread the guard owns Python's signal wake-up
  file descriptor (``signal.set_wakeup_fd``), to which the interpreter's C-level handler writes
  the signal's number at once, from any state of the main thread; the guard thread reads it
  within ``POLL_S`` and interrupts the query, which then ends with ``QueryInterrupted`` (exit
  status 130).
- **Threads**: at most 4 (or the CPUs this process may use, when fewer): a login node's
  other users keep their cores, and each thread's share of a hash table costs memory.

Either limit ends the query with one line that names it and how to raise it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from datapipe.errors import UsageError

MEMORY_ENV = "DATAPIPE_SQL_MEMORY_LIMIT"
TIMEOUT_ENV = "DATAPIPE_SQL_TIMEOUT"
MEMORY_FRACTION = 0.25
MEMORY_CAP = 16 * 10**9
MAX_THREADS = 4
DEFAULT_TIMEOUT_S = 3600.0
POLL_S = 0.01  # the guard's period: at a few GB/s of growth, tens of MB past the limit at most

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


class LimitError(UsageError):
    """A --memory-limit or --timeout value that cannot be used (exit 2)."""


def parse_size(text: str) -> int:
    """Bytes in ``500MB``, ``2 GB``, ``1.5GiB`` or ``1000000`` (units as DuckDB's: KB=1000, KiB=1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).upper() if m else ""
    if not m or unit not in _UNITS:
        raise LimitError(f"memory limit {text!r} is not a size such as 500MB, 2GB or 1.5GiB")
    size = int(float(m.group(1)) * _UNITS[unit])
    if size < 10**6:
        raise LimitError(f"memory limit {text!r} is below 1MB: no query can run in it")
    return size


def format_size(size: int) -> str:
    return f"{size / 10**9:.1f} GB" if size >= 10**9 else f"{size / 10**6:.0f} MB"


def _cgroup_limit() -> int | None:
    """The memory limit of this process's cgroup (v2 or v1), if it has one."""
    places = []
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                places.append(f"/sys/fs/cgroup{path}/memory.max")
            elif "memory" in controllers.split(","):
                places.append(f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
    except (OSError, ValueError):
        pass
    places += ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
    for place in places:
        try:
            value = Path(place).read_text().strip()
        except OSError:
            continue
        if value.isdigit() and int(value) < 2**60:  # v1 says "no limit" with a huge number, v2 with "max"
            return int(value)
    return None


def physical_memory() -> int | None:
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = None
    limits = [n for n in (total, _cgroup_limit()) if n]
    return min(limits) if limits else None


def default_memory_limit() -> int:
    total = physical_memory()
    return min(MEMORY_CAP, int(total * MEMORY_FRACTION)) if total else 2 * 10**9


def memory_limit(value: str | int | None = None) -> int:
    """The limit in bytes: ``value``, else $DATAPIPE_SQL_MEMORY_LIMIT, else the default."""
    if isinstance(value, int):
        return value
    value = value or os.environ.get(MEMORY_ENV) or None
    return default_memory_limit() if value is None else parse_size(value)


def timeout(value: float | str | None = None) -> float | None:
    """Seconds a query may run: ``value``, else $DATAPIPE_SQL_TIMEOUT, else ``DEFAULT_TIMEOUT_S``;
    0 is no limit (None)."""
    if value is None:
        value = os.environ.get(TIMEOUT_ENV) or None
    if value is None:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        raise LimitError(f"timeout {value!r} is not a number of seconds") from None
    if seconds < 0 or seconds != seconds:
        raise LimitError(f"timeout {value!r} is not a number of seconds")
    return seconds or None


def threads() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cpus))


def memory_message(limit: int) -> str:
    return f"the query used more than the {format_size(limit)} memory limit (--memory-limit or {MEMORY_ENV} to raise it)"


def timeout_message(seconds: float) -> str:
    return f"the query ran longer than the {seconds:g} s time limit (--timeout or {TIMEOUT_ENV} to raise it; 0 for none)"


INTERRUPTED_MESSAGE = "interrupted: the query was stopped (Ctrl-C); nothing was changed"


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int | None:
    """This process's resident set size now (Linux); None where /proc is not there."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class QueryGuard:
    """A thread that interrupts ``con`` once the process has grown by more than ``limit`` bytes
    since the guard started, or once ``seconds`` have passed. ``tripped`` then names why
    (``"memory"`` or ``"time"``) and :meth:`message` says it in one line.

    DuckDB stops at its next check after ``interrupt()``; work in Python (converting or
    printing a batch) does not see it, so callers also check ``tripped`` between batches.
    """

    def __init__(self, con: Any, limit: int, seconds: float | None = None) -> None:
        self.con, self.limit, self.seconds = con, limit, seconds
        self.tripped: str | None = None
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="datapipe-sql-guard", daemon=True)
        self._wakeup: tuple[socket.socket, socket.socket] | None = None  # (read, write) ends: see the module doc
        self._saved_wakeup = -1
        self._saved_handler: Any = None

    def __enter__(self) -> QueryGuard:
        self._base = resident_bytes()
        self._start = time.monotonic()
        self._watch_signals()
        if self._base is not None or self.seconds is not None or self._wakeup is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._wakeup is not None:
            signal.signal(signal.SIGINT, self._saved_handler)
            signal.set_wakeup_fd(self._saved_wakeup)
            for end in self._wakeup:
                end.close()
            self._wakeup = None

    def _watch_signals(self) -> None:
        """Take the signal wake-up fd while the query runs (main thread only, as Python allows)."""
        if threading.current_thread() is not threading.main_thread():
            return
        read, write = socket.socketpair()
        read.setblocking(False)
        write.setblocking(False)
        try:
            self._saved_wakeup = signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
        except (ValueError, OSError):
            read.close()
            write.close()
            return
        self._wakeup = (read, write)
        # Python's own handler would raise KeyboardInterrupt wherever the main thread is when it next
        # runs Python (closing the connection, say), instead of the query's one line: the query is
        # stopped here, and ends as the guard says (``tripped``).
        self._saved_handler = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: object) -> None:
        self._trip("interrupt")

    def _signalled(self) -> bool:
        """Whether SIGINT (or SIGTERM) arrived since the last look."""
        if self._wakeup is None:
            return False
        try:
            got = self._wakeup[0].recv(64)
        except (BlockingIOError, OSError):
            return False
        return any(n in (signal.SIGINT, signal.SIGTERM) for n in got)

    def _watch(self) -> None:
        deadline = None if self.seconds is None else self._start + self.seconds
        while not self._stop.wait(POLL_S):
            if self._signalled():
                self._trip("interrupt")
            rss = resident_bytes() if self._base is not None else None
            if rss is not None and self._base is not None:
                self.peak = max(self.peak, rss - self._base)
                if rss - self._base > self.limit:
                    self._trip("memory")
            if deadline is not None and time.monotonic() > deadline:
                self._trip("time")

    def _trip(self, why: str) -> None:
        if self.tripped is None:  # once: the flag stays set until the query (or stream) next checks it
            self.tripped = why
            self.con.interrupt()

    def message(self, why: str | None = None) -> str:
        why = why or self.tripped
        if why == "time":
            return timeout_message(self.seconds or 0)
        if why == "interrupt":
            return INTERRUPTED_MESSAGE
        return memory_message(self.limit)
