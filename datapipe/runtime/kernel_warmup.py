"""Compile the pipeline's numba kernels once per install, in a throwaway process, before Ray's
workers need them.

Every kernel is ``cache=True``: after the first compilation a process loads it from numba's
on-disk cache in milliseconds. On the first run after an install (or after a kernel's source
changed) each Ray worker would compile the kernels it calls itself, and keep what LLVM's
passes allocated (the largest map worker peaked at 373 MiB PSS against 362 MiB on the next run,
``bench/scaling/worker_memory.py`` with a fresh ``NUMBA_CACHE_DIR``), and two workers compiled the same
kernels twice. Instead the driver of an embedded-Ray run starts ``python -m
datapipe.runtime.kernel_warmup --part I/N`` in up to two processes alongside ``ray.init`` (~6 CPU s in
all, overlapping Ray's start), waits for them before the first task and writes the stamp; the
compiler's memory goes with those processes.

``SIGNATURES`` lists each kernel with the argument types the stages pass it (the dtypes of their
Arrow buffers and work arrays); tests/e2e/test_kernel_warmup.py runs the stages on real data after a
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

from datapipe.storage.cache import cache_dir

# "module:attribute" -> argument types, spelled (dtype, ndim, readonly) for C-contiguous arrays
# and a dtype name for scalars. readonly: an array viewed on an Arrow buffer (np.frombuffer).
_A = tuple[str, int, bool]
SIGNATURES: dict[str, tuple[_A | str, ...]] = {
    "datapipe.stages.cjk:_count_kernel": (
        ("uint32", 1, True),
        ("int64", 1, False),
        ("uint8", 1, False),
        ("uint8", 1, False),
        ("int64", 2, False),
        ("int64", 2, False),
        ("int64", 1, False),
    ),
    "datapipe.text.code_points:_decode_kernel": (
        ("uint8", 1, True),
        ("int64", 1, False),
        ("uint32", 1, False),
        ("int64", 1, False),
    ),
    "datapipe.stages.quality._kernels:ngram_signals": (
        ("int64", 1, False),
        ("int64", 1, False),
        ("float64", 1, False),
        "int64",
        ("boolean", 1, False),
        ("boolean", 1, False),
        ("float64", 2, False),
        ("float64", 2, False),
    ),
    "datapipe.stages.quality._kernels:char_tokens": (
        ("uint8", 1, False),
        ("int64", 1, False),
        "boolean",
        "float64",
        ("uint64", 1, False),
        ("int64", 1, False),
        ("int64", 1, False),
        ("float64", 1, False),
    ),
    "datapipe.stages.quality._kernels:mark_code_points": (
        ("uint8", 1, False),
        ("int64", 1, False),
        ("boolean", 1, False),
        ("boolean", 1, False),
    ),
    "datapipe.stages.quality._kernels:class_counts": (
        ("uint8", 1, False),
        ("int64", 1, False),
        ("uint8", 1, False),
        ("boolean", 1, False),
        ("int64", 2, False),
    ),
    "datapipe.dedup.shingles:_shingle_kernel_jit": (
        ("uint32", 1, True),
        ("int64", 1, False),
        ("boolean", 1, False),
        ("uint32", 1, False),
        ("uint8", 1, False),
        "int64",
        ("uint32", 1, False),
        ("uint32", 2, False),
        ("uint32", 1, False),
        ("int64", 1, False),
        ("uint32", 1, False),
        ("uint32", 1, False),
        ("int64", 1, False),
        ("int64", 1, False),
    ),
    "datapipe.dedup.shingles:_needs_python_jit": (
        ("uint32", 1, True),
        ("int64", 1, False),
        ("uint32", 1, False),
        ("boolean", 1, False),
    ),
    "datapipe.text.nfkc:_map_kernel": (
        ("uint8", 1, True),
        ("int64", 1, False),
        ("uint32", 1, False),
        ("uint8", 1, False),
        ("int64", 1, False),
        ("boolean", 1, False),
    ),
    "datapipe.dedup.cluster:_union_kernel": (("int64", 1, False), ("int64", 1, False), ("int64", 1, False)),
    "datapipe.dedup.cluster:_flatten_kernel": (("int64", 1, False),),
    "datapipe.dedup.minhash:_affine32_jit": (
        ("uint32", 1, False),
        ("int64", 1, False),
        ("uint32", 1, False),
        ("uint32", 1, False),
        ("uint32", 2, False),
    ),
    "datapipe.dedup.minhash:_legacy_jit": (
        ("uint32", 1, False),
        ("int64", 1, False),
        ("uint64", 1, False),
        ("uint64", 1, False),
        ("uint64", 2, False),
    ),
    "datapipe.stages.boilerplate:_fnv1a_kernel": (("uint8", 1, False), ("int64", 1, False), ("uint64", 1, False)),
    "datapipe.dedup.substrings:_tokenize_jit": (
        ("uint32", 1, False),
        ("int64", 1, False),
        ("uint8", 1, False),
        ("int64", 1, False),
        ("int64", 1, False),
        ("uint64", 1, False),
        ("int64", 1, False),
    ),
    "datapipe.dedup.substrings:_window_jit": (("uint64", 1, False), "int64", "int64", "int64", ("uint64", 1, False)),
    "datapipe.dedup.substrings:_anchor_jit": (
        ("uint64", 1, False),
        ("int64", 1, False),
        "int64",
        "int64",
        "int64",
        ("int64", 1, False),
        ("int64", 1, False),
        ("uint64", 1, False),
        ("uint64", 1, False),
    ),
    "datapipe.decontaminate.ngrams:_ngram_kernel_jit": (
        ("uint32", 1, True),
        ("int64", 1, False),
        ("boolean", 1, False),
        ("uint32", 1, False),
        ("uint32", 1, False),
        ("uint8", 1, False),
        "int64",
        "int64",
        ("uint64", 1, False),
        ("int64", 1, False),
        ("uint64", 1, False),
        ("int64", 1, False),
        ("boolean", 1, False),
    ),
    "datapipe.decontaminate.index:_lookup_jit": (
        ("uint64", 1, False),
        ("uint8", 1, False),
        "int64",
        ("uint64", 1, False),
        ("boolean", 1, False),
    ),
}

WAIT_SECONDS = 300.0  # a warm-up that takes longer is stopped; the workers then compile as before


def _modules() -> list[str]:
    return sorted({k.split(":")[0] for k in SIGNATURES})


def stamp_path() -> Path | None:
    """The stamp that says this install's kernels are compiled in numba's cache; None when numba
    is not installed. Its name changes with any kernel module's size or time, numba's install,
    the interpreter and ``NUMBA_CACHE_DIR`` (what numba's own cache index depends on)."""
    numba = importlib.util.find_spec("numba")  # found, not imported (~0.4 s)
    if numba is None or numba.origin is None:
        return None
    installed = os.stat(numba.origin)  # a reinstalled numba has a new __init__.py
    parts = [numba.origin, str(installed.st_mtime_ns), sys.executable, sys.version, os.environ.get("NUMBA_CACHE_DIR", "")]
    root = Path(__file__).resolve().parents[2]  # found by path: importing the stages costs seconds
    for name in _modules():
        source = root.joinpath(*name.split(".")).with_suffix(".py")
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


def _numba_type(spec: _A | str, types: Any) -> Any:
    if isinstance(spec, str):
        return getattr(types, spec)
    dtype, ndim, readonly = spec
    return types.Array(getattr(types, dtype), ndim, "C", readonly=readonly)


def compile_all(part: int = 0, parts: int = 1) -> dict[str, tuple[int, int]]:
    """Compile (or load from numba's cache) every kernel for its signature, in this process; with
    ``parts`` > 1 only every parts-th kernel from ``part`` on. Returns "module:attribute" ->
    (cache hits, compilations)."""
    from datapipe.runtime.jit import load_numba

    types = load_numba().types
    out = {}
    for key, args in list(SIGNATURES.items())[part::parts]:
        module, attr = key.split(":")
        kernel = getattr(importlib.import_module(module), attr)
        kernel.compile(tuple(_numba_type(a, types) for a in args))
        stats = kernel.stats
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
