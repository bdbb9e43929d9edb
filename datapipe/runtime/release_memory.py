"""Give a worker's freed heap back to the system between tasks.

Ray reuses a worker process for many tasks of a run. Neither pyarrow's allocator (mimalloc or
jemalloc) nor glibc's malloc returns freed pages to the system on its own accord, so a worker's
resident memory ratchets up to the largest task it ever ran and every later task starts from
there: at 16x the scale bench, a pack task started at 900 MiB of which it used 360. Releasing
after each task keeps a task's peak what that task needs, which is what "memory per task does not
grow with the corpus" is about. The trims cost well under a millisecond, the garbage collection
~0.1 s: a Ray worker releases only after tasks that grew their worker by ``RELEASE_ABOVE_MIB`` or
more (``engine/worker.py``).

A worker also switches pyarrow's default pool to jemalloc before its first task
(``use_returning_pool``): pyarrow's wheels default to mimalloc, whose ``release_unused``
(``mi_collect``) collects the calling thread's heap only, so what Arrow's own threads allocated and
freed (Parquet decoding, the IO pool) stays resident. Replaying the 64 round tasks of the 4x
``bench/substrings.py`` corpus in one process, every other one as a worker of two runs them, with a
release after each: the RSS left after a task climbed from 258 to 373 MiB over rounds 0-3 with
mimalloc, and stayed at 271-302 MiB from the second round on with jemalloc (the system allocator:
281-315 MiB); in the 4x run itself, a round-4 task started from up to 434 MiB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None (musl, macOS: nothing to call)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return getattr(libc, "malloc_trim", None)
    except OSError:
        return None


def release_memory(collect: bool = True) -> None:
    """Collect cycles (``collect``: a full collection costs ~0.1 s in a worker), then hand free pages
    of pyarrow's pool and of malloc back to the system (well under a millisecond)."""
    if collect:
        gc.collect()
    pa = sys.modules.get("pyarrow")  # a task that never imported pyarrow has no pool to trim
    if pa is not None:
        pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def use_returning_pool() -> str:
    """Make jemalloc pyarrow's default memory pool in this process, where pyarrow has it and
    ``ARROW_DEFAULT_MEMORY_POOL`` does not choose another; returns the pool's backend now in use.
    Arrays allocated before keep their pool (and are freed to it)."""
    import pyarrow as pa

    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
        try:
            pa.set_memory_pool(pa.jemalloc_memory_pool())
        except (NotImplementedError, pa.ArrowNotImplementedError):  # a build without jemalloc: keep the default
            pass
    return str(pa.default_memory_pool().backend_name)
