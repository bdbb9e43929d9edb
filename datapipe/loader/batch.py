"""Turn gathered rows into training samples: inputs, labels, positions, document boundaries.

Everything is vectorized over the whole batch; input_ids and labels are views of the
gathered rows (token dtype, uint16 for most vocabularies), so the only per-token work
beyond the copy out of the memory map is position_ids and the loss mask. ``assemble`` is
the reference definition; the loader's fast path uses ``segments`` per block (or the numba
kernel in ``fused``, which must return the same arrays). Widening to
int64 is left to the GPU (``.long()`` after the transfer moves 4x fewer bytes).
"""

from __future__ import annotations

import numpy as np

TOKEN_FIELDS = ("input_ids", "labels")
SEGMENT_FIELDS = ("position_ids", "cu_seqlens", "num_segments", "loss_mask")
# Per-token fields: (B, seq_len) each, 2.5x the token bytes again at int32 + bool.
DENSE_FIELDS = ("position_ids", "loss_mask")
# label_end (B,): the loss mask is False from this position on (see label_end()); with
# cu_seqlens it describes the loss mask exactly, so dense fields can be built on the device.
ALL_FIELDS = TOKEN_FIELDS + SEGMENT_FIELDS + ("label_end",)
DEFAULT_FIELDS = TOKEN_FIELDS + SEGMENT_FIELDS
# The compact full sample: tokens plus a few int32 per row; datapipe.loader.device.expand_segments
# builds position_ids and loss_mask from it (on the GPU) exactly as the host would.
COMPACT_FIELDS = TOKEN_FIELDS + ("cu_seqlens", "num_segments", "label_end")
POSITION_DTYPES = {"int32": np.int32, "int16": np.int16}


def assemble(
    tokens: np.ndarray,
    n_tokens: np.ndarray,
    doc_counts: np.ndarray,
    doc_flat: np.ndarray,
    seq_len: int,
    max_segments: int,
    mask_cross_document: bool,
    ignore_index: int | None,
) -> dict[str, np.ndarray]:
    """Build one batch from gathered rows (the reference definition of every field).

    tokens      (B, row_len) rows as stored
    n_tokens    (B,) non-padding tokens per row
    doc_counts  (B,) number of document starts per row; doc_flat holds them back to back
    """
    seg = segments(n_tokens, doc_counts, doc_flat, seq_len, tokens.shape[1], max_segments, mask_cross_document)
    seg["label_end"] = label_end(n_tokens, doc_counts, doc_flat, seq_len, tokens.shape[1], mask_cross_document)
    return {**token_fields(tokens, seq_len, seg["loss_mask"], ignore_index), **seg}


def label_end(
    n_tokens: np.ndarray, doc_counts: np.ndarray, doc_flat: np.ndarray, seq_len: int, row_len: int, mask_cross_document: bool
) -> np.ndarray:
    """Per row, the first position whose label is not a real token (int32, B).

    With ``mask_cross_document`` it also stops before the last position when the label
    token there (row position seq_len) starts a new document: that start is outside the
    input window, so cu_seqlens cannot carry it. The loss mask of a row is then exactly
    ``p < label_end`` and, with ``mask_cross_document``, False where p + 1 is an inner
    segment boundary (cu_seqlens[1:num_segments]): see ``device.loss_mask_from_segments``.
    """
    n = np.asarray(n_tokens).astype(np.int64)
    end = np.maximum(np.minimum(n, row_len) - 1, 0)  # label at p is token p + 1: valid while p + 1 < n
    if mask_cross_document and row_len == seq_len + 1 and len(doc_flat):
        row_of_doc = np.repeat(np.arange(len(n)), doc_counts)
        at_end = row_of_doc[np.asarray(doc_flat) == seq_len]
        end[at_end] = np.minimum(end[at_end], seq_len - 1)
    return end.astype(np.int32)


def bounds(
    n_tokens: np.ndarray,
    doc_counts: np.ndarray,
    doc_flat: np.ndarray,
    seq_len: int,
    row_len: int,
    max_segments: int,
    mask_cross_document: bool,
) -> dict[str, np.ndarray]:
    """cu_seqlens, num_segments and label_end of B rows: the compact segment description,
    a few int32 per row (segments() without its per-token fields)."""
    b, L = len(n_tokens), seq_len
    n = np.asarray(n_tokens).astype(np.int64)
    row_of_doc = np.repeat(np.arange(b), doc_counts)
    inner = (doc_flat > 0) & (doc_flat < L)
    pad = n < L
    seg_row = np.concatenate([np.arange(b), row_of_doc[inner], np.nonzero(pad)[0]])
    seg_pos = np.concatenate([np.zeros(b, np.int64), np.asarray(doc_flat)[inner].astype(np.int64), n[pad]])
    order = np.lexsort((seg_pos, seg_row))
    seg_row, seg_pos = seg_row[order], seg_pos[order]
    keep = np.ones(seg_row.size, dtype=bool)
    keep[1:] = (seg_row[1:] != seg_row[:-1]) | (seg_pos[1:] != seg_pos[:-1])
    seg_row, seg_pos = seg_row[keep], seg_pos[keep]
    counts = np.bincount(seg_row, minlength=b)
    check_segments(int(counts.max(initial=0)), max_segments)
    cu = np.full((b, max_segments + 1), L, dtype=np.int32)
    cu[:, 0] = 0
    # Segment k of a row ends where segment k + 1 starts: cu[row, k + 1] = start of segment k + 1.
    rank_in_row = np.arange(seg_row.size) - np.repeat(np.cumsum(counts) - counts, counts)
    later = rank_in_row > 0
    cu[seg_row[later], rank_in_row[later]] = seg_pos[later]
    return {
        "cu_seqlens": cu,
        "num_segments": counts.astype(np.int32),
        "label_end": label_end(n, doc_counts, doc_flat, seq_len, row_len, mask_cross_document),
    }


def token_fields(
    tokens: np.ndarray, seq_len: int, loss_mask: np.ndarray | None, ignore_index: int | None
) -> dict[str, np.ndarray]:
    """input_ids and labels: views of the gathered rows when they carry the label token."""
    L = seq_len
    input_ids = tokens[:, :L]
    if tokens.shape[1] == L + 1:
        labels = tokens[:, 1:]
    else:
        # Rows packed without the extra label token: the last position has no target.
        labels = np.empty_like(input_ids)
        labels[:, :-1] = tokens[:, 1:]
        labels[:, -1] = 0
    if ignore_index is not None:
        assert loss_mask is not None
        labels = labels.astype(np.int64)
        labels[~loss_mask] = ignore_index
    return {"input_ids": input_ids, "labels": labels}


def check_segments(counts_max: int, max_segments: int) -> None:
    if counts_max > max_segments:
        raise ValueError(
            f"a sample has {counts_max} segments but max_segments={max_segments}; "
            "raise max_segments (cu_seqlens is padded to a fixed length)"
        )


def segments(
    n_tokens: np.ndarray,
    doc_counts: np.ndarray,
    doc_flat: np.ndarray,
    seq_len: int,
    row_len: int,
    max_segments: int,
    mask_cross_document: bool,
    position_dtype: type = np.int32,
) -> dict[str, np.ndarray]:
    """position_ids, cu_seqlens, num_segments and loss_mask of B rows (numpy, vectorized).

    Segments of a row start at 0, at each document start inside [1, seq_len), and at the
    first padding position; position_ids restart at 0 in each segment. A row that continues
    a document from the previous row starts at position 0 too: the offset into that
    document is not stored, and attention cannot see the previous row anyway.
    """
    b, L = len(n_tokens), seq_len
    n_tokens = np.asarray(n_tokens).astype(np.int64)
    # label at p is token p+1, valid while p+1 < n_tokens; without the extra label token
    # the last position has no target.
    label_ok_len = n_tokens - 1 if row_len == L + 1 else np.minimum(n_tokens, L) - 1
    row_of_doc = np.repeat(np.arange(b), doc_counts)

    # Segment starts inside the input window: document starts in [1, L) and the padding start.
    inner = (doc_flat > 0) & (doc_flat < L)
    pad = n_tokens < L
    seg_row = np.concatenate([np.arange(b), row_of_doc[inner], np.nonzero(pad)[0]])
    seg_pos = np.concatenate([np.zeros(b, np.int64), doc_flat[inner].astype(np.int64), n_tokens[pad]])
    order = np.lexsort((seg_pos, seg_row))
    seg_row, seg_pos = seg_row[order], seg_pos[order]
    keep = np.ones(seg_row.size, dtype=bool)  # a doc may start exactly where padding starts
    keep[1:] = (seg_row[1:] != seg_row[:-1]) | (seg_pos[1:] != seg_pos[:-1])
    seg_row, seg_pos = seg_row[keep], seg_pos[keep]
    seg_end = np.append(seg_pos[1:], L)
    last = np.append(seg_row[1:] != seg_row[:-1], True)
    seg_end[last] = L

    counts = np.bincount(seg_row, minlength=b)
    check_segments(int(counts.max(initial=0)), max_segments)
    # position = p - start of its segment. The start is a running maximum over markers
    # placed at segment starts (np.repeat with per-segment counts is ~10x slower).
    start = np.zeros((b, L), dtype=np.int32)
    start[seg_row, seg_pos] = seg_pos
    np.maximum.accumulate(start, axis=1, out=start)
    position_ids = np.subtract(np.arange(L, dtype=np.int32), start, out=start)
    if position_dtype is not np.int32:
        position_ids = position_ids.astype(position_dtype)

    # cu_seqlens per sample: [0, ends of segments..., L, L, ...] with max_segments + 1 entries.
    cu = np.full((b, max_segments + 1), L, dtype=np.int32)
    cu[:, 0] = 0
    rank_in_row = np.arange(seg_row.size) - np.repeat(np.cumsum(counts) - counts, counts)
    cu[seg_row, rank_in_row + 1] = seg_end

    # Loss mask: a label must be a real token; optionally not the first token of a new document.
    loss_mask = np.arange(L)[None, :] < label_ok_len[:, None]
    if mask_cross_document:
        d = doc_flat.astype(np.int64)
        hit = (d >= 1) & (d <= L)
        loss_mask[row_of_doc[hit], d[hit] - 1] = False
    return {"position_ids": position_ids, "cu_seqlens": cu, "num_segments": counts.astype(np.int32), "loss_mask": loss_mask}
