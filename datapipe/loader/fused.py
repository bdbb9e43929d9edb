"""Optional numba kernels of the loader: found here, defined in ``_kernels``.

numba is a project dependency but training jobs may not have it, so nothing here is
required: without numba (or with DATAPIPE_LOADER_NUMBA=0) every accessor returns None and
the loader uses its numpy paths, which give the same order and the same arrays (tested).
numba is imported on first use, not with the loader: importing it and loading the cached
kernels costs a process ~0.9 s of CPU and ~55 MiB (the first compile a few seconds more; later
processes load the kernels from numba's on-disk cache), more than a whole epoch of 12.96M tokens
costs on the numpy paths (~0.13 s). So the in-process loader uses the kernels only once this
process has spent ``BREAK_EVEN_S`` of CPU on its numpy paths (``numpy_work``): the rule of renting
until the rent paid equals the price, which never costs more than twice the better choice made
in hindsight. Short jobs never load numba; long ones pay ~1 s once and then run compiled.

Why kernels at all:
* segment fields (position_ids, cu_seqlens, num_segments, loss_mask): numpy needs ~30 calls
  and several full passes over (B, L) int32 temporaries per batch, while one compiled loop
  writes each output element once, in cache;
* the compact segment fields (batch.bounds): numpy's lexsort and ~30 calls cost ~1 us a
  row, more than copying the row's tokens; the loop costs tens of ns;
* the order (blend, Feistel permutation, shard search) and row addresses of a block: numpy's
  ~60 array operations per block cost more than the gather they feed;
* the row gather: numpy's fancy index spends ~100 ns a row on iterator set-up before it
  copies, about a seventh of a 4 KiB row's copy; one memcpy per row from a compiled loop
  does not. Same safety rules as gather.RowView: only registered row starts, under a lease.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

_built: dict[str, Any] = {}
# Seconds of the loader's own numpy-path work in this process after which the kernels pay for
# numba's import and load (~0.9 s of CPU; a fresh process's epoch of bench/perf/loader_workers.py
# took 1.0-1.2 s of CPU with them from its second block, 0.13-0.14 s without).
BREAK_EVEN_S = 1.0
_numpy_s = 0.0
_KERNELS = {  # accessor group -> kernel names in _kernels (a group is switched off as one in tests)
    "segments": ("_segments", "_bounds", "_block_bounds"),
    "order": ("_permute_loop", "_locate", "_addresses"),
    "gather": ("_gather_rows",),
}


def numpy_work(seconds: float) -> bool:
    """Count ``seconds`` of CPU of in-process loader work done in numpy; True once this process's total
    reaches ``BREAK_EVEN_S`` (from then on the compiled kernels are worth loading)."""
    global _numpy_s
    _numpy_s += seconds
    return _numpy_s >= BREAK_EVEN_S


def _compiled(group: str, name: str) -> Callable[..., Any] | None:
    """Kernel ``name`` of ``group``; None when numba is unavailable or DATAPIPE_LOADER_NUMBA=0."""
    if group not in _built:
        _built[group] = None
        if os.environ.get("DATAPIPE_LOADER_NUMBA", "1") != "0":
            try:
                from datapipe.loader import _kernels
            except ImportError:  # the numpy path is complete; numba only makes it faster
                pass
            else:
                _built[group] = {k: getattr(_kernels, k) for k in _KERNELS[group]}
    kernels = _built[group]
    return kernels[name] if kernels else None


def kernel() -> Callable[..., Any] | None:
    """The segment-fields kernel (same definitions as batch.assemble), or None."""
    return _compiled("segments", "_segments")


def bounds_kernel() -> Callable[..., Any] | None:
    """batch.bounds compiled (cu_seqlens, num_segments, label_end; nothing per token), or None."""
    return _compiled("segments", "_bounds")


def block_bounds_kernel() -> Callable[..., Any] | None:
    """ShardTable.meta + batch.bounds of a block's rows in one compiled pass, or None."""
    return _compiled("segments", "_block_bounds")


def permute_kernel() -> Callable[..., Any] | None:
    """order.permute's Feistel network compiled (same arithmetic), or None."""
    return _compiled("order", "_permute_loop")


def locate_kernel() -> Callable[..., Any] | None:
    """PackedDataset.locate in one compiled pass (blend, keys, permutation, shard search), or None."""
    return _compiled("order", "_locate")


def address_kernel() -> Callable[..., Any] | None:
    """ShardTable's address arithmetic for a block in one compiled pass, or None."""
    return _compiled("order", "_addresses")


def gather_kernel() -> Callable[..., Any] | None:
    """The memcpy row gather, or None."""
    return _compiled("gather", "_gather_rows")
