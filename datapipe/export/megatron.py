"""``megatron``: the ``.bin``/``.idx`` indexed dataset of Megatron-LM / Megatron-Core.

One pair per source and split, ``<source>/<split>_text_document.{bin,idx}``; one Megatron
document (of one sequence) per kept document, its tokens exactly as the packed shards hold
them (EOS at the end, as Megatron's ``preprocess_data.py --append-eod`` writes them).

The layout is that of ``megatron.core.datasets.indexed_dataset`` (``_IndexWriter``):
``.bin`` is the tokens back to back; ``.idx`` is ``MMIDIDX\\x00\\x00``, version ``<Q`` 1, the
dtype code ``<B`` (uint16 = 8, int32 = 4), the sequence count ``<Q`` n, the document count
``<Q`` n + 1, then int32 sequence lengths, int64 byte offsets of each sequence, and int64
document indices 0..n. The lengths go to a side file while the tokens stream, so memory stays
bounded however many documents there are.

``data_path.train.txt`` (and ``.val``) hold the weighted ``--data-path`` string for the
pipeline's mixture: the ``mixture`` weights of run.json, else the sources' natural token shares.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from datapipe.config.mixture import mixture_weights
from datapipe.export.core import temp_for
from datapipe.export.documents import SPLITS, TOKENS, RunDocuments

INDEX_HEADER = b"MMIDIDX\x00\x00"
DTYPE_CODES = {"uint16": 8, "int32": 4}  # megatron.core.datasets.indexed_dataset.DType
CHUNK = 1 << 20  # index entries per step when the .idx is assembled


def bin_dtype(vocab_size: int) -> np.dtype:
    # Megatron has no uint32 code; int32 holds any real vocabulary.
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.int32)


def prefix(source: str, split: str) -> str:
    return f"{source}/{split}_text_document"


class MegatronPart:
    def __init__(self, out: Path, source: str, split: str, dtype: np.dtype) -> None:
        self.prefix = prefix(source, split)
        self.dtype = dtype
        self.bin_tmp = temp_for(out, self.prefix + ".bin")
        self.idx_tmp = temp_for(out, self.prefix + ".idx")
        self.len_tmp = temp_for(out, self.prefix + ".lengths")
        self.bin = self.bin_tmp.open("wb")
        self.lengths = self.len_tmp.open("wb")
        self.n = 0

    def room(self, table: pa.Table) -> int:
        return table.num_rows  # one pair per source and split

    def write(self, table: pa.Table) -> None:
        lists = table[TOKENS].combine_chunks()
        offsets = lists.offsets.to_numpy()
        flat = lists.flatten().to_numpy(zero_copy_only=False)
        self.bin.write(flat.astype(self.dtype, copy=False).tobytes())
        self.lengths.write(np.diff(offsets).astype(np.int32).tobytes())
        self.n += table.num_rows

    def close(self) -> dict[str, Any]:
        self.bin.close()
        self.lengths.close()
        n, itemsize = self.n, self.dtype.itemsize
        with self.idx_tmp.open("wb") as idx, self.len_tmp.open("rb") as lengths:
            idx.write(INDEX_HEADER + struct.pack("<Q", 1) + struct.pack("<B", DTYPE_CODES[self.dtype.name]))
            idx.write(struct.pack("<Q", n) + struct.pack("<Q", n + 1))
            while block := lengths.read(CHUNK * 4):
                idx.write(block)
            lengths.seek(0)
            start = np.int64(0)
            while block := lengths.read(CHUNK * 4):
                sizes = np.frombuffer(block, dtype=np.int32).astype(np.int64) * itemsize
                pointers = np.empty_like(sizes)
                pointers[0] = start
                np.cumsum(sizes[:-1], out=pointers[1:])
                pointers[1:] += start
                start = pointers[-1] + sizes[-1]
                idx.write(pointers.tobytes())
            for lo in range(0, n + 1, CHUNK):
                idx.write(np.arange(lo, min(n + 1, lo + CHUNK), dtype=np.int64).tobytes())
        self.len_tmp.unlink()
        return {"prefix": self.prefix}

    def abort(self) -> None:
        self.bin.close()
        self.lengths.close()
        for p in (self.bin_tmp, self.idx_tmp, self.len_tmp):
            p.unlink(missing_ok=True)

    @property
    def temp_files(self) -> dict[str, Path]:
        # .bin first: an .idx in place means its .bin is too.
        return {self.prefix + ".bin": self.bin_tmp, self.prefix + ".idx": self.idx_tmp}


class MegatronFormat:
    name = "megatron"
    default_columns: tuple[str, ...] = (TOKENS,)

    def options(self) -> dict[str, Any]:
        return {}

    def open_part(self, out: Path, source: str, split: str, part: int, schema: pa.Schema, docs: RunDocuments) -> MegatronPart:
        assert docs.tokens is not None
        return MegatronPart(out, source, split, bin_dtype(docs.tokens.vocab_size))

    def finish_stream(
        self, out: Path, source: str, split: str, parts: list[dict[str, Any]], schema: pa.Schema
    ) -> dict[str, Path]:
        return {}

    def finish(self, out: Path, result: Any, docs: RunDocuments) -> dict[str, Path]:
        weights = mixture_weights((docs.run.get("config") or {}).get("mixture"))
        temps: dict[str, Path] = {}
        data_paths: dict[str, str] = {}
        for split in SPLITS:
            present = {
                s.split("/")[0]: info for s, info in result.streams.items() if s.endswith(f"/{split}") and info["docs"] > 0
            }
            if not present:
                continue
            data_paths[split] = data_path_string(result.output, split, present, weights)  # a URI on a store
            rel = f"data_path.{split}.txt"
            temps[rel] = temp_for(out, rel)
            temps[rel].write_text(data_paths[split] + "\n", encoding="utf-8")
        result.extra["data_path"] = data_paths
        result.extra["weights_from"] = "mixture" if weights else "natural token shares"
        return temps


def data_path_string(out: Path | str, split: str, streams: dict[str, dict[str, int | None]], weights: dict[str, float]) -> str:
    """``W1 PREFIX1 W2 PREFIX2 ...`` for Megatron's ``--data-path`` (weights normalized over the sources
    present; Megatron normalizes them again)."""
    raw = (
        {s: float(weights.get(s, 0.0)) for s in streams}
        if weights
        else {s: float(info["tokens"] or 0) for s, info in streams.items()}
    )
    total = sum(raw.values()) or 1.0
    root = str(out).rstrip("/")
    return " ".join(f"{raw[s] / total:.6g} {root}/{prefix(s, split)}" for s in sorted(streams) if raw[s] > 0)
