"""Optional numba kernels of the loader: found here, defined in ``_kernels``.

numba is a project dependency but training jobs may not have it, so nothing here is
required: without numba (or with DATAPIPE_LOADER_NUMBA=0) every accessor returns None and
the loader uses its numpy paths, which give the same order and the same arrays (tested).
numba is imported on first use, not with the loader: importing it takes ~0.7 s and the first
compile a few seconds (later processes load the compiled kernels from numba's on-disk cache),
and neither should delay the first batch or a job that never asks for these fields.

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
_KERNELS = {  # accessor group -> kernel names in _kernels (a group is switched off as one in tests)
    "segments": ("_segments", "_bounds", "_block_bounds"),
    "order": ("_permute_loop", "_locate", "_addresses"),
    "gather": ("_gather_rows",),
}


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
