"""Finding and opening packed token shards: the manifest, filesystems, memory maps.

Start-up reads only the manifest (one small Parquet file), so it costs O(shards). A shard
is opened on first touch: a memory map plus Arrow's IPC footer, no token bytes read.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from datapipe.atomic import atomic_path
from datapipe.shard_format import ShardMeta

MANIFEST_NAME = "manifest.parquet"
MANIFEST_COLUMNS = ("path", "source", "split", "rows", "tokens", "sha256", "tokenizer_fingerprint", "seq_len", "row_len")


@dataclass
class Manifest:
    """The shards of one split, sorted by (source, path) so row numbering never depends on
    the order in which the pipeline happened to write the manifest."""

    root: str  # run folder on ``fs``; shard paths are relative to it
    fs: pafs.FileSystem
    local: bool
    paths: list[str]
    sources: list[str]
    rows: np.ndarray  # int64 per shard
    sha256: list[str]
    tokenizer_fingerprint: str
    seq_len: int
    row_len: int
    fingerprint: str = field(default="")

    def shards_of(self, source: str) -> np.ndarray:
        return np.asarray([i for i, s in enumerate(self.sources) if s == source], dtype=np.int64)


def _resolve(location: str | os.PathLike[str]) -> tuple[pafs.FileSystem, str, bool]:
    text = os.fspath(location)
    if "://" in text:
        fs, path = pafs.FileSystem.from_uri(text)
    else:
        fs, path = pafs.LocalFileSystem(), str(Path(text).resolve())
    return fs, path.rstrip("/") or "/", isinstance(fs, pafs.LocalFileSystem)


def read_manifest(location: str | os.PathLike[str], split: str, root: str | None = None) -> Manifest:
    """Read the manifest of a run folder, a manifest file, or a URI to either."""
    fs, path, local = _resolve(location)
    if fs.get_file_info(path).type == pafs.FileType.Directory:
        candidates = [f"{path}/shards/{MANIFEST_NAME}", f"{path}/{MANIFEST_NAME}"]
        found = [c for c in candidates if fs.get_file_info(c).type == pafs.FileType.File]
        if not found:
            raise FileNotFoundError(f"no {MANIFEST_NAME} in {location} or its shards/ folder")
        path = found[0]
    elif fs.get_file_info(path).type != pafs.FileType.File:
        raise FileNotFoundError(f"manifest not found: {location}")
    if root is None:
        # The pipeline writes <run>/shards/manifest.parquet with paths relative to <run>.
        parent = path.rsplit("/", 1)[0]
        root = parent.rsplit("/", 1)[0] if parent.rsplit("/", 1)[-1] == "shards" else parent
    with fs.open_input_file(path) as f:
        table = pq.read_table(f)
    missing = [c for c in MANIFEST_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"manifest {location} lacks columns {missing}")
    data = table.select(list(MANIFEST_COLUMNS)).to_pydict()
    keep = sorted((data["source"][i], data["path"][i], i) for i in range(table.num_rows) if data["split"][i] == split)
    if not keep:
        splits = sorted(set(data["split"]))
        raise ValueError(f"manifest {location} has no shards for split {split!r} (splits: {splits})")
    idx = [i for _, _, i in keep]
    col = {c: [data[c][i] for i in idx] for c in MANIFEST_COLUMNS}
    for c in ("tokenizer_fingerprint", "seq_len", "row_len"):
        if len(set(col[c])) != 1:
            raise ValueError(f"manifest mixes {c} values {sorted(set(col[c]))}; one loader reads one tokenization")
    m = Manifest(root=root, fs=fs, local=local, paths=col["path"], sources=col["source"],
                 rows=np.asarray(col["rows"], dtype=np.int64), sha256=col["sha256"],
                 tokenizer_fingerprint=col["tokenizer_fingerprint"][0], seq_len=int(col["seq_len"][0]),
                 row_len=int(col["row_len"][0]))
    m.fingerprint = manifest_fingerprint(m, sorted(set(m.sources)))
    return m


def manifest_fingerprint(m: Manifest, sources: list[str]) -> str:
    """Hash of exactly the shards a loader reads (its split and sources), content included
    via sha256: a rewritten, added or removed shard changes the order, so resume refuses."""
    h = hashlib.sha256(f"{m.tokenizer_fingerprint}|{m.seq_len}|{m.row_len}".encode())
    for p, s, r, d in zip(m.paths, m.sources, m.rows.tolist(), m.sha256):
        if s in sources:
            h.update(f"\n{s}|{p}|{r}|{d}".encode())
    return h.hexdigest()[:32]


class OpenShard:
    """Zero-copy numpy views of one shard; a shard with several record batches keeps one
    view per batch instead of concatenating (that would copy the whole file)."""

    def __init__(self, local_path: str):
        source = pa.memory_map(local_path, "r")
        table = pa.ipc.open_file(source).read_all()
        self.meta = ShardMeta.from_schema(table.schema)
        ids = table.column("input_ids")
        self.row_len = ids.type.list_size
        self.tokens = [c.flatten().to_numpy(zero_copy_only=True).reshape(-1, self.row_len) for c in ids.chunks]
        starts = np.cumsum([0] + [len(t) for t in self.tokens])
        self.chunk_starts = starts  # row number where each chunk begins
        n_tok = table.column("n_tokens").chunks
        self.n_tokens = n_tok[0].to_numpy() if len(n_tok) == 1 else np.concatenate([c.to_numpy() for c in n_tok])
        offs, vals, base = [], [], 0
        for c in table.column("doc_starts").chunks:
            o = c.offsets.to_numpy()
            offs.append(o[:-1] - o[0] + base)
            vals.append(c.flatten().to_numpy())
            base += int(o[-1] - o[0])
        self.doc_offsets = np.concatenate(offs + [np.asarray([base], dtype=np.int32)]).astype(np.int64)
        self.doc_values = vals[0] if len(vals) == 1 else np.concatenate(vals)


    def row(self, r: int) -> np.ndarray:
        if len(self.tokens) == 1:
            return self.tokens[0][r]
        c = int(np.searchsorted(self.chunk_starts, r, side="right")) - 1
        return self.tokens[c][r - self.chunk_starts[c]]


def local_copy(m: Manifest, i: int, cache_dir: str | None) -> str:
    """A local path for shard i: itself when local, else a verified copy in cache_dir.

    Memory maps need a local file; remote shards are fetched once (atomically, named by
    their sha256 so concurrent workers and later runs share the copy)."""
    rel = m.paths[i]
    if m.local:
        return f"{m.root}/{rel}"
    if cache_dir is None:
        raise ValueError(f"shards live on {type(m.fs).__name__}; pass cache_dir= to copy them to local disk")
    target = Path(cache_dir) / f"{m.sha256[i]}.arrow"
    if not target.exists():
        digest = hashlib.sha256()
        with atomic_path(target) as tmp, m.fs.open_input_stream(f"{m.root}/{rel}") as src, open(tmp, "wb") as dst:
            while block := src.read(1 << 22):
                digest.update(block)
                dst.write(block)
            if digest.hexdigest() != m.sha256[i]:
                raise ValueError(f"shard {rel}: sha256 {digest.hexdigest()} does not match manifest {m.sha256[i]}")
    return str(target)


__all__ = ["Manifest", "OpenShard", "read_manifest", "manifest_fingerprint", "local_copy"]
