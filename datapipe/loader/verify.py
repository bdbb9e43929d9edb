"""Shard verification: structural checks at open, sha256 against the manifest off the hot path.

The loader's fast path reads token rows by raw address (``gather``) and the segment kernels
index arrays with values read from the shard, without bounds checks. So before a shard is
registered, ``shard_arrays`` proves every fact those reads rely on, with vectorized numpy
over the shard's own buffers (never through a pyarrow view built from unchecked offsets:
``ListArray.flatten`` trusts the offsets and would hand numpy memory past the buffer):

* schema: the three columns with their exact types, token dtype = ``meta.dtype``, row_len;
* buffers: each column's buffers hold what its length needs, and every token buffer lies
  inside the mapped file (a compressed or otherwise relocated buffer would not);
* ``doc_starts`` offsets start >= 0, never decrease, end within the values; values in
  [0, row_len) and sorted within each row; ``n_tokens`` in [0, row_len];
* counts: rows and tokens agree between the arrays, the shard metadata and the manifest.

n_tokens, doc offsets and doc values are copied (a few bytes per row against row_len
tokens), so what was checked cannot change under the kernels, and a file truncated later
cannot fault their reads; only token rows stay zero-copy views of the map.

``Verifier`` hashes whole files against the manifest's sha256, in a background thread by
default (see ``PackedDataset``'s ``verify`` for when a mismatch surfaces).

``ShardWatch`` tells when another process writes a shard this process has mapped (truncates it,
or overwrites it in place) after it was opened, which the sha256 taken at first touch cannot:
Linux's inotify queues an event per write, and one ``poll`` before each gather (~2 us, whatever
the number of open shards) sees it, so the loader raises ``ShardCorrupt`` instead of reading
the changed bytes (or SIGBUS, reading a truncated map).
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import select
import sys
import threading
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from datapipe.tokens.shard_format import ShardCorrupt, ShardMeta

VERIFY_MODES = ("full", "strict", "open")


@dataclass
class ShardArrays:
    tokens: list[np.ndarray]  # (rows, row_len) per record batch, views of the map
    n_tokens: np.ndarray  # int32, copied
    doc_offsets: np.ndarray  # int64 (rows + 1,), copied
    doc_values: np.ndarray  # int32, copied


def _buffer_array(buf: pa.Buffer | None, dtype: np.dtype, start: int, count: int, what: str, name: str) -> np.ndarray:
    """``count`` elements from element ``start`` of an Arrow buffer, after checking it holds them."""
    need = (start + count) * dtype.itemsize
    if count < 0 or start < 0 or (count and (buf is None or buf.size < need)):
        have = 0 if buf is None else buf.size
        raise ShardCorrupt(f"shard {name}: {what} needs {need} bytes but its buffer holds {have}", name)
    if not count:
        return np.zeros(0, dtype)
    assert buf is not None  # count > 0: checked above
    return np.frombuffer(buf, dtype=dtype, count=count, offset=start * dtype.itemsize)


def _no_nulls(chunk: pa.Array, what: str, name: str) -> None:
    if chunk.null_count:
        raise ShardCorrupt(f"shard {name}: {what} has {chunk.null_count} nulls", name)


def shard_arrays(table: pa.Table, meta: ShardMeta, name: str, row_len: int, base: int, size: int) -> ShardArrays:
    """Check a shard's arrays (see the module docstring) and return them; raises ShardCorrupt.

    ``base``/``size``: address and length of the mapped file that must contain every token row.
    """
    dtype = np.dtype(meta.dtype) if meta.dtype in ("uint16", "uint32") else None
    if dtype is None:
        raise ShardCorrupt(f"shard {name}: token dtype {meta.dtype!r} is not uint16 or uint32", name)
    _check_schema(table, dtype, meta, name, row_len)
    tokens = _token_rows(table, dtype, name, row_len, base, size)
    n_parts = []
    for chunk in table.column("n_tokens").chunks:
        _no_nulls(chunk, "n_tokens", name)
        n_parts.append(_buffer_array(chunk.buffers()[1], np.dtype(np.int32), chunk.offset, len(chunk), "n_tokens", name))
    n_tokens = np.concatenate(n_parts) if n_parts else np.zeros(0, np.int32)  # a copy, always
    doc_offsets, doc_values = _doc_starts(table, name)
    _check_values(sum(len(t) for t in tokens), n_tokens, doc_offsets, doc_values, meta, name, row_len)
    try:  # Arrow's own O(columns) checks as a backstop (buffer sizes against lengths, list ends)
        table.validate()
    except (pa.ArrowException, ValueError) as exc:
        raise ShardCorrupt(f"shard {name}: invalid Arrow data ({exc})", name) from None
    total = int(n_tokens.sum(dtype=np.int64))
    if total != meta.tokens:
        raise ShardCorrupt(f"shard {name}: n_tokens sum to {total} but the metadata says {meta.tokens}", name)
    return ShardArrays(tokens, n_tokens, doc_offsets, doc_values)


def _check_schema(table: pa.Table, dtype: np.dtype, meta: ShardMeta, name: str, row_len: int) -> None:
    expect = {
        "input_ids": pa.list_(pa.field("item", pa.from_numpy_dtype(dtype), nullable=False), row_len),
        "doc_starts": pa.list_(pa.field("item", pa.int32(), nullable=False)),
        "n_tokens": pa.int32(),
    }
    got = {f.name: f.type for f in table.schema}
    for col, typ in expect.items():
        if col not in got:
            raise ShardCorrupt(f"shard {name}: column {col} is missing (has {sorted(got)})", name)
        # Field names and nullability inside the list type do not matter to the reads; the
        # value type and row_len do.
        if not (
            got[col] == typ
            or (
                pa.types.is_list(typ)
                and type(got[col]) is type(typ)
                and got[col].value_type == typ.value_type
                and getattr(got[col], "list_size", None) == getattr(typ, "list_size", None)
            )
        ):
            raise ShardCorrupt(
                f"shard {name}: column {col} has type {got[col]}, expected {typ} (dtype {meta.dtype}, row_len {row_len})", name
            )


def _token_rows(table: pa.Table, dtype: np.dtype, name: str, row_len: int, base: int, size: int) -> list[np.ndarray]:
    """Each chunk's token rows, as views of the mapped file (each checked to lie inside it)."""
    tokens: list[np.ndarray] = []
    for chunk in table.column("input_ids").chunks:
        _no_nulls(chunk, "input_ids", name)
        child = chunk.values  # the whole child array: chunk.offset counts rows into it
        _no_nulls(child, "input_ids values", name)
        flat = _buffer_array(
            child.buffers()[1], dtype, child.offset + chunk.offset * row_len, len(chunk) * row_len, "input_ids", name
        )
        if len(child) < (chunk.offset + len(chunk)) * row_len:
            raise ShardCorrupt(
                f"shard {name}: input_ids holds {len(child)} tokens, fewer than its {len(chunk)} rows of {row_len}", name
            )
        if flat.size:
            lo = flat.__array_interface__["data"][0]
            if lo < base or lo + flat.nbytes > base + size:
                raise ShardCorrupt(
                    f"shard {name}: token buffer [{lo - base}, {lo - base + flat.nbytes}) lies outside "
                    f"the {size}-byte file (compressed or corrupt)",
                    name,
                )
        tokens.append(flat.reshape(-1, row_len))
    return tokens


def _doc_starts(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Every row's document starts: (offsets per row, one past the last; values), copies."""
    offs, vals, base_off = [], [], 0
    for chunk in table.column("doc_starts").chunks:
        _no_nulls(chunk, "doc_starts", name)
        o = _buffer_array(chunk.buffers()[1], np.dtype(np.int32), chunk.offset, len(chunk) + 1, "doc_starts offsets", name)
        child = chunk.values
        _no_nulls(child, "doc_starts values", name)
        v = _buffer_array(child.buffers()[1], np.dtype(np.int32), child.offset, len(child), "doc_starts values", name)
        if o[0] < 0 or o[-1] > len(v) or np.any(np.diff(o) < 0):
            bad = int(np.argmax(np.diff(o) < 0)) if np.any(np.diff(o) < 0) else None
            where = f"decrease after row {bad}" if bad is not None else f"span [{o[0]}, {o[-1]}]"
            raise ShardCorrupt(
                f"shard {name}: doc_starts offsets out of bounds or not monotonic ({where}; {len(v)} values)", name
            )
        offs.append(o[:-1].astype(np.int64) - o[0] + base_off)
        vals.append(v[o[0] : o[-1]])
        base_off += int(o[-1] - o[0])
    doc_offsets = np.concatenate(offs + [np.asarray([base_off], np.int64)])
    doc_values = np.concatenate(vals) if vals else np.zeros(0, np.int32)  # a copy, always
    return doc_offsets, doc_values


def _check_values(
    rows: int, n_tokens: np.ndarray, doc_offsets: np.ndarray, doc_values: np.ndarray, meta: ShardMeta, name: str, row_len: int
) -> None:
    """Row counts that agree, token counts and document starts inside a row, starts sorted per row."""
    if not (rows == len(n_tokens) == len(doc_offsets) - 1 == meta.rows):
        raise ShardCorrupt(
            f"shard {name}: row counts disagree (input_ids {rows}, n_tokens {len(n_tokens)}, "
            f"doc_starts {len(doc_offsets) - 1}, metadata {meta.rows})",
            name,
        )
    if n_tokens.size and (int(n_tokens.min()) < 0 or int(n_tokens.max()) > row_len):
        r = int(np.argmax((n_tokens < 0) | (n_tokens > row_len)))
        raise ShardCorrupt(f"shard {name}: n_tokens[{r}] = {int(n_tokens[r])} is outside [0, {row_len}]", name)
    if doc_values.size:
        if int(doc_values.min()) < 0 or int(doc_values.max()) >= row_len:
            k = int(np.argmax((doc_values < 0) | (doc_values >= row_len)))
            r = int(np.searchsorted(doc_offsets, k, side="right")) - 1
            raise ShardCorrupt(f"shard {name}: doc_starts value {int(doc_values[k])} in row {r} is outside [0, {row_len})", name)
        # Sorted within each row: a decrease is only allowed where a new row begins.
        row_start = np.zeros(doc_values.size + 1, np.bool_)
        row_start[doc_offsets] = True
        unsorted = (doc_values[1:] < doc_values[:-1]) & ~row_start[1:-1]
        if unsorted.any():
            k = int(np.argmax(unsorted)) + 1
            r = int(np.searchsorted(doc_offsets, k, side="right")) - 1
            raise ShardCorrupt(f"shard {name}: doc_starts of row {r} are not sorted", name)


Identity = tuple[int, int, int, int, int]


def file_identity(st: os.stat_result) -> Identity:
    """(device, inode, size, mtime, ctime): one version of one file. The kernel sets ctime on every
    write, truncation or rename of a file and no user can set it back, so a file rewritten in place
    with its size kept is another identity too."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def hash_file(path: str, identity: Identity | None, expect: str, name: str) -> None:
    """sha256 of the file read with plain reads (a file that shrinks gives a short read,
    never SIGBUS); raises ShardCorrupt on any difference. ``identity`` (device, inode, size)
    is the mapped file's: hashing another file under the same name would prove nothing."""
    with open(path, "rb", buffering=0) as f:
        st = os.fstat(f.fileno())
        if identity is not None and file_identity(st) != identity:
            _, ino, size, _, _ = identity
            raise ShardCorrupt(
                f"shard {name}: the file changed on disk after it was opened ({size} -> {st.st_size} "
                f"bytes, inode {ino} -> {st.st_ino}, or written in place)",
                name,
            )
        h, buf = hashlib.sha256(), bytearray(1 << 20)
        view, n = memoryview(buf), 0
        while k := f.readinto(buf):
            h.update(view[:k])  # releases the GIL for blocks this large
            n += k
    if identity is not None and n != identity[2]:
        raise ShardCorrupt(f"shard {name}: truncated to {n} bytes while being verified ({identity[2]} at open)", name)
    if h.hexdigest() != expect:
        raise ShardCorrupt(
            f"shard {name}: sha256 {h.hexdigest()} does not match the manifest's {expect} "
            "(bytes changed, or another shard in its place)",
            name,
        )


class Verifier:
    """Checks shard files against the manifest's sha256 in one background thread.

    ``submit`` queues a shard (once per file identity); ``failed`` holds the first mismatch,
    which the iterator raises at its next batch; ``wait`` blocks until every queued shard
    is checked. After a fork (DataLoader workers) the thread does not exist in the child:
    the first call there starts a new one and requeues what the parent had not finished.
    """

    def __init__(self) -> None:
        self.failed: ShardCorrupt | None = None
        self._done: set[tuple] = set()
        self._queued: dict[tuple, tuple[str, str, str]] = {}
        self._pid = -1
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._todo: deque[tuple] = deque(self._queued)  # after a fork: what the parent left unfinished
        self._thread: threading.Thread | None = None

    def _ensure(self) -> None:
        if self._pid != os.getpid():
            self._reset()
        with self._lock:
            if self._todo and self._thread is None:
                self._thread = threading.Thread(target=self._run, name="datapipe-shard-sha256", daemon=True)
                self._thread.start()

    def submit(self, path: str, identity: Identity, expect: str, name: str) -> None:
        key = (path, identity, expect)
        if self._pid != os.getpid():
            self._reset()
        with self._lock:
            if key in self._done or key in self._queued:
                return
            self._queued[key] = (path, expect, name)
            self._todo.append(key)
        self._ensure()

    def check(self, path: str, identity: Identity, expect: str, name: str) -> None:
        """Verify now, in this thread (``verify="strict"``); remembered like background checks."""
        key = (path, identity, expect)
        if key not in self._done:
            try:
                hash_file(path, identity, expect, name)
            except OSError as exc:
                raise ShardCorrupt(f"shard {name}: cannot be read for verification ({exc})", name) from None
            self._done.add(key)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._todo:
                    self._thread = None
                    self._idle.notify_all()
                    return
                key = self._todo.popleft()
            path, expect, name = self._queued[key]
            try:
                hash_file(path, key[1], expect, name)
            except ShardCorrupt as exc:
                self.failed = self.failed or exc
            except OSError as exc:
                self.failed = self.failed or ShardCorrupt(f"shard {name}: cannot be read for verification ({exc})", name)
            with self._lock:
                self._done.add(key)
                del self._queued[key]

    def wait(self) -> None:
        """Block until every queued shard is verified; raise the first mismatch."""
        self._ensure()
        with self._lock:
            while self._queued:
                if self._thread is None:  # nothing runs them (cannot happen after _ensure; never hang)
                    break
                self._idle.wait(timeout=1.0)
        if self.failed is not None:
            raise self.failed

    def __getstate__(self) -> dict:
        # Locks and threads do not pickle; a pickled copy (spawned worker) starts afresh.
        return {"failed": self.failed, "_done": set(self._done), "_queued": dict(self._queued), "_pid": -1}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()


# inotify (linux/inotify.h): a file's data written (write, truncate); the flags of inotify_init1.
IN_MODIFY = 0x00000002
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, getattr(os, "O_CLOEXEC", 0)
_EVENT_HEADER = 16  # struct inotify_event: wd, mask, cookie, len (then len bytes of name)


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1, libc.inotify_add_watch, libc.inotify_rm_watch  # noqa: B018 - present?
    except (OSError, AttributeError):
        return None
    return libc


class ShardWatch:
    """Which of the files this process has mapped another process wrote since they were opened.

    One inotify instance per process (the kernel allows a user 128), a watch per mapped shard,
    for ``IN_MODIFY``: every ``write`` and truncation of the file queues an event, which ``poll``
    (one ``poll(2)`` of the instance, ~1.5 us on a loaded box whatever the number of shards) turns
    into ``changed``. The event is queued once the write or truncation is done, so the check
    before a gather catches any change finished by then; a write racing the gather itself can
    still reach that one gather's rows, and a truncation racing it can still be SIGBUS (only a
    private copy, ``copy_shards``, closes that). Writes through another process's memory map are
    not seen here (nor on network file systems, changes made by other hosts): those are left to
    the size and ctime re-checks (``OpenShard.damage``).

    After a fork (DataLoader workers) the inherited instance is the parent's: the child makes its
    own at once (``os.register_at_fork``, before any code of its own runs) and watches the same files
    again; a write in the microseconds between the fork and that is left to the re-checks. Where
    inotify is missing or out of watches, ``add`` says False and the caller relies on the re-checks alone.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = -1
        self._fd = -1
        self._poll: select.poll | None = None
        self._libc = _libc() if hasattr(select, "poll") else None
        self._paths: Counter[str] = Counter()  # path -> shards of this process watching it
        self._wd: dict[int, str] = {}
        self._by_path: dict[str, int] = {}
        self.changed: set[str] = set()  # watched paths written since they were added

    def _ensure(self) -> bool:
        """This process's instance (a fork's child makes its own); False without inotify."""
        if self._pid == os.getpid():
            return self._fd >= 0
        self._pid = os.getpid()
        if self._fd >= 0:
            os.close(self._fd)  # the parent's instance: its events are the parent's to read
        self._fd, self._wd, self._by_path, self._poll = -1, {}, {}, None
        if self._libc is None:
            return False
        fd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return False
        self._fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        for path in list(self._paths):
            self._add_watch(path)
        return True

    def _add_watch(self, path: str) -> bool:
        assert self._libc is not None
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), IN_MODIFY)
        if wd < 0:  # ENOSPC: the user's watches are used up; EACCES, ENOENT: gone already
            return False
        self._wd[wd] = path
        self._by_path[path] = wd
        return True

    def add(self, path: str) -> bool:
        """Watch ``path`` (before it is opened: a write after this is seen); False: not watched."""
        with self._lock:
            self._paths[path] += 1
            if not self._ensure():
                return False
            return path in self._by_path or self._add_watch(path)

    def remove(self, path: str) -> None:
        """A shard of ``path`` was closed; the watch goes with the last one."""
        with self._lock:
            self._paths[path] -= 1
            if self._paths[path] > 0:
                return
            del self._paths[path]
            self.changed.discard(path)
            wd = self._by_path.pop(path, None) if self._pid == os.getpid() else None
            if wd is not None:
                self._wd.pop(wd, None)
                assert self._libc is not None
                self._libc.inotify_rm_watch(self._fd, wd)

    def watching(self, path: str) -> bool:
        return self._pid == os.getpid() and path in self._by_path

    def poll(self) -> bool:
        """Read the queued events; True when a watched file was written (its path in ``changed``).
        One ``poll(2)`` (~1.5 us of CPU on the loaded 2-core box) while anything is watched; a fork's
        child has made its own instance already (``_after_fork``)."""
        poller = self._poll
        if poller is not None and poller.poll(0):
            self._drain()
        return bool(self.changed)

    def _after_fork(self) -> None:
        """In a forked child: its own instance, watching what the parent's did (the parent's is the
        parent's to read)."""
        self._lock = threading.Lock()  # a lock held by another thread of the parent stays held here
        if self._paths:
            self._ensure()
        else:
            self._pid, self._poll = -1, None

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 64 << 10)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                return
            at = 0
            while at + _EVENT_HEADER <= len(data):
                wd = int.from_bytes(data[at : at + 4], sys.byteorder, signed=True)
                mask = int.from_bytes(data[at + 4 : at + 8], sys.byteorder)
                length = int.from_bytes(data[at + 12 : at + 16], sys.byteorder)
                at += _EVENT_HEADER + length
                path = self._wd.get(wd)
                if path is not None and mask & IN_MODIFY:
                    self.changed.add(path)


WATCH = ShardWatch()  # one per process: see ShardWatch
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=WATCH._after_fork)
