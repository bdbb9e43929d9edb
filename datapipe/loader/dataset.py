"""PackedDataset: the numpy core of the streaming loader (see the package docstring)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from datapipe.errors import EXIT_USAGE, DatapipeError
from datapipe.loader import fused
from datapipe.loader.batch import (
    ALL_FIELDS,
    DEFAULT_FIELDS,
    DENSE_FIELDS,
    POSITION_DTYPES,
    assemble,
    bounds,
    check_segments,
    label_end,
    segments,
    token_fields,
)
from datapipe.loader.gather import ShardTable
from datapipe.loader.order import MixtureOrder, _mix, derive_key, integer_weights, permute
from datapipe.loader.shards import (
    OpenShard,
    default_copy_dir,
    local_copy,
    manifest_fingerprint,
    read_manifest,
    writable_by_others,
)
from datapipe.loader.verify import VERIFY_MODES, Verifier
from datapipe.tokens.shard_format import ShardCorrupt

if TYPE_CHECKING:
    import torch

STATE_VERSION = 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
# Order and address arithmetic run on this many samples at a time. Larger blocks amortize
# refilling the order tables into cache after a block's gathers have flushed it (~1 us a
# batch of 32 x 2048 less at 4096 than at 1024); blocks with segment fields hold
# (samples, seq_len) int32 arrays, so they stay smaller.
_MAX_BLOCK_SAMPLES = 4096
_MAX_SEGMENT_BLOCK_SAMPLES = 1024
_GATHER_BYTES = 1 << 19  # in-process batches are views of token gathers of up to this size


class StateMismatch(DatapipeError, ValueError):
    """A saved loader state does not belong to this dataset; resuming would silently
    change what the model sees, so it is refused."""

    exit_code = EXIT_USAGE


class PackedDataset:
    """Deterministic, mixture-aware, rank- and worker-sharded batches of packed sequences.

    Yields dicts of numpy arrays, one per *local* batch (``batch_size`` samples of this
    rank). With torch installed, ``PackedDataset(...)`` returns the torch adapter (an
    ``IterableDataset``); pass ``backend="numpy"`` to get this class regardless.
    """

    # Returns the torch adapter class (importing torch). Set by the package (loader/__init__.py),
    # which owns both classes: this module never imports the adapter, which subclasses this one.
    torch_class: ClassVar[Callable[[], type[PackedDataset]] | None] = None

    def __new__(cls, *args: object, backend: str = "auto", **kwargs: object) -> PackedDataset:
        # Only a real construction (with arguments) picks the adapter; unpickling calls
        # __new__ with no arguments and must keep the class it was pickled as.
        if (
            cls is PackedDataset
            and (args or kwargs)
            and backend != "numpy"
            and PackedDataset.torch_class is not None
            and _torch_installed()
        ):
            cls = PackedDataset.torch_class()
        return super().__new__(cls)

    def __init__(
        self,
        source: str | os.PathLike[str],
        split: str = "train",
        seq_len: int | None = None,
        batch_size: int = 1,
        mixture: dict[str, float] | None = None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        samples_per_epoch: int | None = None,
        max_segments: int = 64,
        mask_cross_document: bool = False,
        ignore_index: int | None = None,
        cache_dir: str | None = None,
        root: str | None = None,
        max_mixture_period: int = 1 << 15,
        backend: str = "auto",
        fields: tuple[str, ...] = DEFAULT_FIELDS,
        position_dtype: str = "int32",
        max_open_shards: int = 1024,
        verify: str = "full",
        recheck_interval: float = 0.25,
        copy_shards: bool | None = None,
        allow_incomplete: bool = False,
    ) -> None:
        """``verify`` (every shard's structure, sizes, offsets and metadata are always checked
        when it is opened; this picks what happens with its sha256 in the manifest):

        * ``"full"`` (default): hashed in a background thread from first touch. A mismatch
          raises ``ShardCorrupt`` from the iterator at the next batch after it is found, and a
          pass never ends before every shard it read is verified: the iterator waits for
          the hashes and raises then. Batches handed out before the mismatch was found may
          hold bytes of that shard.
        * ``"strict"``: hashed when first opened, before any of its rows is read: no batch
          ever holds a byte of an unverified shard; the first batches wait for their shards'
          hashes (one whole file per shard touched).
        * ``"open"``: not hashed (flipped token bytes, or another shard of the same shape in
          its place, go unnoticed).

        A shard mapped in place that another process writes while it is mapped (truncates it,
        or overwrites it in place) raises ``ShardCorrupt`` at the next gather instead of handing
        out changed bytes or dying of SIGBUS (``verify.ShardWatch``); every epoch (and a resumed
        one) first re-checks each open shard's size, modification and change time.
        ``recheck_interval``: seconds between the size re-checks that do not depend on that
        watch (a read of a truncated map is SIGBUS, see ``gather``); 0 checks before every gather.
        ``copy_shards``: map sha256-verified, read-only copies in ``cache_dir`` (default: the
        ``loader-shards`` folder of datapipe's cache) instead of local shards themselves, which
        nobody else can then change under the map. None (default): copy the shards that users
        other than this process's may write (group- or world-writable files, or another user's),
        map the others in place.

        ``allow_incomplete``: read a run folder whose run.json does not say ``complete`` (a run
        still going, killed, or being run again). Refused by default (``RunIncomplete``): such a
        run's manifest may name shards that are missing or about to be rewritten.

        ``fields``: default every field but ``label_end``; ``batch.COMPACT_FIELDS`` (tokens,
        cu_seqlens, num_segments, label_end: a few int32 per row beyond the tokens) leaves
        position_ids and loss_mask to ``device.expand_segments`` on the GPU, and then
        ``ignore_index`` is applied there too (labels stay in the token dtype here).
        ``position_dtype``: ``"int16"`` halves position_ids when seq_len <= 32768 (widen on
        the device with ``.int()`` or ``.long()``).
        """
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify={verify!r}; allowed: {', '.join(VERIFY_MODES)}")
        self.verify, self.recheck_interval, self.copy_shards = verify, float(recheck_interval), copy_shards
        self._verifier = Verifier()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} not in [0, world_size={world_size})")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.manifest = m = read_manifest(source, split, root, allow_incomplete=allow_incomplete)
        if seq_len is not None and seq_len != m.seq_len:
            raise ValueError(f"seq_len={seq_len} but the shards were packed with seq_len={m.seq_len}")
        if m.row_len not in (m.seq_len, m.seq_len + 1):
            raise ValueError(f"row_len {m.row_len} is neither seq_len nor seq_len + 1")
        self.split, self.seq_len, self.row_len = split, m.seq_len, m.row_len
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.global_batch_size = batch_size * world_size
        self.seed, self.max_segments = int(seed), max_segments
        self.mask_cross_document, self.ignore_index, self.cache_dir = mask_cross_document, ignore_index, cache_dir
        self.backend = backend
        self._choose_fields(fields, position_dtype, ignore_index)
        self.max_open_shards = max_open_shards
        self._number_rows(mixture, max_mixture_period)
        self._size_epoch(samples_per_epoch)
        self._fingerprint()
        self._table: ShardTable | None = None
        self._warm = False  # set once the numba kernels are worth loading (fused.numpy_work)
        self._compat: tuple | None = None
        self.consumed_samples = 0

    def _choose_fields(self, fields: tuple[str, ...], position_dtype: str, ignore_index: int | None) -> None:
        """The fields a batch carries, their position dtype, and which per-token arrays they need."""
        unknown = sorted(set(fields) - set(ALL_FIELDS))
        if unknown or not fields:
            raise ValueError(f"fields {unknown or '()'} not among {ALL_FIELDS}")
        self.fields = tuple(f for f in ALL_FIELDS if f in fields)
        if position_dtype not in POSITION_DTYPES:
            raise ValueError(f"position_dtype={position_dtype!r}; allowed: {', '.join(POSITION_DTYPES)}")
        if position_dtype == "int16" and self.seq_len > 32768:
            raise ValueError(f"position_dtype='int16' holds positions of seq_len <= 32768, not {self.seq_len}")
        self.position_dtype = POSITION_DTYPES[position_dtype]
        # A batch carrying label_end describes its loss mask; ignore_index is then applied
        # by device.expand_segments, otherwise here (it needs the loss mask for labels).
        self._host_ignore = None if "label_end" in self.fields else ignore_index
        # Per-token segment fields cost several times the token copy; the compact ones a few int32 a row.
        self._need_segments = bool(set(self.fields) & set(DENSE_FIELDS)) or self._host_ignore is not None
        self._need_bounds = not self._need_segments and bool(set(self.fields) & {"cu_seqlens", "num_segments", "label_end"})

    def _number_rows(self, mixture: dict[str, float] | None, max_mixture_period: int) -> None:
        """The sources read (all of the split's, or the mixture's, with its integer shares) and their
        rows numbered: per source, its shards in path order, rows back to back."""
        m = self.manifest
        present = sorted(set(m.sources))
        if mixture is not None:
            unknown = sorted(set(mixture) - set(present))
            if unknown:
                raise ValueError(f"mixture names sources {unknown} that split {self.split!r} lacks (has {present})")
            shares = integer_weights(mixture, max_mixture_period)
            self.sources = sorted(shares)
            self.shares = [shares[s] for s in self.sources]
            self.blend: MixtureOrder | None = MixtureOrder(self.shares)
        else:
            self.sources, self.shares, self.blend = present, [], None
        self._shard_ids, self._cum = [], []
        for s in self.sources:
            ids = m.shards_of(s)
            self._shard_ids.append(ids)
            self._cum.append(np.concatenate([[0], np.cumsum(m.rows[ids])]))
        self.source_rows = np.asarray([int(c[-1]) for c in self._cum], dtype=np.int64)
        if np.any(self.source_rows == 0):
            raise ValueError(f"sources without rows: {[s for s, n in zip(self.sources, self.source_rows) if n == 0]}")
        if self.blend is None:  # one virtual source: every row of the split
            self._all_ids = np.concatenate(self._shard_ids)
            self._all_cum = np.concatenate([[0], np.cumsum(m.rows[self._all_ids])])

    def _size_epoch(self, samples_per_epoch: int | None) -> None:
        """An epoch's samples (the split's rows by default), in whole global batches."""
        total = int(self.source_rows.sum())
        n = total if samples_per_epoch is None else int(samples_per_epoch)
        if self.blend is None and n > total:
            raise ValueError(f"samples_per_epoch={n} exceeds the {total} rows of the split; use a mixture to repeat sources")
        self.samples_per_epoch = n // self.global_batch_size * self.global_batch_size
        if self.samples_per_epoch == 0:
            raise ValueError(f"an epoch of {n} samples holds no global batch of {self.global_batch_size}")
        self.batches_per_epoch = self.samples_per_epoch // self.global_batch_size

    def _fingerprint(self) -> None:
        """What a saved state must match to resume (``config``), and the order's keys and tables."""
        m = self.manifest
        self.manifest_fingerprint = manifest_fingerprint(m, self.sources)
        self.config = {
            "split": self.split,
            "seq_len": self.seq_len,
            "row_len": self.row_len,
            "tokenizer_fingerprint": m.tokenizer_fingerprint,
            "seed": self.seed,
            "global_batch_size": self.global_batch_size,
            "samples_per_epoch": self.samples_per_epoch,
            "mixture": dict(zip(self.sources, self.shares)) if self.blend else None,
        }
        self.config_fingerprint = _digest(self.config)
        self._source_keys = np.asarray([derive_key(self.seed, "source", s) for s in self.sources], dtype=np.uint64)
        self._epoch_key = np.uint64(derive_key(self.seed, "epoch"))
        self._order_tables = self._flat_order_tables()

    # ---- order: pure arithmetic ------------------------------------------------------
    def _flat_order_tables(self) -> tuple[np.ndarray, ...]:
        """``locate``'s definitions as flat arrays for the compiled kernel (_kernels._locate):
        per virtual source (the split as a whole without a mixture, else each source) its
        period, rows, base key, Feistel half width, shard row offsets and shard ids."""
        if self.blend is None:
            blend_src, blend_ord, shares = np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(1, np.int64)
            period = np.asarray([self.samples_per_epoch], np.int64)
            n_rows = np.asarray([self._all_cum[-1]], np.int64)
            base_key = np.asarray([self._epoch_key], np.uint64)
            cums, ids = [self._all_cum], [self._all_ids]
        else:
            blend_src, blend_ord, shares = self.blend.src, self.blend.ordinal, self.blend.shares
            period = n_rows = self.source_rows
            base_key, cums, ids = self._source_keys, self._cum, self._shard_ids
        half = np.asarray([max(1, ((int(n) - 1).bit_length() + 1) // 2) for n in n_rows], np.int64)
        # Row -> shard without a full binary search (its mispredicted branches cost ~60 ns a
        # row): rows are cut into buckets of 2**shift rows, at most the mean rows per shard,
        # and bucket b lists the shard holding its first row, so row r lies in a shard between
        # first[b] and first[b + 1]; with shards of similar size that is one or two shards.
        shifts, firsts = [], []
        for c in cums:
            n, shards = int(c[-1]), len(c) - 1
            shift = max(0, (n // shards).bit_length() - 1)
            starts = np.arange(((n - 1) >> shift) + 2, dtype=np.int64) << shift
            firsts.append(np.clip(np.searchsorted(c, starts, side="right") - 1, 0, shards - 1))
            shifts.append(shift)
        return (
            blend_src,
            blend_ord,
            shares,
            period,
            n_rows,
            base_key,
            half,
            np.concatenate(cums).astype(np.int64),
            _offsets(cums),
            np.concatenate(ids).astype(np.int64),
            _offsets(ids),
            np.asarray(shifts, np.int64),
            np.concatenate(firsts).astype(np.int64),
            _offsets(firsts),
        )

    def locate(self, index: np.ndarray, compiled: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Global sample numbers -> (manifest shard id, row within shard); ``compiled=False``
        keeps to numpy (DataLoader workers, see ``iter_batches``)."""
        index = np.asarray(index, dtype=np.int64)
        if self._warm and compiled and (kernel := fused.locate_kernel()) is not None:
            shard, row = np.empty_like(index), np.empty_like(index)
            kernel(index.reshape(-1), *self._order_tables, shard.reshape(-1), row.reshape(-1))
            return shard, row
        # numpy: until numba pays for its load (fused.numpy_work), jobs without numba, and the reference.
        if self.blend is None:
            epoch, pos = np.divmod(index, self.samples_per_epoch)
            keys = _mix(self._epoch_key + epoch.astype(np.uint64) * _GOLDEN)
            row = permute(pos, int(self._all_cum[-1]), keys)
            k = np.searchsorted(self._all_cum, row, side="right") - 1
            return self._all_ids[k], row - self._all_cum[k]
        src, j = self.blend(index)
        shard = np.empty_like(index)
        local = np.empty_like(index)
        for s in np.flatnonzero(np.bincount(src, minlength=len(self.sources))).tolist():  # not np.unique: see gather.pin
            sel = np.nonzero(src == s)[0]
            passes, pos = np.divmod(j[sel], self.source_rows[s])
            # A new permutation for every pass over the source: repeats are reshuffled.
            keys = _mix(self._source_keys[s] + passes.astype(np.uint64) * _GOLDEN)
            row = permute(pos, int(self.source_rows[s]), keys)
            k = np.searchsorted(self._cum[s], row, side="right") - 1
            shard[sel], local[sel] = self._shard_ids[s][k], row - self._cum[s][k]
        return shard, local

    def source_of(self, index: np.ndarray) -> np.ndarray:
        """Source id (index into ``self.sources``) of global samples."""
        if self.blend is not None:
            return self.blend(index)[0]
        shard, _ = self.locate(index)
        names = np.asarray(self.manifest.sources)[shard]
        return np.searchsorted(np.asarray(self.sources), names)

    def mixture_counts(self, num_samples: int) -> dict[str, int]:
        """Samples of each source among the first ``num_samples`` global samples."""
        if self.blend is None:
            raise ValueError("no mixture: sources appear in their natural proportions in a random order")
        return dict(zip(self.sources, self.blend.counts(num_samples).tolist()))

    @property
    def realized_weights(self) -> dict[str, float] | None:
        if self.blend is None:
            return None
        return {s: a / self.blend.period for s, a in zip(self.sources, self.shares)}

    def batch_indices(self, global_batch: int) -> np.ndarray:
        """This rank's global sample numbers in a global batch: a contiguous slice."""
        start = global_batch * self.global_batch_size + self.rank * self.batch_size
        return np.arange(start, start + self.batch_size, dtype=np.int64)

    def plan(self, worker_id: int = 0, num_workers: int = 1, chunk: int = 1) -> range | np.ndarray:
        """Global batch numbers this worker yields in the current pass: from the consumed
        position to the end of its epoch, every num_workers-th, so a round-robin over the
        workers (what torch's DataLoader does, one item per worker in turn) returns them in
        order. With ``chunk`` > 1 (``ds.dataloader``'s workers, whose items are runs of
        batches) each worker's first item is still one batch (the first batch waits for no
        run), and the items after them runs of ``chunk`` consecutive batches, round-robin."""
        b0 = self.consumed_samples // self.global_batch_size
        end = (b0 // self.batches_per_epoch + 1) * self.batches_per_epoch
        if chunk == 1:
            return range(b0 + worker_id, end, num_workers)
        head = np.arange(b0 + worker_id, min(b0 + worker_id + 1, end), dtype=np.int64)
        firsts = np.arange(b0 + num_workers + worker_id * chunk, end, num_workers * chunk, dtype=np.int64)
        runs = (firsts[:, None] + np.arange(chunk, dtype=np.int64)).reshape(-1)
        return np.concatenate([head, runs[runs < end]])

    # ---- reading -------------------------------------------------------------------------
    def _open_shard(self, i: int) -> OpenShard:
        m = self.manifest
        copy = self.copy_shards if self.copy_shards is not None else writable_by_others(m.shard_path(i))
        cache = self.cache_dir or (default_copy_dir() if copy else None)
        path = local_copy(m, i, cache, copy)
        private = cache is not None and Path(path).parent == Path(cache)  # a copy of its own: nobody writes it
        sh = OpenShard(path, m.paths[i], m.row_len, -1 if m.bytes is None else int(m.bytes[i]), private=private)
        self._check(i, sh)
        if self.verify == "strict":
            self._verifier.check(path, sh.identity, m.sha256[i], m.paths[i])
        elif self.verify == "full":
            self._verifier.submit(path, sh.identity, m.sha256[i], m.paths[i])
        return sh

    @property
    def table(self) -> ShardTable:
        if self._table is None:
            # The table reaches back through a weak reference: a bound method would make dataset and
            # table a cycle, and a dropped dataset's maps would stay open until a full collection.
            this = weakref.ref(self)

            def open_shard(i: int) -> OpenShard:
                ds = this()
                assert ds is not None, "shard table used after its dataset was dropped"
                return ds._open_shard(i)

            self._table = ShardTable(len(self.manifest.paths), open_shard, self.max_open_shards, self.recheck_interval)
        return self._table

    def _check(self, i: int, sh: OpenShard) -> None:
        m, meta = self.manifest, sh.meta
        expect = {
            "rows": int(m.rows[i]),
            "tokens": int(m.tokens[i]),
            "seq_len": m.seq_len,
            "row_len": m.row_len,
            "tokenizer_fingerprint": m.tokenizer_fingerprint,
            "source": m.sources[i],
            "split": self.split,
        }
        got = {k: getattr(meta, k) for k in expect}
        if got != expect:
            bad = {k: (got[k], expect[k]) for k in expect if got[k] != expect[k]}
            raise ShardCorrupt(f"shard {m.paths[i]} disagrees with the manifest (shard, manifest): {bad}", m.paths[i])
        key = meta.compatibility_key()
        if self._compat is None:
            self._compat = key
        elif key != self._compat:
            raise ShardCorrupt(f"shard {m.paths[i]} is incompatible with the others: {key} vs {self._compat}", m.paths[i])

    def read(self, shard: np.ndarray, row: np.ndarray) -> dict[str, np.ndarray]:
        """Gather rows one by one and build one batch with numpy: the straightforward
        reference that the block path of ``iter_batches`` must match exactly."""
        b = len(shard)
        sh0 = self.table.shard(int(shard[0]))
        tokens = np.empty((b, self.row_len), dtype=sh0.tokens[0].dtype)
        n_tok = np.empty(b, dtype=np.int64)
        counts = np.empty(b, dtype=np.int64)
        docs = []
        for i, (s, r) in enumerate(zip(shard.tolist(), row.tolist())):
            sh = self.table.shard(s)
            self.table.guard()
            tokens[i] = sh.row(r)
            n_tok[i] = sh.n_tokens[r]
            lo, hi = sh.doc_offsets[r], sh.doc_offsets[r + 1]
            counts[i] = hi - lo
            docs.append(sh.doc_values[lo:hi])
        out = assemble(
            tokens,
            n_tok,
            counts,
            np.concatenate(docs),
            self.seq_len,
            self.max_segments,
            self.mask_cross_document,
            self._host_ignore,
        )
        out["position_ids"] = out["position_ids"].astype(self.position_dtype)
        return {k: out[k] for k in self.fields}

    def _segment_batches(
        self, shard: np.ndarray, row: np.ndarray, copy: bool, compiled: bool = True
    ) -> Callable[[int], dict[str, np.ndarray]]:
        """position_ids, cu_seqlens, num_segments and loss_mask for batch k of a block (whose
        shards must stay pinned while it is used). Row metadata is gathered once per block.
        The numba kernel then writes each batch's fields into fresh arrays, in cache (block-
        wide arrays of 1,024 x seq_len would go through memory and, for workers, be copied
        again); numpy computes them once per block (its per-call cost is paid per block)."""
        B, L = self.batch_size, self.seq_len
        n_tok, counts, docs = self.table.meta(shard, row)
        # Until numba pays for its load (fused.numpy_work), numpy: short jobs never import it.
        kernel = fused.kernel() if self._warm and compiled else None
        ends = label_end(n_tok, counts, docs, L, self.row_len, self.mask_cross_document) if "label_end" in self.fields else None
        if kernel is None:
            block = segments(
                n_tok, counts, docs, L, self.row_len, self.max_segments, self.mask_cross_document, self.position_dtype
            )
            if ends is not None:
                block["label_end"] = ends
            return lambda k: {f: v[k * B : (k + 1) * B].copy() if copy else v[k * B : (k + 1) * B] for f, v in block.items()}
        doc_start = np.concatenate([[0], np.cumsum(counts)])

        def batch(k: int) -> dict[str, np.ndarray]:
            lo, hi = k * B, (k + 1) * B
            out = {
                "position_ids": np.empty((B, L), self.position_dtype),
                "cu_seqlens": np.empty((B, self.max_segments + 1), np.int32),
                "num_segments": np.empty(B, np.int32),
                "loss_mask": np.empty((B, L), np.bool_),
            }
            most = kernel(
                n_tok[lo:hi],
                counts[lo:hi],
                docs[doc_start[lo] : doc_start[hi]],
                L,
                self.row_len - L,
                self.mask_cross_document,
                out["position_ids"],
                out["cu_seqlens"],
                out["num_segments"],
                out["loss_mask"],
            )
            check_segments(most, self.max_segments)
            if ends is not None:
                out["label_end"] = ends[lo:hi].copy()
            return out

        return batch

    def _bounds(self, shard: np.ndarray, row: np.ndarray, compiled: bool = True) -> dict[str, np.ndarray]:
        """cu_seqlens, num_segments and label_end of a block's rows (pinned): the compact
        segment description, compiled after the first block (if ``compiled``), else batch.bounds."""
        kernel = fused.block_bounds_kernel() if self._warm and compiled else None
        if kernel is None:
            n_tok, counts, docs = self.table.meta(shard, row)
            return bounds(n_tok, counts, docs, self.seq_len, self.row_len, self.max_segments, self.mask_cross_document)
        b, t = len(shard), self.table
        out = {
            "cu_seqlens": np.empty((b, self.max_segments + 1), np.int32),
            "num_segments": np.empty(b, np.int32),
            "label_end": np.empty(b, np.int32),
        }
        most = kernel(
            shard,
            row,
            t.slot_of,
            t.meta_addr,
            self.seq_len,
            self.row_len - self.seq_len,
            self.mask_cross_document,
            out["cu_seqlens"],
            out["num_segments"],
            out["label_end"],
        )
        check_segments(most, self.max_segments)
        return out

    def iter_batches(
        self, worker_id: int = 0, num_workers: int = 1, in_process: bool = True, chunk: int = 1
    ) -> Iterator[dict[str, np.ndarray]]:
        """This worker's batches of the current epoch; each carries ``batch_index`` (its
        global batch number). In-process iteration advances ``consumed_samples`` as each
        batch is handed out, so ``state_dict()`` after batch k resumes at batch k + 1.

        Work is done per block of batches: the order, the shard addresses and the row
        metadata in a few vectorized (or compiled) calls per block, so per batch only the
        token gather, the segment fields (when asked for) and a few views remain. In-process
        batches are views of token gathers of up to 512 KiB (one gather call serves several
        batches: its fixed cost, ~2 us of numba dispatch and allocation, counts at 32 x 2048,
        where 256 KiB held one batch a call: tokens-only ratio 0.80 at 256 KiB, 0.89 at 512
        KiB, medians of 15 interleaved repeats in bench/perf/loader.py with 1,000 shards of 16
        rows). Batches that cross a process boundary (``in_process=False``) get compact arrays
        of their own: tokens gathered per batch (no extra copy). There the gather and the
        compact bounds stay in numpy: numba's import costs a worker ~1 s of CPU (a DataLoader
        forks its workers anew each epoch unless persistent), against ~30 us a batch of 8 x
        2048 saved by the gather (~240 us for the per-token segment fields: COMPACT_FIELDS leave them to the
        device). So the first run a worker sends never waits for numba. In-process, the kernels
        take over once this process has spent ``fused.BREAK_EVEN_S`` of CPU in the numpy paths
        (this thread's, the loop's own between batches excluded). ``chunk``: see ``plan``."""
        plan = self.plan(worker_id, num_workers, chunk)
        table, verifier = self.table, self._verifier  # locals: looked up per batch below
        table.check_epoch()  # every epoch, and a resumed one: the open shards are as they were opened
        B, L, G = self.batch_size, self.seq_len, self.global_batch_size
        plain = self.row_len == L + 1 and self._host_ignore is None  # input_ids and labels are views
        token_only = plain and not self._need_segments  # tokens as views, plus compact bounds if asked
        both_tokens = "input_ids" in self.fields and "labels" in self.fields
        pos, block = 0, 1  # first block of one batch: time to first batch stays small
        compiled = in_process  # numba kernels once worth loading, in-process only (see above)
        track = compiled and not self._warm  # this loader's own numpy time, until numba pays for itself
        spent = 0.0
        max_block = self._max_block_batches()
        while pos < len(plan):
            t0 = time.thread_time() if track else 0.0
            batches = plan[pos : pos + block]
            pos += len(batches)
            # This rank's samples of every batch of the block, in one vectorized expression.
            starts = np.asarray(batches, dtype=np.int64) * G + self.rank * B
            shard, row = self.locate((starts[:, None] + np.arange(B, dtype=np.int64)).reshape(-1), compiled)
            rows, lease = table.pin_rows(shard, row, self.row_len, fast=self._warm and compiled)
            try:
                seg = self._segment_batches(shard, row, not in_process, compiled) if self._need_segments else None
                if self._need_bounds:  # a few int32 per row, for the whole block
                    # Each batch's views made in one C loop per field (list() over the first axis
                    # of (batches, B, ...)): a Python slice per field and batch costs ~0.3 us more.
                    compact = [
                        (f, list(v.reshape(len(batches), B, *v.shape[1:])))
                        for f, v in self._bounds(shard, row, compiled).items()
                        if f in self.fields
                    ]
                per = max(1, _GATHER_BYTES // (self.row_len * rows.dtype.itemsize) // B) if in_process else 1
                index = np.asarray(batches, dtype=np.int64)  # indexing it is 5x cheaper than np.int64(g)
                for k, g in enumerate(batches):
                    j = k % per
                    if j == 0:
                        table.guard()  # a shrunk file raises here instead of SIGBUS in the gather
                        tokens = rows.gather(slice(k * B, (k + per) * B))
                        if token_only:  # views of the whole gather; a batch is a first-axis slice of each
                            inputs, labels = tokens[:, :L], tokens[:, 1:]
                    if token_only:
                        if per == 1:
                            out = {"input_ids": inputs, "labels": labels}
                        else:
                            out = {"input_ids": inputs[j * B : (j + 1) * B], "labels": labels[j * B : (j + 1) * B]}
                        if self._need_bounds:
                            if not both_tokens:
                                out = {f: out[f] for f in self.fields if f in out}
                            for f, v in compact:
                                out[f] = v[k] if in_process else v[k].copy()
                    else:
                        if seg is not None:
                            extra = seg(k)
                        elif self._need_bounds:
                            extra = {f: v[k] for f, v in compact}
                        else:
                            extra = {}
                        out = self._assemble(tokens[j * B : (j + 1) * B], extra, plain)
                    out["batch_index"] = index[k]
                    if verifier.failed is not None:  # a background sha256 mismatch: see verify=
                        raise verifier.failed
                    if in_process:
                        self.consumed_samples = (g + 1) * G
                    if track:  # this thread's CPU: not the loop's between batches, nor time preempted on a busy machine
                        spent += time.thread_time() - t0
                        yield out
                        t0 = time.thread_time()
                    else:
                        yield out
            finally:
                lease.release()
            if track and fused.numpy_work(spent):
                self._warm, track = True, False
            spent = 0.0
            block = min(block * 2, max_block)
        self._end_pass(in_process)

    def _max_block_batches(self) -> int:
        """Batches in a block at most: a block's shards must all be open at once, so never more
        samples than open shards, unless every shard fits."""
        most = _MAX_SEGMENT_BLOCK_SAMPLES if self._need_segments else _MAX_BLOCK_SAMPLES
        if len(self.manifest.paths) > self.max_open_shards:
            most = min(most, self.max_open_shards)
        return max(1, most // self.batch_size)

    def _end_pass(self, in_process: bool) -> None:
        """After a worker's last batch of the epoch: a full verification waited for, and a worker's
        position moved to the next epoch."""
        if self.verify == "full":
            self._verifier.wait()  # a pass never ends silently over a shard that fails its sha256
        if not in_process:
            # A persistent worker keeps its own copy: its next pass starts after this epoch.
            G = self.global_batch_size
            end = self.consumed_samples // G // self.batches_per_epoch + 1
            self.consumed_samples = end * self.batches_per_epoch * G

    def _assemble(self, t: np.ndarray, seg: dict[str, np.ndarray], plain: bool) -> dict[str, np.ndarray]:
        """One batch's requested fields from its gathered token rows and its segment fields."""
        L = self.seq_len
        if plain:
            out = {"input_ids": t[:, :L], "labels": t[:, 1:]}
        else:
            out = token_fields(t, L, seg.get("loss_mask"), self._host_ignore)
        return {f: seg[f] if f in seg else out[f] for f in self.fields}

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self.iter_batches()

    def expand_segments(self, batch: dict, device: torch.device | str | None = None) -> dict:
        """``device.expand_segments`` with this dataset's mask_cross_document and ignore_index
        (needs torch): position_ids and loss_mask of a ``COMPACT_FIELDS`` batch, on ``device``."""
        import torch

        from datapipe.loader.device import expand_segments

        return expand_segments(
            batch,
            device,
            self.mask_cross_document,
            self.ignore_index,
            torch.int16 if self.position_dtype is np.int16 else torch.int32,
        )

    def __len__(self) -> int:
        """Batches per epoch for each rank (the same on every rank)."""
        return self.batches_per_epoch

    # ---- state ---------------------------------------------------------------------------
    def mark_consumed(self, batch: dict) -> None:
        """Record that the training loop received ``batch`` (for loops fed by other processes)."""
        self.consumed_samples = (int(batch["batch_index"]) + 1) * self.global_batch_size

    def state_dict(self) -> dict:
        return {
            "version": STATE_VERSION,
            "consumed_samples": int(self.consumed_samples),
            "manifest_fingerprint": self.manifest_fingerprint,
            "config_fingerprint": self.config_fingerprint,
            "config": dict(self.config),
            "sources": list(self.sources),  # what the manifest fingerprint covers
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != STATE_VERSION:
            raise StateMismatch(f"loader state version {state.get('version')} != {STATE_VERSION}")
        old_config = state.get("config", {})
        # The fingerprint covers the shards of the sources read: a mixture over other sources
        # changes it too, and "the shards changed" would send the user looking at the run.
        # (A state saved before "sources" was recorded names them only through its mixture.)
        saved = state.get("sources") or (sorted(old_config["mixture"]) if old_config.get("mixture") else None)
        if saved is not None and sorted(saved) != self.sources:
            raise StateMismatch(
                f"the mixture changed since this state was saved: it read sources {sorted(saved)} "
                f"({_mixture_words(old_config.get('mixture'))}), this loader reads {self.sources} "
                f"({_mixture_words(self.config['mixture'])}); resuming would not continue the same order"
            )
        if state["manifest_fingerprint"] != self.manifest_fingerprint:
            raise StateMismatch(
                "the shards changed since this state was saved (manifest fingerprint "
                f"{state['manifest_fingerprint']} != {self.manifest_fingerprint}); resuming "
                "would not continue the same order"
            )
        if state["config_fingerprint"] != self.config_fingerprint:
            diff = {k: (old_config.get(k), v) for k, v in self.config.items() if old_config.get(k) != v}
            raise StateMismatch(f"loader configuration changed since the state was saved (saved, now): {diff}")
        consumed = int(state["consumed_samples"])
        if consumed % self.global_batch_size:
            raise StateMismatch(f"consumed_samples={consumed} is not a multiple of the global batch")
        self.consumed_samples = consumed

    def __getstate__(self) -> dict:
        # Memory maps do not pickle; worker processes reopen shards on first touch.
        return {**self.__dict__, "_table": None}


def _mixture_words(mixture: object) -> str:
    return f"mixture {mixture}" if mixture else "no mixture: every source of the split"


def _offsets(parts: list[np.ndarray]) -> np.ndarray:
    """Where each part starts (and the last ends) when the parts are concatenated."""
    return np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:32]


def _torch_installed() -> bool:
    return importlib.util.find_spec("torch") is not None
