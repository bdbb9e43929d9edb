"""The Shards page's data: the manifest, and any packed row decoded back to text, read through the
training loader itself (``PackedDataset.read``), so what the page shows is what a trainer gets: the
same token ids, the same segments (``cu_seqlens``: a new segment at each document start, at the
row's start and where padding begins), the same position ids.

Each segment is decoded with the run's tokenizer (found by the sha256 run.json recorded, so a
changed tokenizer file is never used to decode) and, for ``concat`` packing, named by the document it
comes from: the stream of a (source, split) lays the kept documents of that source and split end to
end in run order, so the k-th document starting in the stream is the k-th such kept document
(``export/documents.py`` cuts shards back into documents the same way).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from datapipe.view.runs import RunView

FIND_SECONDS = 1.0


@dataclass
class Segment:
    start: int
    end: int
    kind: str  # "document" (starts here), "continued" (from the previous row), "padding"
    ids: list[int]
    text: str | None
    doc_id: str | None = None
    doc_index: int | None = None  # its place among the documents of its (source, split) stream


@dataclass
class DecodedRow:
    path: str
    row: int
    rows: int
    source: str
    split: str
    packing: str
    seq_len: int
    n_tokens: int
    input_ids: list[int]
    cu_seqlens: list[int]
    position_starts: list[int]
    segments: list[Segment]
    notes: list[str] = field(default_factory=list)


class ShardReader:
    """Rows of one run's shards through the loader (one ``PackedDataset`` per split, built on first use)."""

    def __init__(self, run: RunView, cache_dir: str | None = None) -> None:
        self.run = run
        self.cache_dir = cache_dir
        self._datasets: dict[str, Any] = {}
        self._tokenizer: tuple[Any, str] | None = None
        self._split_counts: dict[tuple[str, str], int] = {}
        self._documents: tuple[Any, dict[str, int | None]] | None = None
        self._lock = threading.Lock()

    def dataset(self, split: str) -> Any:
        from datapipe.loader.dataset import PackedDataset

        with self._lock:
            if split not in self._datasets:
                location = self.run.uri or str(self.run.root)
                cache = self.cache_dir
                if self.run.uri is not None and cache is None:
                    from datapipe.storage.cache import cache_dir

                    cache = str(cache_dir() / "view-shards")
                self._datasets[split] = PackedDataset(
                    location, split=split, batch_size=1, backend="numpy", verify="open", cache_dir=cache, allow_incomplete=True
                )
            return self._datasets[split]

    def tokenizer(self) -> tuple[Any, str]:
        """(the run's tokenizer or None, a note): only a file whose sha256 is the one run.json recorded."""
        if self._tokenizer is None:
            self._tokenizer = _find_tokenizer(self.run.run_json())
        return self._tokenizer

    def decode(self, path: str, row: int) -> DecodedRow:
        entry = next((s for s in self.run.index().shards if s["path"] == path), None)
        if entry is None:
            raise KeyError(f"no shard {path!r} in the manifest")
        ds = self.dataset(str(entry["split"]))
        m = ds.manifest
        i = m.paths.index(path)
        if not 0 <= row < int(m.rows[i]):
            raise IndexError(f"row {row} is not in {path} ({int(m.rows[i])} rows: 0 to {int(m.rows[i]) - 1})")
        batch = ds.read(np.asarray([i], np.int64), np.asarray([row], np.int64))
        ids = batch["input_ids"][0].astype(np.int64)
        n_seg = int(batch["num_segments"][0])
        cu = [int(x) for x in batch["cu_seqlens"][0][: n_seg + 1]]
        sh = ds.table.shard(i)
        n_tok = int(sh.n_tokens[row])
        starts = [int(x) for x in sh.doc_values[sh.doc_offsets[row] : sh.doc_offsets[row + 1]]]
        tokenizer, note = self.tokenizer()
        out = DecodedRow(
            path=path,
            row=row,
            rows=int(m.rows[i]),
            source=str(entry["source"]),
            split=str(entry["split"]),
            packing=str(entry.get("packing") or "concat"),
            seq_len=ds.seq_len,
            n_tokens=n_tok,
            input_ids=ids.tolist(),
            cu_seqlens=cu,
            position_starts=[int(p) for p in np.flatnonzero(batch["position_ids"][0] == 0)],
            segments=[],
            notes=[note] if note else [],
        )
        for a, b in zip(cu[:-1], cu[1:]):
            kind = "padding" if a >= n_tok else "document" if a in starts else "continued"
            seg_ids = ids[a:b].tolist()
            text = tokenizer.decode(seg_ids, skip_special_tokens=False) if tokenizer is not None else None
            out.segments.append(Segment(a, b, kind, seg_ids, text))
        self._name_documents(out, i, row, sh)
        return out

    def _name_documents(self, out: DecodedRow, shard: int, row: int, sh: Any) -> None:
        """Each segment's document id, for concat packing: its place in the stream, then that kept document."""
        if out.packing != "concat":
            out.notes.append(f"{out.packing} packing reorders documents: segments are not named by document id")
            return
        if "mixture_repeat" in self.run.index().column_names:
            out.notes.append("this run repeats documents by bucket (mixture repeat): segments are not named by document id")
            return
        m = self.dataset(out.split).manifest
        earlier = [
            j for j in range(len(m.paths)) if m.sources[j] == out.source and m.paths[j] < out.path
        ]  # the stream's shards before this one (path order is stream order)
        docs_before = sum(self._shard_documents(out.split, j) for j in earlier) + int(sh.doc_offsets[row])
        deadline = time.perf_counter() + FIND_SECONDS
        k = docs_before - 1  # a row that starts with the rest of a document continues document k
        for seg in out.segments:
            if seg.kind == "padding":
                continue
            if seg.kind == "document":
                k += 1
            if k >= 0:
                seg.doc_index = k
        found = self._documents_at(
            out.source, out.split, sorted({s.doc_index for s in out.segments if s.doc_index is not None}), deadline
        )
        for seg in out.segments:
            seg.doc_id = found.get(seg.doc_index) if seg.doc_index is not None else None
        if any(s.doc_id is None and s.doc_index is not None for s in out.segments):
            out.notes.append(f"some document ids were not found within {FIND_SECONDS:g} s")

    def _shard_documents(self, split: str, j: int) -> int:
        """Documents starting in shard j of a split: the manifest's count, else the shard's own."""
        ds = self.dataset(split)
        documents = self._manifest_documents().get(ds.manifest.paths[j])
        return int(documents) if documents is not None else len(ds.table.shard(j).doc_values)

    def _manifest_documents(self) -> dict[str, int | None]:
        index = self.run.index()
        if self._documents is None or self._documents[0] is not index:
            self._documents = (index, {s["path"]: s.get("documents") for s in index.shards})
        return self._documents[1]

    def _documents_at(self, source: str, split: str, ks: list[int], deadline: float) -> dict[int, str]:
        """The ids of the k-th kept documents of ``source`` in ``split`` (run order: docs/ files by path,
        rows in file order), each file read at most once."""
        out: dict[int, str] = {}
        before = 0  # documents of the stream in the files before this one
        todo = list(ks)
        for f in (f for f in self.run.index().files if f.status == "kept" and f.source == source):
            if not todo:
                break
            n = self._split_count(f, split, deadline)
            if n is None:
                break
            here = [k for k in todo if k < before + n]
            if here:
                with self.run.parquet(f) as pf:
                    table = pf.read(columns=["id", "split"] if "split" in f.columns else ["id"])
                if "split" in table.column_names:
                    table = table.filter(pc.equal(table["split"], split))
                for k in here:
                    out[k] = str(table["id"][k - before].as_py())
                todo = [k for k in todo if k >= before + n]
            before += n
        return out

    def _split_count(self, f: Any, split: str, deadline: float) -> int | None:
        key = (f.path, split)
        if key not in self._split_counts:
            if "split" not in f.columns:
                self._split_counts[key] = f.rows if split == "train" else 0
            else:
                if time.perf_counter() > deadline:
                    return None
                with self.run.parquet(f) as pf:
                    column = pf.read(columns=["split"])["split"]
                self._split_counts[key] = int(pc.sum(pc.equal(column, split)).as_py() or 0)
        return self._split_counts[key]


def _find_tokenizer(run: dict[str, Any]) -> tuple[Any, str]:
    cfg = (run.get("config") or {}).get("tokenize") or {}
    name, want = cfg.get("tokenizer"), cfg.get("tokenizer_sha256")
    if not name:
        return None, "the run has no tokenize section"
    pipeline = Path(run.get("pipeline_file") or "pipeline.yaml")
    candidates = [Path(name)] if os.path.isabs(name) else [pipeline.parent / name, Path(name)]
    for path in candidates:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if want and hashlib.sha256(data).hexdigest() != want:
            return None, f"{path} is not the tokenizer the run used (another sha256): token ids only"
        from tokenizers import Tokenizer

        return Tokenizer.from_str(data.decode("utf-8")), ""
    return None, f"the run's tokenizer ({name}) is not found from here: token ids only"
