"""Compile the pipeline's numba kernels once per install, in a throwaway process, before Ray's
workers need them.

Every kernel is ``cache=True``: after the first compilation a process loads it from numba's
on-disk cache in milliseconds. On the first run after an install (or after a kernel's source
changed) each Ray worker would compile the kernels it calls itself, and keep what LLVM's
passes allocated (``bench/scaling/worker_memory.py`` with a fresh ``NUMBA_CACHE_DIR`` measures it),
and two workers compiled the same kernels twice. Instead the driver of an embedded-Ray run starts
``python -m datapipe.runtime.kernel_warmup --part I/N`` in up to two processes alongside ``ray.init``
(overlapping Ray's start), waits for them before the first task and writes the stamp; the
compiler's memory goes with those processes.

Each kernel declares beside itself the argument types the stages pass it (``njit(...,
warm=[signature])``: the dtypes of their Arrow buffers and work arrays, ``runtime/jit.py``); the
warm-up finds the modules that declare some by reading the package's files, imports them and
compiles those signatures. tests/e2e/test_kernel_warmup.py runs the stages on real data after a
warm-up and fails if any kernel still had to compile. A stamp in datapipe's cache (keyed by the
kernel sources' sizes and times, numba's install and the interpreter) makes later runs skip the
warm-up without importing numba. A failed or missing warm-up only means workers compile as before.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from datapipe.runtime.jit import ArgSpec
from datapipe.storage.cache import cache_dir

WAIT_SECONDS = 300.0  # a warm-up that takes longer is stopped; the workers then compile as before


def kernel_modules() -> list[str]:
    """The modules whose kernels declare warm-up signatures (``njit(..., warm=...)``), found by reading
    the package's files: importing them to ask would cost the driver seconds and numba's memory."""
    package = Path(__file__).resolve().parents[1]
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.parent == package / "runtime" and path.name in ("jit.py", "kernel_warmup.py"):
            continue  # where warm= is defined and read, not used
        text = path.read_text(encoding="utf-8")
        if "lazy_numba" in text and "warm=" in text:
            parts = path.relative_to(package.parent).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def warm_kernels() -> list[tuple[str, Any]]:
    """("module:function", lazy kernel) of every kernel with warm-up signatures, its module imported."""
    from datapipe.runtime import jit

    for name in kernel_modules():
        importlib.import_module(name)
    kernels = {f"{k.py_func.__module__}:{k.py_func.__name__}": k for k in jit.WARM}
    return sorted(kernels.items())


def stamp_path() -> Path | None:
    """The stamp that says this install's kernels are compiled in numba's cache; None when numba
    is not installed. Its name changes with any kernel module's size or time, numba's install,
    the interpreter and ``NUMBA_CACHE_DIR`` (what numba's own cache index depends on)."""
    numba = importlib.util.find_spec("numba")  # found, not imported (importing it costs a run's start)
    if numba is None or numba.origin is None:
        return None
    installed = os.stat(numba.origin)  # a reinstalled numba has a new __init__.py
    parts = [numba.origin, str(installed.st_mtime_ns), sys.executable, sys.version, os.environ.get("NUMBA_CACHE_DIR", "")]
    root = Path(__file__).resolve().parents[2]  # found by path: importing the stages costs seconds
    for name in kernel_modules():
        source = root.joinpath(*name.split(".")).with_suffix(".py")
        if not source.is_file():
            source = root.joinpath(*name.split("."), "__init__.py")
        try:
            st = source.stat()
        except OSError:
            return None
        parts += [str(source), str(st.st_size), str(st.st_mtime_ns)]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
    return cache_dir() / "numba-warm" / key


class Warmup:
    """The warm-up processes started by :func:`start`; :meth:`wait` before the first task."""

    def __init__(self, procs: list[subprocess.Popen], stamp: Path) -> None:
        self.procs, self.stamp = procs, stamp

    def wait(self, timeout: float = WAIT_SECONDS) -> bool:
        """True when every kernel is compiled (then the stamp is written); never raises."""
        deadline, ok = time.monotonic() + timeout, True
        for proc in self.procs:
            try:
                ok = proc.wait(timeout=max(deadline - time.monotonic(), 0.1)) == 0 and ok
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                ok = False
        if ok:
            _write_stamp(self.stamp)
        return ok


def start(log: Callable[[str], None] | None = None, cpus: int | None = None) -> Warmup | None:
    """Start compiling the kernels, split over ``cpus`` processes (at most 2: each imports numba),
    unless this install's stamp says they are compiled (or numba is missing); None when there is
    nothing to do."""
    stamp = stamp_path()
    if stamp is None or stamp.exists():
        return None
    if log is not None:
        log("datapipe: compiling the numba kernels once for this install (later runs load them)")
    package_parent = str(Path(__file__).resolve().parents[2])  # the datapipe this driver runs
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p)}
    n = max(1, min(2, cpus or os.cpu_count() or 1))
    procs = []
    try:
        for i in range(n):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "datapipe.runtime.kernel_warmup", "--part", f"{i}/{n}"],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    close_fds=True,
                )
            )
    except OSError:  # no process to spare: the workers compile as before
        for proc in procs:
            proc.kill()
            proc.wait()
        return None
    return Warmup(procs, stamp)


def _write_stamp(stamp: Path) -> None:
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text("numba kernels compiled into numba's cache\n")
    except OSError:  # a read-only cache: the next run warms up again (loading, not compiling)
        pass


def _numba_type(spec: ArgSpec, types: Any) -> Any:
    if isinstance(spec, str):
        return getattr(types, spec)
    dtype, ndim, readonly = spec
    return types.Array(getattr(types, dtype), ndim, "C", readonly=readonly)


def compile_all(part: int = 0, parts: int = 1) -> dict[str, tuple[int, int]]:
    """Compile (or load from numba's cache) every kernel for its warm-up signatures, in this process;
    with ``parts`` > 1 only every parts-th kernel from ``part`` on. Returns "module:function" ->
    (cache hits, compilations)."""
    from datapipe.runtime.jit import load_numba

    types = load_numba().types
    out = {}
    for key, kernel in warm_kernels()[part::parts]:
        dispatcher = kernel.dispatcher()
        for signature in kernel.warm:
            dispatcher.compile(tuple(_numba_type(a, types) for a in signature))
        stats = dispatcher.stats
        out[key] = (sum(stats.cache_hits.values()), sum(stats.cache_misses.values()))
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m datapipe.runtime.kernel_warmup``: compile every kernel and write the stamp (what a run
    does on its own the first time; an image build can run it ahead). ``--part I/N``: the I-th
    of N shares, no stamp (a run starts the shares side by side and stamps when all succeeded)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m datapipe.runtime.kernel_warmup", description=main.__doc__)
    ap.add_argument("--part", default="0/1", help="I/N: compile the I-th of N shares of the kernels")
    args = ap.parse_args(argv)
    part, parts = (int(x) for x in args.part.split("/"))
    stamp = stamp_path()
    for name, (_hits, compiled) in compile_all(part, parts).items():
        print(f"{name}: {'compiled' if compiled else 'from cache'}")
    if parts == 1 and stamp is not None:
        _write_stamp(stamp)


if __name__ == "__main__":
    main()
