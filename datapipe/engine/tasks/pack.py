"""The packing task: kept documents' tokens into fixed-length rows in Arrow shard files."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datapipe.config.mixture import REPEAT_COLUMN, in_round, spread_offsets
from datapipe.engine.pack_plan import PackRange
from datapipe.engine.plan import RunSpec
from datapipe.run_folder.layout import RunFolder
from datapipe.tokens.packing import PackedRows, ShardBuffer, make_packer, shard_meta_for
from datapipe.tokens.shard_format import ShardMeta, file_sha256, manifest_row
from datapipe.tokens.shard_writer import write_shard


def pack_source(spec: RunSpec, source: str) -> dict[str, Any]:
    """Pack one source's tokens into Arrow shards, per split, in one task (the single-task packer)."""
    started = time.perf_counter()
    folder = RunFolder(Path(spec.root))
    manifest = [row for split in ("train", "val") for row in _pack_split(spec, folder, source, split)]
    return {"source": source, "shards": manifest, "seconds": round(time.perf_counter() - started, 3)}


def pack_range(spec: RunSpec, rng: PackRange) -> dict[str, Any]:
    """One task of parallel packing: whole output shard files of one (source, split)."""
    started = time.perf_counter()
    folder = RunFolder(Path(spec.root))
    if rng.n_files is None:
        manifest = _pack_split(spec, folder, rng.source, rng.split)
    else:
        manifest = _pack_concat_range(spec, folder, rng)
    return {
        "source": rng.source,
        "split": rng.split,
        "range": rng.index,
        "shards": manifest,
        "seconds": round(time.perf_counter() - started, 3),
    }


def _packing_setup(spec: RunSpec, folder: RunFolder, source: str, split: str, first_file: int = 0):
    """The packer, shard buffer, manifest and shard writer of one (source, split)."""
    assert spec.tokenizer is not None and spec.tokenize is not None
    info, cfg = spec.tokenizer, spec.tokenize
    row_len = cfg.seq_len + (1 if cfg.labels else 0)
    dtype = np.dtype(info.dtype)
    meta = ShardMeta(
        tokenizer_fingerprint=info.fingerprint,
        vocab_size=info.vocab_size,
        seq_len=cfg.seq_len,
        row_len=row_len,
        eos_id=info.eos_id,
        pad_id=info.pad_id,
        bos_id=info.bos_id,
        packing=cfg.packing,
        source=source,
        split=split,
        dtype=info.dtype,
    )
    packer = make_packer(cfg.packing, row_len, info.pad_id, dtype, cfg.bestfit_window)
    buffer = ShardBuffer(cfg.rows_per_shard, row_len, dtype)
    manifest: list[dict[str, Any]] = []

    def emit(shards: Iterable[PackedRows]) -> None:
        """Write each full shard as it comes; the reference to a written one is dropped before the
        packer goes on, so the next shard fills while the last one is freed. A loop variable in the
        caller kept a written shard (rows_per_shard x row_len tokens) alive while the whole next one
        filled: two shards at once, a pack task of 2^26 tokens peaking 52 MiB above its start where
        one of a sixteenth of that grew 13."""
        for rows in shards:
            write(rows)
            del rows

    def write(rows: PackedRows) -> None:
        path = folder.shard_file(source, split, first_file + len(manifest))
        written = write_shard(
            path, rows.tokens, rows.doc_start_splits, rows.doc_start_values, rows.n_tokens, shard_meta_for(meta, rows)
        )
        manifest.append(
            manifest_row(
                path.relative_to(folder.root).as_posix(),
                source,
                split,
                written.rows,
                written.tokens,
                written.documents,
                file_sha256(path),
                info.fingerprint,
                cfg.seq_len,
                row_len,
                cfg.packing,
            )
        )

    return packer, buffer, manifest, emit


def _split_pieces(path: Path, split: str, round_of: tuple[int, int] | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One input shard's tokens of one split in stream order, a record batch at a time: the batch's
    documents of the split as (flat tokens, where its documents start in them, from 0).

    The file is read a batch at a time (not mapped whole and filtered: that held the file's pages,
    a filtered copy and a combined copy at once), so a pack task's memory is one input batch plus
    the shard being filled, whatever the size of the map task's output.

    ``round_of`` (rounds, r): only the documents with a copy in round r of a source with mixture
    repeats (``config.mixture.in_round``).
    """
    with pa.OSFile(str(path)) as f:
        reader = pa.ipc.open_file(f)
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            keep = pc.fill_null(pc.equal(batch.column("split"), split), False).to_numpy(zero_copy_only=False)
            if round_of is not None:
                spread = spread_offsets(batch.column("id").to_pylist())
                keep &= in_round(spread, batch.column(REPEAT_COLUMN).to_numpy(zero_copy_only=False), *round_of)
            if not keep.any():
                continue
            offsets = batch.column("tokens").offsets.to_numpy()
            values = batch.column("tokens").values.to_numpy()[offsets[0] : offsets[-1]]
            lengths = np.diff(offsets)
            if not keep.all():  # the other split's documents out, in one vectorized copy
                values, lengths = values[np.repeat(keep, lengths)], lengths[keep]
            yield values, np.cumsum(lengths) - lengths


def _pack_split(spec: RunSpec, folder: RunFolder, source: str, split: str) -> list[dict[str, Any]]:
    """One (source, split) in one task. With mixture repeats the stream is rounds over the source's
    input shards, as many as the largest count: a document counted k times is in k of them, once
    each, about a k-th of the stream apart (``config.mixture.in_round``); a count of 0 leaves it out."""
    packer, buffer, manifest, emit = _packing_setup(spec, folder, source, split)
    paths = [p for shard in spec.shards_of(source) if (p := folder.tokens_file(shard.key)).exists()]  # absent: nothing kept
    rounds: list[tuple[int, int] | None] = [None]  # no repeats: one pass, every document once
    if source in spec.repeats:
        n_rounds = _most_repeats(paths)  # 0 when every count is 0: nothing is packed
        rounds = [(n_rounds, r) for r in range(n_rounds)]
    for round_of in rounds:
        for path in paths:
            for flat, starts in _split_pieces(path, split, round_of):
                emit(buffer.add(packer.add(flat, np.append(starts, len(flat)))))
    emit(buffer.add(packer.finish()))
    emit(buffer.finish())
    return manifest


def _most_repeats(paths: list[Path]) -> int:
    """The largest mixture count of the documents in these token files (both splits): the rounds of the stream."""
    most = 0
    for path in paths:
        with pa.memory_map(str(path)) as f:  # mapped: only the count column's pages are read, not the tokens
            reader = pa.ipc.open_file(f)
            for i in range(reader.num_record_batches):
                counts = reader.get_batch(i).column(REPEAT_COLUMN)
                most = max(most, int(pc.max(counts).as_py() or 0))
    return most


def _pack_concat_range(spec: RunSpec, folder: RunFolder, rng: PackRange) -> list[dict[str, Any]]:
    """Shard files ``first_file`` .. ``first_file + n_files - 1`` exactly as the single packer writes them.

    Concat packing cuts the split's token stream every row_len tokens and every rows_per_shard rows
    a file, so file f holds stream tokens [f * R * L, (f + 1) * R * L): the task reads only the input
    shards overlapping that stretch (placed by the per-shard token counts of the map markers) and
    packs it; the last range also writes the padded last row, as the single packer does.
    """
    assert spec.tokenize is not None and rng.n_files is not None
    packer, buffer, manifest, emit = _packing_setup(spec, folder, rng.source, rng.split, rng.first_file)
    span = buffer.rows_per_shard * buffer.row_len
    lo_tok = rng.first_file * span
    hi_tok = (rng.first_file + rng.n_files) * span if not rng.last else None
    at = rng.stream_start  # stream position of the current input shard's first token of this split
    for key, n in rng.shard_tokens:
        if n == 0 or at + n <= lo_tok:
            at += n
            continue
        if hi_tok is not None and at >= hi_tok:
            break
        seen = 0  # tokens of this input shard's split stream passed so far
        for flat, starts in _split_pieces(folder.tokens_file(key), rng.split):
            # This piece is stream positions [at + seen, at + seen + len(flat)); keep what lies in the range.
            lo = max(lo_tok - at - seen, 0)
            hi = len(flat) if hi_tok is None else min(hi_tok - at - seen, len(flat))
            seen += len(flat)
            if hi <= lo:
                continue
            inside = starts[(starts >= lo) & (starts < hi)] - lo
            emit(buffer.add(packer.add_pieces(flat[lo:hi], inside)))
        assert seen == n, f"token counts of {key} differ from its map marker"
        at += n
    if rng.last:
        emit(buffer.add(packer.finish()))
        emit(buffer.finish())
    if len(manifest) != rng.n_files:
        raise RuntimeError(f"pack range {rng.key} wrote {len(manifest)} shard files, planned {rng.n_files}")
    return manifest
