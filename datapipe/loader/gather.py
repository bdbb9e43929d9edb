"""Vectorized row gathers across many memory-mapped shards, without a Python loop per row.

The loader's order is a global permutation, so a batch's rows come from as many shards as
it has rows; grouping by shard saves nothing. Instead every open shard registers the
addresses of its buffers in flat tables, one slot per open shard, and a block of samples
turns into element indices relative to the lowest address involved. A strided view over
that address range (row k = the ``width`` elements starting at element k) then serves the
whole gather with one fancy index: numpy copies each selected row, exactly as a fancy index
into a single memmap does, and never touches the unmapped gaps between shards. (Not
``np.take``: it first makes its input contiguous, i.e. would read the whole range.) When
numba is there, a compiled loop copies the same rows with one memcpy each instead
(``fused.gather_kernel``), without numpy's per-row set-up.

Safety rests on two rules kept here: an index is only ever formed from a registered row
start (so every byte read lies inside a live mapping), and a block holds a ``Lease`` until
its gathers are done: a shard evicted while an older lease is held is kept referenced (its
map stays open) until that lease is released, so eviction cannot unmap a block's rows even
when another iterator over the same dataset evicts them. (A lease costs O(1); holding
references to a block's shards cost a cache miss per shard refcount, ~5% of a batch.)
The span views never leave this module; callers get the copies the fancy index makes.

A third rule guards the maps themselves: a mapped file that shrinks turns a read of its lost
tail into SIGBUS, and one overwritten in place hands out other bytes than were verified.
``guard`` polls the process's ``verify.WATCH`` before every gather (one poll(2): a write or
truncation of a mapped shard by another process, once done, is seen there) and re-checks
every open shard's size (one fstat each) at most once per ``recheck_s`` (a check of 1,000
shards costs ~1 ms), and raises ``ShardCorrupt`` instead. A file truncated while the gather
itself reads it can still kill the process: no check in user space can close that window for
a shared map (``copy_shards`` maps a private copy; see docs/loader.md).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import numpy as np

from datapipe.loader import fused
from datapipe.loader.shards import OpenShard
from datapipe.loader.verify import WATCH
from datapipe.tokens.shard_format import ShardCorrupt


class _Interface:
    """Carrier of an ``__array_interface__`` (numpy reads the attribute from instances)."""

    __slots__ = ("__array_interface__",)

    def __init__(self, iface: dict) -> None:
        self.__array_interface__ = iface


def span_view(base: int, rows: int, width: int, dtype: np.dtype) -> np.ndarray:
    """Read-only (rows, width) view whose row k is the width elements at base + k*itemsize."""
    size = dtype.itemsize
    return np.asarray(
        _Interface({"data": (base, True), "shape": (rows, width), "typestr": dtype.str, "strides": (size, size), "version": 3})
    )


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class RowView:
    """Rows of ``width`` elements at ``low + elem * itemsize``, gatherable in one call: the
    compiled memcpy gather when ``fast`` and numba is there, else one numpy fancy index."""

    def __init__(self, elem: np.ndarray, low: int, width: int, dtype: np.dtype, fast: bool = False) -> None:
        self.elem, self.low, self.width, self.dtype = elem, low, width, dtype
        self.kernel = fused.gather_kernel() if fast else None
        self._view: np.ndarray | None = None

    @classmethod
    def at(cls, addr: np.ndarray, width: int, dtype: np.dtype, fast: bool = False) -> RowView:
        """Rows starting at the given addresses."""
        low = int(addr.min()) if addr.size else 0
        return cls((addr - low) // dtype.itemsize, low, width, dtype, fast)

    def gather(self, sl: slice = slice(None)) -> np.ndarray:
        elem = self.elem[sl]
        if self.kernel is not None:
            out = np.empty((len(elem), self.width), self.dtype)
            self.kernel(self.low, elem, self.dtype.itemsize, out)
            return out
        if not len(elem):
            return np.empty((0, self.width), self.dtype)
        if self._view is None:  # one view per block: building it costs ~5 us
            self._view = span_view(self.low, int(self.elem.max()) + 1, self.width, self.dtype)
        return self._view[elem]  # fancy indexing reads through the strides; np.take would copy the whole view


def gather(addr: np.ndarray, width: int, dtype: np.dtype) -> np.ndarray:
    """Copy ``width`` elements starting at each address: (len(addr), width)."""
    return RowView.at(addr, width, dtype).gather()


class Lease:
    """Held by a block while it gathers; see the module docstring."""

    __slots__ = ("table", "tick")

    def __init__(self, table: ShardTable, tick: int) -> None:
        self.table: ShardTable | None = table
        self.tick = tick

    def release(self) -> None:
        if self.table is not None:
            self.table._release(self.tick)
            self.table = None

    def __del__(self) -> None:  # a generator dropped mid-block still releases its lease
        self.release()


DEEP_CHECK_EVERY = 100  # check_epoch's share of the time: at most 1%


class ShardTable:
    """Open shards in numbered slots (least recently used evicted past ``max_open``, which
    bounds file descriptors and maps) plus flat address tables that make ``locate``'s output
    (manifest shard id, row) gatherable in a handful of numpy calls per block."""

    def __init__(self, n_shards: int, opener: Callable[[int], OpenShard], max_open: int, recheck_s: float = 0.25) -> None:
        if max_open < 1:
            raise ValueError("max_open_shards must be >= 1")
        self.opener, self.max_open, self.tick = opener, max_open, 0
        self.recheck_s, self._next_check = recheck_s, 0.0
        self._changes_seen = 0  # len(WATCH.changed) when this table last looked (another table's files count there too)
        self._deep_due = 0.0  # when check_epoch may stat every open shard's path again
        self.slot_of = np.full(n_shards, -1, dtype=np.int64)  # manifest shard id -> slot
        # Per slot: the shard, its manifest id, when it was last used (the block tick), where
        # its chunk addresses start in chunk_addr and how many there are, rows per chunk, and
        # the addresses of its n_tokens, doc_offsets, doc_values.
        self.objs = np.empty(0, dtype=object)
        self.shard_id = np.zeros(0, np.int64)
        self.last_used = np.zeros(0, np.int64)
        self.chunk_off = np.zeros(0, np.int64)
        self.chunk_n = np.zeros(0, np.int64)
        self.chunk_rows = np.ones(0, np.int64)
        self.meta_addr = np.zeros((0, 3), np.int64)
        self.chunk_addr = np.zeros(0, np.int64)
        self.row_bytes = 0
        self.dtype: np.dtype | None = None
        self.leases: Counter[int] = Counter()  # block tick -> leases held
        self.retired: list[tuple[int, OpenShard]] = []  # (tick evicted at, shard) kept for older leases

    def guard(self) -> None:
        """Before reading mapped tokens: a write to a mapped shard seen by ``WATCH`` (every time),
        ``check_files`` when ``recheck_s`` has passed since the last one."""
        if WATCH.poll() and len(WATCH.changed) != self._changes_seen:  # a mapped file was written: one of ours?
            self._changes_seen = len(WATCH.changed)
            self.check_files()
        now = time.monotonic()
        if now >= self._next_check:
            self.check_files()
            self._next_check = now + self.recheck_s

    def check_files(self, deep: bool = False) -> None:
        """Raise ShardCorrupt naming the first mapped shard whose file shrank (a read of its tail
        would SIGBUS) or was written since it was opened (``OpenShard.damage``; ``deep``: a stat
        of each path too)."""
        for sh in [*self.objs, *(sh for _, sh in self.retired)]:
            if sh is not None and (why := sh.damage(deep)) is not None:
                raise ShardCorrupt(f"shard {sh.name}: {why}", sh.name)

    check_sizes = check_files  # the name callers knew

    def check_epoch(self) -> None:
        """At the start of an epoch (a resumed one too): ``check_files(deep=True)``, unless the last
        such check was so recent that this one would take more than 1/``DEEP_CHECK_EVERY`` of the
        time since (a stat of 1,024 shards' paths took ~12 ms on the loaded 2-core box, against
        ~20 ms for a whole epoch of bench/loader.py's many-small-shards layout)."""
        now = time.monotonic()
        if now >= self._deep_due:
            self.check_files(deep=True)
            self._deep_due = now + DEEP_CHECK_EVERY * (time.monotonic() - now)

    def shard(self, i: int) -> OpenShard:
        """Open shard i (used by the row-by-row reference path; the caller's reference keeps it open)."""
        self.pin(np.asarray([i], np.int64))
        return self.objs[self.slot_of[i]]

    def pin(self, shard: np.ndarray) -> None:
        """Open every shard of a block and mark them used by it (never evicted for it)."""
        self.tick += 1
        slot = self.slot_of[shard]
        self.last_used[slot[slot >= 0]] = self.tick
        missing = shard[slot < 0]
        if missing.size:
            for i in sorted(set(missing.tolist())):  # not np.unique: its first call imports numpy.ma (~0.1-0.4 s)
                self._register(i, self.opener(i))

    def lease(self) -> Lease:
        """A lease for the block pinned last: see the module docstring."""
        self.leases[self.tick] += 1
        return Lease(self, self.tick)

    def _release(self, tick: int) -> None:
        self.leases[tick] -= 1
        if not self.leases[tick]:
            del self.leases[tick]
        self._drop_retired()

    def _drop_retired(self) -> None:
        # A shard evicted at tick T may be read by blocks leased before T only.
        if self.retired:
            oldest = min(self.leases, default=self.tick + 1)
            self.retired = [(t, sh) for t, sh in self.retired if oldest < t]

    def _take_slot(self) -> int:
        if len(self.objs) < self.max_open:
            for name in ("shard_id", "last_used", "chunk_off", "chunk_n", "chunk_rows"):
                setattr(self, name, np.append(getattr(self, name), 0))
            self.objs = np.append(self.objs, np.array([None], dtype=object))  # one more slot, empty
            self.meta_addr = np.vstack([self.meta_addr, np.zeros((1, 3), np.int64)])
            return len(self.objs) - 1
        slot = int(np.argmin(self.last_used))
        if self.last_used[slot] == self.tick:
            raise ValueError(f"a block touches more than max_open_shards={self.max_open} shards")
        self.slot_of[self.shard_id[slot]] = -1
        self.retired.append((self.tick, self.objs[slot]))
        self.objs[slot] = None
        self._drop_retired()  # the map closes here unless an older block still reads it
        return slot

    def _register(self, i: int, sh: OpenShard) -> None:
        if self.dtype is None:
            self.dtype, self.row_bytes = sh.tokens[0].dtype, sh.row_len * sh.tokens[0].dtype.itemsize
        slot = self._take_slot()
        sizes = [len(t) for t in sh.tokens]
        if len(sizes) == 1 or (len(set(sizes[:-1])) == 1 and sizes[-1] <= sizes[0]):
            # Chunks of equal rows (what write_shard produces): row r is in chunk r // rows.
            rows, addrs = max(sizes[0], 1), np.asarray([_address(t) for t in sh.tokens], np.int64)
        else:  # irregular chunks: one address per row (8 bytes per row of this shard)
            rows = 1
            addrs = np.concatenate([_address(t) + np.arange(len(t), dtype=np.int64) * self.row_bytes for t in sh.tokens])
        if len(self.chunk_addr) > 2 * int(self.chunk_n.sum()) + 4096:  # drop evicted shards' entries
            self._compact()
        self.objs[slot], self.shard_id[slot], self.last_used[slot] = sh, i, self.tick
        self.chunk_off[slot], self.chunk_n[slot], self.chunk_rows[slot] = len(self.chunk_addr), len(addrs), rows
        self.chunk_addr = np.append(self.chunk_addr, addrs)
        self.meta_addr[slot] = (_address(sh.n_tokens), _address(sh.doc_offsets), _address(sh.doc_values))
        self.slot_of[i] = slot

    def _compact(self) -> None:
        live = np.nonzero(self.objs != None)[0]  # noqa: E711 - elementwise on an object array
        parts = [self.chunk_addr[self.chunk_off[s] : self.chunk_off[s] + self.chunk_n[s]] for s in live.tolist()]
        self.chunk_n[self.objs == None] = 0  # noqa: E711
        self.chunk_off[live] = np.cumsum(self.chunk_n[live]) - self.chunk_n[live]
        self.chunk_addr = np.concatenate(parts) if parts else np.zeros(0, np.int64)

    # ---- gathers (shards must be pinned) ---------------------------------------------------
    def token_addresses(self, shard: np.ndarray, row: np.ndarray) -> np.ndarray:
        slot = self.slot_of[shard]
        rows = self.chunk_rows[slot]
        chunk, within = np.divmod(row, rows)
        return self.chunk_addr[self.chunk_off[slot] + chunk] + within * self.row_bytes

    def row_view(self, addr: np.ndarray, row_len: int, fast: bool = False) -> RowView:
        assert self.dtype is not None
        return RowView.at(addr, row_len, self.dtype, fast)

    def pin_rows(self, shard: np.ndarray, row: np.ndarray, row_len: int, fast: bool) -> tuple[RowView, Lease]:
        """``pin`` + ``lease`` + ``token_addresses`` + ``row_view`` for a block; with ``fast``,
        in one compiled pass when every shard of the block is open (the steady state)."""
        kernel = fused.address_kernel() if fast else None
        if kernel is not None and self.dtype is not None:
            self.tick += 1
            elem = np.empty(len(shard), np.int64)
            missing, low = kernel(
                shard,
                row,
                self.slot_of,
                self.chunk_off,
                self.chunk_rows,
                self.chunk_addr,
                self.row_bytes,
                self.dtype.itemsize,
                self.last_used,
                self.tick,
                elem,
            )
            if not missing:
                return RowView(elem, int(low), row_len, self.dtype, fast), self.lease()
        self.pin(shard)
        return self.row_view(self.token_addresses(shard, row), row_len, fast), self.lease()

    def meta(self, shard: np.ndarray, row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(n_tokens, document-start counts, document starts back to back) of each row."""
        slot = self.slot_of[shard]
        n_tok = gather(self.meta_addr[slot, 0] + row * 4, 1, np.dtype(np.int32))[:, 0].astype(np.int64)
        bounds = gather(self.meta_addr[slot, 1] + row * 8, 2, np.dtype(np.int64))  # doc_offsets[r:r+2]
        counts = bounds[:, 1] - bounds[:, 0]
        total = int(counts.sum())
        if total == 0:
            return n_tok, counts, np.zeros(0, np.int32)
        first = self.meta_addr[slot, 2] + bounds[:, 0] * 4
        # Address of each document start: its row's first one plus its rank within the row.
        rank = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        docs = gather(np.repeat(first, counts) + rank * 4, 1, np.dtype(np.int32))[:, 0]
        return n_tok, counts, docs
