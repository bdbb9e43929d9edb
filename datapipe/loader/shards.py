"""Finding and opening packed token shards: the manifest, filesystems, memory maps.

Start-up reads only the manifest (one small Parquet file), so it costs O(shards). A shard
is opened on first touch: a memory map plus Arrow's IPC footer and the checks of
``verify.shard_arrays``; no token bytes are read.

A local run is found with ``os`` and its manifest read from the JSON copy the pack phase writes
beside the Parquet file (``manifest_columns``): the training process then never maps pyarrow's
Parquet and filesystem libraries, which it would keep for its whole life for one small read (with
DataLoader workers it never opens a shard either). Only a URI imports ``pyarrow.fs`` here.

Manifest paths are relative to the run folder and must stay inside it: an absolute path,
a ``..`` component or (for local runs) a symlink that resolves outside the folder is
refused with ``ShardPathError``. A path written as a URI (``file:///data/x.arrow``,
``s3://bucket/x.arrow``) names another location on purpose and is used as given.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import stat
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from datapipe.errors import EXIT_USAGE, DatapipeError
from datapipe.loader.verify import WATCH, file_identity, shard_arrays
from datapipe.tokens.shard_format import (
    MANIFEST_COLUMNS,
    MANIFEST_COPY_NAME,
    MANIFEST_NAME,
    ShardCorrupt,
    ShardMeta,
    file_sha256,
)

if TYPE_CHECKING:
    import pyarrow.fs as pafs

_ARROW_MAGIC = b"ARROW1"


class ShardPathError(DatapipeError, ValueError):
    """A manifest path that would read outside the run folder."""


class RunIncomplete(DatapipeError, ValueError):
    """The run folder's run.json does not say ``complete``: its shards and manifest may be those of an
    unfinished (or rerunning) run, so reading them is refused unless asked for (``allow_incomplete``)."""

    exit_code = EXIT_USAGE


@dataclass
class Manifest:
    """The shards of one split, sorted by (source, path) so row numbering never depends on
    the order in which the pipeline happened to write the manifest."""

    root: str  # run folder on ``fs``; shard paths are relative to it
    fs: pafs.FileSystem | None  # None: a local folder, read with os (pyarrow.fs is not imported for it)
    local: bool
    paths: list[str]
    sources: list[str]
    rows: np.ndarray  # int64 per shard
    sha256: list[str]
    tokenizer_fingerprint: str
    seq_len: int
    row_len: int
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # int64 per shard
    bytes: np.ndarray | None = None  # file sizes, when the manifest has a ``bytes`` column
    fingerprint: str = field(default="")

    def shard_path(self, i: int) -> str:
        """Where shard i lives on ``fs`` (or a URI); refuses paths that escape the run folder."""
        rel = self.paths[i]
        if is_uri(rel):
            return rel
        path = f"{self.root}/{rel}"
        if self.local:  # symlinks are resolved only here, at open: O(1) per shard, not O(shards) at start-up
            real, root = os.path.realpath(path), os.path.realpath(self.root)
            if not (real == root or real.startswith(root.rstrip("/") + "/")):
                raise ShardPathError(
                    f"shard {rel}: resolves to {real}, outside the run folder {root} (a symlink?); "
                    "write the manifest path as a file:// URI to read it from there on purpose"
                )
            return real
        return path

    def shards_of(self, source: str) -> np.ndarray:
        return np.asarray([i for i, s in enumerate(self.sources) if s == source], dtype=np.int64)


def _resolve(location: str | os.PathLike[str]) -> tuple[pafs.FileSystem | None, str, bool]:
    """(filesystem, path, local): filesystem None for a plain local path (read with os)."""
    text = os.fspath(location)
    if "://" not in text:
        return None, str(Path(text).resolve()).rstrip("/") or "/", True
    import pyarrow.fs as pafs

    fs, path = pafs.FileSystem.from_uri(text)
    return fs, path.rstrip("/") or "/", isinstance(fs, pafs.LocalFileSystem)


def _kind(fs: pafs.FileSystem | None, path: str) -> str:
    """What ``path`` is on ``fs`` (None: the local disk): "dir", "file", or "" (missing, or neither)."""
    if fs is None:
        return "dir" if os.path.isdir(path) else "file" if os.path.isfile(path) else ""
    import pyarrow.fs as pafs

    t = fs.get_file_info(path).type
    return "dir" if t == pafs.FileType.Directory else "file" if t == pafs.FileType.File else ""


def manifest_columns(fs: pafs.FileSystem | None, path: str) -> dict[str, list]:
    """Every column of the manifest at ``path`` as Python lists. A local run's JSON copy
    (``shard_format.MANIFEST_COPY_NAME``, written beside the Parquet file by the pack phase) is read
    when its stamp is the Parquet file's sha256: the standard library reads it, so the training
    process neither maps pyarrow's Parquet and filesystem libraries nor allocates from Arrow's memory
    pool, which it would keep for its whole life for one small read (measured by
    ``bench.perf.loader --dataloader``). Otherwise (no copy, a stale one, a URI) the Parquet file is
    read, which raises pyarrow's own error for a file that is not Parquet."""
    if fs is None:
        columns = _stamped_copy(path)
        if columns is not None:
            return columns
    import pyarrow.parquet as pq

    with open(path, "rb") if fs is None else fs.open_input_file(path) as f:
        # ParquetFile, not pq.read_table: that goes through pyarrow.dataset, whose import pulls in
        # pandas (~0.4 s of CPU and ~45 MiB in every training process and DataLoader worker).
        table = pq.ParquetFile(f).read()
    return table.to_pydict()


def _stamped_copy(path: str) -> dict[str, list] | None:
    """The columns of the JSON copy beside the local Parquet manifest ``path``, or None where there
    is none, it is not the copy's shape, or its stamp is not the Parquet file's sha256 (the Parquet
    file is the truth)."""
    try:
        with open(os.path.join(os.path.dirname(path), MANIFEST_COPY_NAME), "rb") as f:
            copy = json.loads(f.read())
        columns = copy["columns"]
        fresh = isinstance(columns, dict) and copy["parquet_sha256"] == file_sha256(path)
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return columns if fresh else None


def read_manifest(
    location: str | os.PathLike[str], split: str, root: str | None = None, allow_incomplete: bool = False
) -> Manifest:
    """Read the manifest of a run folder, a manifest file, or a URI to either. A run folder whose
    run.json does not say ``complete`` is refused (``RunIncomplete``) unless ``allow_incomplete``;
    a manifest with no run.json beside it (shards written by other tools) is read as it is."""
    fs, path, local = _resolve(location)
    kind = _kind(fs, path)
    if kind == "dir":
        candidates = [f"{path}/shards/{MANIFEST_NAME}", f"{path}/{MANIFEST_NAME}"]
        found = [c for c in candidates if _kind(fs, c) == "file"]
        if not found:
            raise FileNotFoundError(f"no {MANIFEST_NAME} in {location} or its shards/ folder")
        path = found[0]
    elif kind != "file":
        raise FileNotFoundError(f"manifest not found: {location}")
    if root is None:
        # The pipeline writes <run>/shards/manifest.parquet with paths relative to <run>.
        parent = path.rsplit("/", 1)[0]
        root = parent.rsplit("/", 1)[0] if parent.rsplit("/", 1)[-1] == "shards" else parent
    if not allow_incomplete:
        check_run_complete(fs, root, location)
    data = manifest_columns(fs, path)
    missing = [c for c in MANIFEST_COLUMNS if c not in data]
    if missing:
        raise ValueError(f"manifest {location} lacks columns {missing}")
    keep = sorted((data["source"][i], data["path"][i], i) for i in range(len(data["path"])) if data["split"][i] == split)
    if not keep:
        splits = sorted(set(data["split"]))
        raise ValueError(f"manifest {location} has no shards for split {split!r} (splits: {splits})")
    idx = [i for _, _, i in keep]
    col = {c: [data[c][i] for i in idx] for c in MANIFEST_COLUMNS}
    _check_manifest_columns(data["path"], data["sha256"], location)
    sizes = None
    if "bytes" in data:  # optional: lets a shard's size be checked before it is mapped
        raw = data["bytes"]
        sizes = np.asarray([-1 if raw[i] is None else raw[i] for i in idx], dtype=np.int64)
    for c in ("tokenizer_fingerprint", "seq_len", "row_len"):
        if len(set(col[c])) != 1:
            raise ValueError(f"manifest mixes {c} values {sorted(set(col[c]))}; one loader reads one tokenization")
    m = Manifest(
        root=root,
        fs=fs,
        local=local,
        paths=col["path"],
        sources=col["source"],
        rows=np.asarray(col["rows"], dtype=np.int64),
        sha256=col["sha256"],
        tokenizer_fingerprint=col["tokenizer_fingerprint"][0],
        seq_len=int(col["seq_len"][0]),
        row_len=int(col["row_len"][0]),
        tokens=np.asarray(col["tokens"], dtype=np.int64),
        bytes=sizes,
    )
    m.fingerprint = manifest_fingerprint(m, sorted(set(m.sources)))
    return m


def check_run_complete(fs: pafs.FileSystem | None, root: str, location: object) -> None:
    """Refuse a run folder whose run.json is unreadable or does not say ``complete`` (one small read;
    ``fs`` None: a local folder)."""
    run_json = f"{root.rstrip('/')}/run.json"
    if _kind(fs, run_json) != "file":
        return  # not a datapipe run folder: a manifest of shards written some other way
    hint = (
        "wait for `datapipe run` to finish (or run it again to complete the run); pass "
        "allow_incomplete=True to read the shards as they are"
    )
    try:
        with open(run_json, "rb") if fs is None else fs.open_input_stream(run_json) as f:
            status = json.loads(f.read()).get("status")
    except (ValueError, AttributeError, OSError) as exc:
        raise RunIncomplete(
            f"{location}: {run_json} is unreadable ({type(exc).__name__}), so the run cannot be known to be complete", hint=hint
        ) from None
    if status != "complete":
        raise RunIncomplete(
            f"{location}: the run is not complete (run.json says status {status!r}); its shards "
            "may be missing, partial or about to be rewritten",
            hint=hint,
        )


def manifest_fingerprint(m: Manifest, sources: list[str]) -> str:
    """Hash of exactly the shards a loader reads (its split and sources), content included
    via sha256: a rewritten, added or removed shard changes the order, so resume refuses."""
    h = hashlib.sha256(f"{m.tokenizer_fingerprint}|{m.seq_len}|{m.row_len}".encode())
    for p, s, r, d in zip(m.paths, m.sources, m.rows.tolist(), m.sha256):
        if s in sources:
            h.update(f"\n{s}|{p}|{r}|{d}".encode())
    return h.hexdigest()[:32]


def is_uri(path: str) -> bool:
    return "://" in path


_HEX = b"0123456789abcdef"


def _check_manifest_columns(paths: list, digests: list, location: object) -> None:
    """Paths and sha256 of every manifest row, in C-level passes (str methods over the paths,
    one bytes.translate over the joined digests: ~0.1 s per 100,000 shards on the loaded 2-core
    box); the row-by-row checks run only to name the first bad row. Not pyarrow.compute: its
    first call imports pandas (~45 MiB and ~0.4 s of CPU in every training process and
    DataLoader worker)."""
    if any(
        p is None or ("://" not in p and (not p or p[0] == "/" or "\x00" in p or (".." in p and ".." in p.split("/"))))
        for p in paths
    ):
        for rel in paths:
            check_manifest_path(rel)
    if not _all_sha256(digests):
        k = next(i for i, d in enumerate(digests) if not _all_sha256([d]))
        raise ValueError(f"manifest {location}: shard {paths[k]} has sha256 {digests[k]!r}, not 64 lowercase hex digits")


def _all_sha256(digests: list) -> bool:
    """Every digest is 64 lowercase hex digits."""
    if None in digests or set(map(len, digests)) - {64}:
        return False
    joined = "".join(digests)
    return joined.isascii() and not joined.encode("ascii").translate(None, _HEX)


def check_manifest_path(rel: object) -> None:
    """Lexical check of a manifest path (symlinks are checked at open, ``Manifest.shard_path``)."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise ShardPathError(f"manifest path {rel!r} is not a file path")
    if is_uri(rel):
        return
    if rel.startswith("/") or os.path.isabs(rel):
        raise ShardPathError(
            f"shard {rel}: absolute manifest paths are refused (paths are relative to the run "
            "folder; write a file:// URI to read another location on purpose)"
        )
    if ".." in rel.split("/"):
        raise ShardPathError(f"shard {rel}: '..' in a manifest path would leave the run folder")


class OpenShard:
    """A checked, memory-mapped shard: zero-copy token views (one per record batch: a shard
    with several batches is not concatenated, that would copy the whole file) and copies
    of the small per-row arrays (see ``verify``).

    The map is a Python ``mmap`` (not ``pa.memory_map``) because it owns a file descriptor
    whose ``size()`` is one fstat: ``truncated()`` re-checks that the file still covers the
    map. A shard mapped in place (not a private copy) is watched for writes by other processes
    (``verify.ShardWatch``) from before it is opened; ``damage`` says what changed, which the
    shard table checks before gathers (``ShardTable.guard``)."""

    def __init__(self, local_path: str, name: str, row_len: int, expect_bytes: int = -1, private: bool = False) -> None:
        self.path, self.name, self.row_len, self.private = local_path, name, row_len, private
        # Watched before it is opened, so any write after what the checks below see is noticed.
        self._watched = False if private else WATCH.add(local_path)
        try:
            self._open(local_path, name, row_len, expect_bytes)
        except BaseException:
            self.release()
            raise

    def _open(self, local_path: str, name: str, row_len: int, expect_bytes: int) -> None:
        try:
            fd = os.open(local_path, os.O_RDONLY)
        except OSError as exc:
            raise ShardCorrupt(f"shard {name}: cannot be opened ({exc.strerror}: {local_path})", name) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ShardCorrupt(f"shard {name}: {local_path} is not a regular file", name)
            if expect_bytes >= 0 and st.st_size != expect_bytes:
                raise ShardCorrupt(
                    f"shard {name}: {st.st_size} bytes on disk, the manifest says {expect_bytes} (truncated or replaced)", name
                )
            if st.st_size < 2 * len(_ARROW_MAGIC) + 4:
                raise ShardCorrupt(f"shard {name}: {st.st_size} bytes is too small for an Arrow IPC file (truncated?)", name)
            self.mm = mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ)  # keeps its own (dup'd) descriptor
        finally:
            os.close(fd)
        self.size, self.identity = st.st_size, file_identity(st)
        if self.truncated():  # shrunk between fstat and mmap: touching the tail would SIGBUS
            raise ShardCorrupt(f"shard {name}: truncated while being opened", name)
        if self.mm[: len(_ARROW_MAGIC)] != _ARROW_MAGIC or self.mm[-len(_ARROW_MAGIC) :] != _ARROW_MAGIC:
            raise ShardCorrupt(f"shard {name}: no Arrow IPC file magic at its start and end (truncated or not a shard)", name)
        buf = pa.py_buffer(self.mm)
        try:
            table = pa.ipc.open_file(pa.BufferReader(buf)).read_all()
            self.meta = ShardMeta.from_schema(table.schema)
        except (pa.ArrowException, OSError, ValueError, TypeError, KeyError) as exc:  # flatbuffers, json, fields
            raise ShardCorrupt(
                f"shard {name}: unreadable Arrow IPC footer, schema or metadata ({type(exc).__name__}: {exc})", name
            ) from None
        arrays = shard_arrays(table, self.meta, name, row_len, buf.address, self.size)
        self.tokens = arrays.tokens
        self.chunk_starts = np.cumsum([0] + [len(t) for t in self.tokens])  # row where each chunk begins
        self.n_tokens, self.doc_offsets, self.doc_values = arrays.n_tokens, arrays.doc_offsets, arrays.doc_values

    def truncated(self) -> bool:
        """True when the file no longer covers the map (reading its tail would raise SIGBUS)."""
        try:
            return self.mm.size() < self.size
        except (OSError, ValueError):
            return True

    def damage(self, deep: bool = False) -> str | None:
        """What changed in the mapped file since it was opened, or None. Always: its size (one
        fstat) and whether a write to it was seen (``WATCH``, polled by the caller). ``deep``, or
        where it is not watched: a stat of its path too, whose size, modification or change time
        differ when the same file was written in place (a file replaced by a rename is another
        inode: the map still reads the old one, whole, and a shard opened anew is verified)."""
        if self.truncated():
            return f"its file shrank below the {self.size} bytes mapped at open (truncated while in use)"
        if self._watched and self.path in WATCH.changed:
            return "its file was written while mapped (overwritten or truncated in place by another process)"
        if self.private or not (deep or not self._watched):
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None  # removed or renamed away: the map holds the file it opened
        if (st.st_dev, st.st_ino) == self.identity[:2] and file_identity(st) != self.identity:
            return "its file changed on disk since it was opened (written in place: another size, modification or change time)"
        return None

    def release(self) -> None:
        """Stop watching the file (its map closes when the last reference goes)."""
        if self._watched:
            self._watched = False
            WATCH.remove(self.path)

    def __del__(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        # At interpreter exit the modules' globals may be gone already, and the watch with them.
        if not _finalizing():
            self.release()

    def row(self, r: int) -> np.ndarray:
        if len(self.tokens) == 1:
            return self.tokens[0][r]
        c = int(np.searchsorted(self.chunk_starts, r, side="right")) - 1
        return self.tokens[c][r - self.chunk_starts[c]]


def writable_by_others(path: str) -> bool:
    """Whether another user than this process's may write ``path`` in place (so truncate or
    overwrite it under a memory map): group or others have write permission, or the file is
    another user's and its owner has. Root writes anything; that is not counted. A URI that is
    not a local file, and a path that cannot be looked at, count as writable (copied)."""
    if is_uri(path) and not path.startswith("file://"):
        return True
    try:
        st = os.stat(path[len("file://") :] if path.startswith("file://") else path)
    except OSError:
        return True
    return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)) or (st.st_uid != os.geteuid() and bool(st.st_mode & stat.S_IWUSR))


def default_copy_dir() -> str:
    """Where shard copies go when no ``cache_dir`` is given: ``loader-shards`` in datapipe's cache
    folder ($DATAPIPE_CACHE_DIR, else the XDG cache; found as ``storage/cache.py`` does, which a
    training job's loader does not import)."""
    env = os.environ.get("DATAPIPE_CACHE_DIR")
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(env).expanduser() if env else (Path(xdg) if xdg else Path.home() / ".cache") / "datapipe"
    return str(base / "loader-shards")


def local_copy(m: Manifest, i: int, cache_dir: str | None, copy: bool = False) -> str:
    """A local path for shard i: itself when local (unless ``copy``), else a verified copy in
    cache_dir.

    Memory maps need a local file; remote shards are fetched once (atomically, named by
    their sha256 so concurrent workers and later runs share the copy). ``copy`` fetches
    local shards too: a map of a private copy cannot be truncated by whoever writes the
    original in place."""
    rel = m.paths[i]
    where = m.shard_path(i)
    fs: pafs.FileSystem | None = None  # None: a local file, read with open()
    if is_uri(where):
        import pyarrow.fs as pafs

        fs, src_path = pafs.FileSystem.from_uri(where)
        if isinstance(fs, pafs.LocalFileSystem) and not copy:
            return src_path
    elif m.local:
        if not copy:
            return where
        src_path = where
    else:
        fs, src_path = m.fs, where
    if cache_dir is None:
        what = "is to be copied before it is mapped" if fs is None else f"lives on {type(fs).__name__}"
        raise ValueError(f"shard {rel} {what}; pass cache_dir= to copy it to local disk")
    target = Path(cache_dir) / f"{m.sha256[i]}.arrow"  # sha256 is checked to be hex: no path tricks
    if not target.exists():
        # A private temporary name, renamed into place only once whole and verified: a worker killed
        # mid-copy leaves no file under the final name (the loader keeps its own few lines for this
        # rather than importing the engine's atomic writer: training jobs import only the loader).
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part")
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            digest = hashlib.sha256()
            with open(src_path, "rb") if fs is None else fs.open_input_stream(src_path) as src, open(tmp, "wb") as dst:
                while block := src.read(1 << 22):
                    digest.update(block)
                    dst.write(block)
            if digest.hexdigest() != m.sha256[i]:
                raise ShardCorrupt(f"shard {rel}: sha256 {digest.hexdigest()} does not match manifest {m.sha256[i]}", rel)
            os.chmod(tmp, 0o444)  # read-only: nobody but root rewrites a private copy in place
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    return str(target)


__all__ = [
    "Manifest",
    "OpenShard",
    "RunIncomplete",
    "ShardPathError",
    "check_manifest_path",
    "check_run_complete",
    "default_copy_dir",
    "read_manifest",
    "manifest_fingerprint",
    "local_copy",
    "writable_by_others",
]
