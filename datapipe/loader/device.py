"""Per-token segment fields built where the batch is used (the GPU), from the compact description.

``position_ids`` (int32) and ``loss_mask`` (bool) are 2.5x the token bytes again per batch
when the loader writes them on the host; ``cu_seqlens``, ``num_segments`` and ``label_end``
(``batch.COMPACT_FIELDS``, a few int32 per row) describe both exactly. A trainer asks the
loader for ``fields=COMPACT_FIELDS`` and expands after the transfer::

    from datapipe.loader.batch import COMPACT_FIELDS
    from datapipe.loader.device import expand_segments

    ds = PackedDataset(run, seq_len=4096, batch_size=8, fields=COMPACT_FIELDS, mask_cross_document=True)
    for batch in ds.dataloader(num_workers=2, pin_memory=True):
        batch = expand_segments(batch, device="cuda", mask_cross_document=True, ignore_index=-100)
        ids = batch["input_ids"].long()         # uint16 on the host, widened on the GPU

``expand_segments`` gives the same values as the loader's host path (tested against
``PackedDataset.read``): torch ops only (scatter, cummax, arange, comparisons),
vectorised over the batch, no Python loop over rows and no host synchronisation, so on a
GPU it is a handful of kernel launches. Imported only by callers: the loader itself never
imports torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def position_ids_from_cu_seqlens(cu_seqlens: torch.Tensor, seq_len: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """(B, seq_len) positions restarting at 0 at each segment start, on cu_seqlens' device.

    cu_seqlens is (B, S + 1): 0, the ends of the row's segments, then seq_len repeated (the
    loader's layout). Each segment start is written at its own position (a scatter; the
    ends equal to seq_len land in an extra column), a running maximum (cummax) carries it
    over its segment, and position = p - start. A repeat_interleave of segment lengths gives
    the same but costs ~10x more on CPU. Shapes are fixed: no host synchronisation on CUDA."""
    b = cu_seqlens.shape[0]
    cu = cu_seqlens.long()
    start = torch.zeros(b, seq_len + 1, dtype=torch.long, device=cu.device)
    start.scatter_(1, cu[:, :-1], cu[:, :-1])  # duplicate indices (seq_len) carry equal values
    start = start[:, :seq_len].cummax(dim=1).values
    pos = torch.arange(seq_len, device=cu.device).expand(b, seq_len) - start
    return pos.to(dtype)


def loss_mask_from_segments(
    cu_seqlens: torch.Tensor, label_end: torch.Tensor, seq_len: int, mask_cross_document: bool = False
) -> torch.Tensor:
    """(B, seq_len) bool: True where the label is a real token (p < label_end) and, with
    ``mask_cross_document``, not the first token of the next segment (p + 1 an inner
    boundary of cu_seqlens). Same definition as ``batch.segments`` (see ``batch.label_end``)."""
    b, dev = cu_seqlens.shape[0], cu_seqlens.device
    mask = torch.arange(seq_len, device=dev).expand(b, seq_len) < label_end.long().view(b, 1)
    if mask_cross_document and seq_len > 1:
        # Mark every segment end; inner ends are < seq_len, the last end and the padding entries
        # are seq_len and land in the extra column, which is dropped.
        boundary = torch.zeros(b, seq_len + 1, dtype=torch.bool, device=dev)
        boundary.scatter_(1, cu_seqlens[:, 1:].long(), True)
        mask[:, :-1] &= ~boundary[:, 1:seq_len]
    return mask


def expand_segments(
    batch: dict[str, Any],
    device: torch.device | str | None = None,
    mask_cross_document: bool = False,
    ignore_index: int | None = None,
    position_dtype: torch.dtype = torch.int32,
) -> dict[str, torch.Tensor]:
    """A batch of ``COMPACT_FIELDS`` (tensors or numpy arrays) with ``position_ids`` and
    ``loss_mask`` added, built on ``device`` (default: where the batch already is).

    Pass the dataset's ``mask_cross_document`` and ``ignore_index``: with ``ignore_index``,
    ``labels`` become int64 holding it wherever the mask is False, as the host path does
    (a compact batch carries labels in the token dtype). Tensors are moved with
    ``non_blocking=True`` (pin_memory=True in the DataLoader makes that asynchronous).
    ``ds.expand_segments(batch, device)`` passes the dataset's settings."""
    out: dict[str, torch.Tensor] = {}
    for k, v in batch.items():
        t = v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v))
        out[k] = t.to(device, non_blocking=True) if device is not None else t
    missing = [k for k in ("input_ids", "cu_seqlens", "label_end") if k not in out]
    if missing:
        raise KeyError(f"expand_segments needs {missing} in the batch: load with fields=COMPACT_FIELDS")
    seq_len = out["input_ids"].shape[-1]
    out["position_ids"] = position_ids_from_cu_seqlens(out["cu_seqlens"], seq_len, position_dtype)
    mask = loss_mask_from_segments(out["cu_seqlens"], out["label_end"], seq_len, mask_cross_document)
    out["loss_mask"] = mask
    if ignore_index is not None and "labels" in out:
        out["labels"] = out["labels"].long().masked_fill(~mask, ignore_index)
    return out
