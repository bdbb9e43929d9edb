"""``mds``: MosaicML Streaming shards (MDS), written directly from the documented layout.

``<source>/<split>/index.json`` plus ``shard.NNNNN.mds`` files, as ``streaming.MDSWriter``
writes them (no compression, no hashes), so ``streaming.StreamingDataset(local=...)`` and
``streaming.base.format.reader_from_json`` read them; one directory per source and split can be
one ``Stream`` of a mixture. Writing needs no ``streaming`` install (its fork pulls torchvision and
cloud SDKs).

A shard is ``<u32 samples> <u32 offsets[samples + 1]> <config JSON> <samples>``; offsets are from
the start of the file. A sample is the u32 sizes of its variable-size columns, then the encoded
columns, in sorted column-name order. Encodings: ``input_ids`` ``ndarray:<dtype>`` (one dimension,
its length stored before the values), ``id`` and ``text`` ``str`` (UTF-8), every other column
``json`` (keeps nulls and types). A shard closes before a sample that would take it past
``size_limit`` bytes (64 MiB, streaming's default), counted as streaming counts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from datapipe.export.core import temp_for
from datapipe.export.documents import TOKENS, RunDocuments

SIZE_LIMIT = 1 << 26
STR_COLUMNS = ("id", "text")


def encodings(schema: pa.Schema) -> dict[str, str]:
    out = {}
    for f in schema:
        if f.name == TOKENS:
            out[f.name] = f"ndarray:{f.type.value_type}"
        elif f.name in STR_COLUMNS and pa.types.is_string(f.type):
            out[f.name] = "str"
        else:
            out[f.name] = "json"
    return out


def shard_config(schema: pa.Schema, size_limit: int) -> dict[str, Any]:
    enc = encodings(schema)
    names = sorted(enc)
    return {
        "version": 2,
        "format": "mds",
        "compression": None,
        "hashes": [],
        "size_limit": size_limit,
        "column_names": names,
        "column_encodings": [enc[n] for n in names],
        "column_sizes": [None] * len(names),
    }


def _encode_tokens(ids: np.ndarray) -> bytes:
    n = len(ids)
    code = 0 if n < 1 << 8 else 1 if n < 1 << 16 else 2 if n < 1 << 32 else 3
    shape = np.array([n], dtype=("uint8", "uint16", "uint32", "uint64")[code])
    return bytes([(1 << 2) | code]) + shape.tobytes() + ids.tobytes()


class MdsPart:
    def __init__(self, out: Path, rel: str, schema: pa.Schema, size_limit: int) -> None:
        self.rel, self.size_limit = rel, size_limit
        self.tmp = temp_for(out, rel)
        self.config = shard_config(schema, size_limit)
        self.config_bytes = json.dumps(self.config, sort_keys=True).encode("utf-8")
        self.names = self.config["column_names"]
        self.enc = dict(zip(self.names, self.config["column_encodings"]))
        self.dtype = {n: np.dtype(e.split(":")[1]) for n, e in self.enc.items() if e.startswith("ndarray")}
        # Samples go to a side file as they come (only their sizes stay in memory); the shard is
        # assembled behind its header at close. streaming's MDSWriter holds the shard in memory.
        self.data_tmp = temp_for(out, rel + ".data")
        self.data = self.data_tmp.open("wb")
        self.sizes: list[int] = []
        self.size = 4 + 4 + len(self.config_bytes)  # streaming's extra_bytes_per_shard
        self._pending: list[bytes] = []

    def _encode(self, table: pa.Table) -> list[bytes]:
        cols = {}
        for n in self.names:
            if n in self.dtype:
                lists = table[n].combine_chunks()
                offsets, flat = lists.offsets.to_numpy(), lists.flatten().to_numpy(zero_copy_only=False)
                cols[n] = [flat[a:b].astype(self.dtype[n], copy=False) for a, b in zip(offsets[:-1], offsets[1:])]
            else:
                cols[n] = table[n].to_pylist()
        out = []
        for i in range(table.num_rows):
            parts = []
            for n in self.names:
                v = cols[n][i]
                e = self.enc[n]
                parts.append(
                    _encode_tokens(v)
                    if n in self.dtype
                    else v.encode("utf-8")
                    if e == "str"
                    else json.dumps(v, ensure_ascii=False).encode("utf-8")
                )
            out.append(np.array([len(p) for p in parts], np.uint32).tobytes() + b"".join(parts))
        return out

    def room(self, table: pa.Table) -> int:
        self._pending = self._encode(table)
        size, n = self.size, 0
        for s in self._pending:
            if (self.sizes or n) and self.size_limit < size + len(s) + 4:
                break
            size += len(s) + 4
            n += 1
        return n

    def write(self, table: pa.Table) -> None:
        take = self._pending[: table.num_rows]
        self._pending = []
        for s in take:
            self.data.write(s)
            self.sizes.append(len(s))
            self.size += len(s) + 4

    def close(self) -> dict[str, Any]:
        self.data.close()
        n = len(self.sizes)
        offsets = np.array([0, *self.sizes], dtype=np.int64).cumsum()
        offsets += 4 + 4 * (n + 1) + len(self.config_bytes)
        if offsets[-1] >= 1 << 32:
            raise ValueError(f"MDS shard {self.rel} would exceed 4 GiB; lower size_limit")
        with self.tmp.open("wb") as f, self.data_tmp.open("rb") as data:
            f.write(np.uint32(n).tobytes() + offsets.astype(np.uint32).tobytes() + self.config_bytes)
            shutil.copyfileobj(data, f, 1 << 20)
        self.data_tmp.unlink()
        return {"samples": n}

    def abort(self) -> None:
        self.data.close()
        self.data_tmp.unlink(missing_ok=True)
        self.tmp.unlink(missing_ok=True)

    @property
    def temp_files(self) -> dict[str, Path]:
        return {self.rel: self.tmp}


class MdsFormat:
    name = "mds"
    default_columns: tuple[str, ...] = ("id", "text", TOKENS)

    def __init__(self, size_limit: int = SIZE_LIMIT) -> None:
        self.size_limit = size_limit

    def options(self) -> dict[str, Any]:
        return {"size_limit": self.size_limit}

    def open_part(self, out: Path, source: str, split: str, part: int, schema: pa.Schema, docs: RunDocuments) -> MdsPart:
        return MdsPart(out, f"{source}/{split}/shard.{part:05d}.mds", schema, self.size_limit)

    def finish_stream(
        self, out: Path, source: str, split: str, parts: list[dict[str, Any]], schema: pa.Schema
    ) -> dict[str, Path]:
        if not parts:
            return {}
        config = shard_config(schema, self.size_limit)
        shards = []
        for p in parts:
            ((rel, info),) = p["files"].items()
            shards.append(
                {
                    "samples": p["samples"],
                    "raw_data": {"basename": Path(rel).name, "bytes": info["bytes"], "hashes": {}},
                    "zip_data": None,
                    **config,
                }
            )
        rel = f"{source}/{split}/index.json"
        tmp = temp_for(out, rel)
        tmp.write_text(json.dumps({"version": 2, "shards": shards}, sort_keys=True), encoding="utf-8")
        return {rel: tmp}

    def finish(self, out: Path, result: Any, docs: RunDocuments) -> dict[str, Path]:
        return {}
