"""Give a worker's freed heap back to the system between tasks.

Ray reuses a worker process for many tasks of a run. Neither pyarrow's allocator (mimalloc or
jemalloc) nor glibc's malloc returns freed pages to the system on its own accord, so a worker's
resident memory ratchets up to the largest task it ever ran and every later task starts from
there: at 16x the scale bench, a pack task started at 900 MiB of which it used 360. Releasing
after each task keeps a task's peak what that task needs, which is what "memory per task does not
grow with the corpus" is about. The trims cost well under a millisecond, the garbage collection
~0.1 s: a Ray worker releases only after tasks that grew their worker by ``RELEASE_ABOVE_MIB`` or
more (``engine/executors/ray/worker.py``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
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
