"""The work of one task, as plain functions: no Ray here, so each is testable on its own.

Each function writes its outputs atomically, then returns the marker contents
(counts, timings) that the runner records. Running one twice gives the same files.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datapipe.atomic import atomic_path, note_written, temp_path_for
from datapipe.engine.isolate import Isolator, Step
from datapipe.engine.pack_plan import PackRange
from datapipe.engine.plan import RunSpec, Segment, Shard, build_stage
from datapipe.engine.run_folder import RunFolder
from datapipe.engine.splits import InputRange
from datapipe.packing import PackedRows, ShardBuffer, make_packer, shard_meta_for
from datapipe.readers import READERS, InputFile, ReadBatch, reader_path
from datapipe.readers.base import BatchBuilder, describe_error
from datapipe.schema import READ_STAGE
from datapipe.shard_format import ShardMeta, file_sha256, write_shard
from datapipe.stages.base import (
    ROW_KEY_SHIFT,
    Decision,
    PartitionResult,
    ReduceInputs,
    ShuffledGlobalStage,
    Stage,
)
from datapipe.tokenize import TOKENS_TYPE, assign_split, encode_documents

_NULL_STR = pa.scalar(None, pa.string())
_TOKENS = "__tokens"  # transient column between encoding and the token sink
TOKENIZE_STAGE = "tokenize"  # stage name of documents the tokenizer raised on
# Text per batch through the stages. `batch_size` counts documents, and 1000 long documents
# (10 KB each in the TiDB docs) took a map worker from 350 MB to 900 MB inside the langid and
# quality stages, whose working memory grows with the batch's text; 4 MB keeps that near 100 MB.
MAX_BATCH_TEXT_BYTES = 4 << 20


class ParquetSink:
    """A Parquet file written batch by batch to a temporary name and renamed on close.

    It opens on the first non-empty batch, so a shard with nothing to write leaves no file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows = 0
        self._tmp: Path | None = None
        self._writer: pq.ParquetWriter | None = None

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._tmp = temp_path_for(self.path)
            # zstd: text compresses 3-4x; dictionary-encoded source/kind columns cost nothing.
            self._writer = pq.ParquetWriter(self._tmp, table.schema, compression="zstd")
        else:
            table = table.select(self._writer.schema.names).cast(self._writer.schema)
        self._writer.write_table(table)
        self.rows += table.num_rows

    def close(self) -> None:
        if self._writer is None:
            self.path.unlink(missing_ok=True)  # a stale file from an earlier attempt must not count
            return
        self._writer.close()
        assert self._tmp is not None
        self._tmp.replace(self.path)
        note_written(self.path)

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            assert self._tmp is not None
            self._tmp.unlink(missing_ok=True)


class ShuffleSink:
    """A shard's shuffle rows, sorted by partition and written one row group per partition,
    so each partition task reads only its own row groups (Parquet statistics skip the rest)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.parts: list[pa.Table] = []

    def write(self, table: pa.Table) -> None:
        if table.num_rows:
            self.parts.append(table)

    def close(self) -> None:
        if not self.parts:
            self.path.unlink(missing_ok=True)
            return
        table = pa.concat_tables(self.parts).sort_by([("part", "ascending")])
        part = table["part"].to_numpy()
        bounds = np.flatnonzero(np.diff(part)) + 1
        with atomic_path(self.path) as tmp, pq.ParquetWriter(tmp, table.schema, compression="zstd") as writer:
            for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(part)]):
                writer.write_table(table.slice(lo, hi - lo))
        self.parts = []

    def abort(self) -> None:
        self.parts = []


class TokenSink:
    """Per-shard token lists (id, split, tokens) as an Arrow IPC file for the packing phase."""

    SCHEMA = pa.schema([("id", pa.string()), ("split", pa.string()), ("tokens", TOKENS_TYPE)])

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tokens = 0
        self.split_tokens: dict[str, int] = {}
        self._ctx = atomic_path(path)
        self._tmp = self._ctx.__enter__()
        self._writer = pa.ipc.new_file(str(self._tmp), self.SCHEMA)

    def write(self, ids: pa.Array, split: pa.Array, tokens: pa.LargeListArray) -> None:
        self._writer.write_table(pa.table([ids, split, tokens], schema=self.SCHEMA))
        lengths = pc.list_value_length(tokens)  # .values ignores a slice's offset
        self.tokens += int(pc.sum(lengths).as_py() or 0)
        for name in ("train", "val"):  # per split: parallel packing places its ranges from these
            n = int(pc.sum(pc.if_else(pc.equal(split, name), lengths, 0)).as_py() or 0)
            self.split_tokens[name] = self.split_tokens.get(name, 0) + n

    def close(self) -> None:
        self._writer.close()
        self._ctx.__exit__(None, None, None)

    def abort(self) -> None:
        self._writer.close()
        self._ctx.__exit__(RuntimeError, RuntimeError("aborted"), None)


class MapCounts:
    def __init__(self) -> None:
        self.docs_in = 0
        self.kept = 0
        self.tokens = 0
        self.split_tokens: dict[str, int] = {}
        self.stage_in: dict[int, int] = defaultdict(int)  # documents reaching the stage
        self.stage_skipped: dict[int, int] = defaultdict(int)  # of those, passed untouched (kind not in its kinds)
        self.rejected: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def as_dict(self) -> dict[str, Any]:
        return {"docs_in": self.docs_in, "kept": self.kept, "tokens": self.tokens, "split_tokens": self.split_tokens,
                "stage_in": {str(k): v for k, v in sorted(self.stage_in.items())},
                "stage_skipped": {str(k): v for k, v in sorted(self.stage_skipped.items())},
                "rejected": {str(k): dict(v) for k, v in sorted(self.rejected.items())}}


def map_shard(spec: RunSpec, shard: Shard, segment: Segment) -> dict[str, Any]:
    """Run one map segment over one input shard; returns the marker contents."""
    started = time.perf_counter()
    cpu_started = time.process_time()  # this worker's CPU (all its threads): for utilisation figures
    folder = RunFolder(Path(spec.root))
    counts = MapCounts()
    rejects: dict[tuple[int, tuple[str, ...]], ParquetSink] = {}
    out = ParquetSink(folder.docs_file(shard.key) if segment.final else folder.map_output(segment.index, shard.key))
    tokens = TokenSink(folder.tokens_file(shard.key)) if segment.final and spec.tokenizer else None
    decisions = _load_decisions(spec, folder, segment, shard)
    state = _load_state(folder, segment, shard)  # what the applied stage's apply() needs besides decisions
    applied = build_stage(spec, segment.apply_global) if segment.apply_global else None
    stages = [(pos, build_stage(spec, pos)) for pos in segment.stages]
    skips = {pos for pos, st in stages if not st.applies_to(shard.source.kind)}  # passed through, counted
    compute_global = build_stage(spec, segment.compute_global) if segment.compute_global else None
    shuffle = (ShuffleSink(folder.shuffle_file(segment.index, shard.key))
               if isinstance(compute_global, ShuffledGlobalStage) else None)

    def reject(position: int, stage: str, batch: pa.Table, decision: Decision,
               extra: dict[str, pa.Array] | None = None) -> pa.Table:
        drop = pc.fill_null(pc.is_valid(decision.reason), False)
        n_drop = pc.sum(drop).as_py() or 0
        if n_drop == 0:
            return batch
        dropped = batch.filter(drop)
        for name, values in (extra or {}).items():
            dropped = dropped.append_column(name, values.filter(drop))
        detail = decision.detail if decision.detail is not None else pa.nulls(batch.num_rows, pa.string())
        dropped = (dropped.append_column("stage", pa.array([stage] * n_drop, pa.string()))
                   .append_column("reason", decision.reason.filter(drop))
                   .append_column("detail", detail.filter(drop)))
        # One file per stage position and column set: reading rejects bad records with only the
        # base columns and records without text with all the reader's columns, for example.
        sink_key = (position, tuple(dropped.column_names))
        if sink_key not in rejects:
            n = sum(1 for p, _ in rejects if p == position)
            name = stage if n == 0 else f"{stage}-{n}"
            rejects[sink_key] = ParquetSink(folder.reject_file(shard.key, position, name))
        rejects[sink_key].write(dropped)
        for reason, n in _value_counts(dropped["reason"]):
            counts.rejected[position][reason] += n
        return batch.filter(pc.invert(drop))

    isolators: dict[int, Isolator] = {}
    tokenize_pos = len(spec.stages) + 1  # tokenizing counts as a stage after the last one

    def isolated(position: int, stage: str, batch: pa.Table, step: Step) -> tuple[pa.Table, Decision]:
        """``step`` over the batch; rows on which it raises become record_error rejects of the stage."""
        if position not in isolators:
            isolators[position] = Isolator(stage, spec.limits.max_record_errors, spec.limits.max_record_error_fraction)
        out, decision, bad, details = isolators[position].run(step, batch)
        if bad is not None:
            reject(position, stage, bad, Decision(pa.array(["record_error"] * bad.num_rows, pa.string()),
                                                  pa.array(details, pa.string())))
        return out, decision

    rows_read = 0  # position in the previous segment's output: the row keys the reduce used
    try:
        for batch in _bounded(_segment_input(spec, folder, shard, segment, counts, reject), MAX_BATCH_TEXT_BYTES):
            if segment.apply_global is not None:
                name = spec.stage_name(segment.apply_global)
                counts.stage_in[segment.apply_global] += batch.num_rows
                keys = (shard.ordinal << ROW_KEY_SHIFT) + rows_read + np.arange(batch.num_rows, dtype=np.int64)
                rows_read += batch.num_rows
                decision, extra = _join_decisions(batch, decisions)
                keys = keys[~pc.fill_null(pc.is_valid(decision.reason), False).to_numpy(zero_copy_only=False)]
                batch = reject(segment.apply_global, name, batch, decision, extra)
                transient = [c for c in applied.transient_columns if c in batch.column_names]
                batch = batch.drop_columns(transient)  # e.g. signatures: needed only by the reduce
                batch, decision = applied.apply(batch, keys, state)  # e.g. boilerplate lines removed
                batch = reject(segment.apply_global, name, batch, decision)
            for pos, stage in stages:
                counts.stage_in[pos] += batch.num_rows
                if pos in skips:
                    counts.stage_skipped[pos] += batch.num_rows
                    continue
                if batch.num_rows == 0:
                    break
                batch, decision = isolated(pos, stage.name, batch, _stage_step(stage))
                batch = reject(pos, stage.name, batch, decision)
            if compute_global is not None and batch.num_rows:
                batch, _ = isolated(segment.compute_global, compute_global.name, batch, _compute_step(compute_global))
                if shuffle is not None and batch.num_rows:  # row keys: this shard's ordinal, then the row in its output
                    first = (shard.ordinal << ROW_KEY_SHIFT) + counts.kept
                    shuffle.write(compute_global.shuffle(batch, first))  # type: ignore[union-attr]
            if tokens is not None and batch.num_rows:
                counts.stage_in[tokenize_pos] += batch.num_rows
                batch, _ = isolated(tokenize_pos, TOKENIZE_STAGE, batch, lambda b: _encode(spec, b))
                batch = _write_tokens(batch, tokens)
            counts.kept += batch.num_rows
            out.write(batch)
        out.close()
        for sink in rejects.values():
            sink.close()
        if shuffle is not None:
            shuffle.close()
        if tokens is not None:
            tokens.close()
            counts.tokens = tokens.tokens
            counts.split_tokens = tokens.split_tokens
    except BaseException:
        out.abort()
        for sink in [*rejects.values(), *([shuffle] if shuffle is not None else [])]:
            sink.abort()
        if tokens is not None:
            tokens.abort()
        raise
    result = {"shard": shard.key, "segment": segment.index, **counts.as_dict(),
              "seconds": round(time.perf_counter() - started, 3),
              "cpu_seconds": round(time.process_time() - cpu_started, 3)}
    if segment.index == 0:
        # Each input file is hashed once: by its whole-file task, or by the task of its first range
        # (a 20 GB file split in 80 ranges is still read through for its hash once, not 80 times).
        hashed = [{"path": r.path, "bytes": Path(r.path).stat().st_size, "sha256": file_sha256(r.path)}
                  for r in shard.inputs if r.part == 0 and Path(r.path).is_file()]
        if hashed:
            result["inputs"] = hashed
    return result


def _segment_input(spec: RunSpec, folder: RunFolder, shard: Shard, segment: Segment, counts: MapCounts,
                   reject: Any) -> Iterator[pa.Table]:
    if segment.index > 0:
        prev = folder.map_output(segment.index - 1, shard.key)
        if not prev.exists():
            return  # every document of this shard was dropped earlier
        for rb in pq.ParquetFile(prev).iter_batches(batch_size=spec.batch_size):
            yield pa.Table.from_batches([rb])
        return
    for piece in shard.inputs:
        yield from _read_piece(spec, folder, shard, piece, counts, reject)


def _read_piece(spec: RunSpec, folder: RunFolder, shard: Shard, piece: InputRange, counts: MapCounts,
                reject: Any) -> Iterator[pa.Table]:
    """The documents of one input file, or of one range of it (engine/splits.py)."""
    reader = READERS[piece.format]
    first = _first_record(folder, shard, piece) if not piece.whole else 0
    file = InputFile(reader_path(piece.path, piece.format), piece.input_name, shard.source, spec.limits,
                     start=piece.start, end=piece.end, first_record=first, ranged=not piece.whole)
    for rb in _guarded(reader(file, spec.batch_size), file):
        docs = rb.docs
        counts.docs_in += docs.num_rows
        docs = _with_n_chars(docs)
        if rb.rejects is not None and rb.rejects.num_rows:
            counts.docs_in += rb.rejects.num_rows
            r = rb.rejects
            base = r.drop_columns(["reason", "detail"])
            base = _with_n_chars(base)
            reject(0, READ_STAGE, base, Decision(r["reason"].combine_chunks(), r["detail"].combine_chunks()))
        missing = pc.is_null(docs["text"])
        docs = reject(0, READ_STAGE, docs, Decision(pc.if_else(missing, "missing_text", _NULL_STR)))
        yield docs


def _first_record(folder: RunFolder, shard: Shard, piece: InputRange) -> int:
    """Records before a range that the reader cannot know by itself: for JSONL, the newlines before
    it (its global line numbering), from the ``lines`` pre-pass markers of the file's earlier ranges
    (counted here when a marker is missing, e.g. a task run on its own). Parquet and WARC ranges
    number their records from the file's own structure: 0."""
    if piece.format != "jsonl" or piece.part == 0:
        return 0
    from datapipe.engine.splits import count_newlines

    prefix = shard.key.rsplit(".part", 1)[0]
    total = 0
    for j in range(piece.part):
        marker = folder.read_marker(LINES_PHASE, f"{prefix}.part{j:04d}")
        if marker is None:
            starts = _range_starts(piece)
            marker = {"newlines": count_newlines(piece.path, starts[j], starts[j + 1])}
        total += int(marker["newlines"])
    return total


def _range_starts(piece: InputRange) -> list[int]:
    """Byte starts of the file's ranges before and including ``piece`` (the planner cuts JSONL evenly)."""
    step = piece.start // piece.part
    return [step * j for j in range(piece.part + 1)]


LINES_PHASE = "lines"  # pre-pass: newlines per JSONL range, for global line numbers


def count_range_lines(spec: RunSpec, shard: Shard) -> dict[str, Any]:
    """One task of the ``lines`` pre-pass: the newlines in one JSONL range."""
    from datapipe.engine.splits import count_newlines

    started, cpu_started = time.perf_counter(), time.process_time()
    piece = shard.inputs[0]
    return {"shard": shard.key, "newlines": count_newlines(piece.path, piece.start, piece.end),
            "seconds": round(time.perf_counter() - started, 3),
            "cpu_seconds": round(time.process_time() - cpu_started, 3)}


def _bounded(batches: Iterator[pa.Table], max_bytes: int) -> Iterator[pa.Table]:
    """Each batch, cut into consecutive slices of at most ``max_bytes`` of text (a slice holds at
    least one document). Same documents in the same order, so the same outputs."""
    for batch in batches:
        if batch.num_rows <= 1 or "text" not in batch.column_names:
            yield batch
            continue
        sizes = pc.binary_length(batch["text"]).to_numpy(zero_copy_only=False)
        sizes = np.nan_to_num(sizes.astype(np.float64))  # null text counts 0
        if sizes.sum() <= max_bytes:
            yield batch
            continue
        start, size = 0, 0.0
        for i, n in enumerate(sizes.tolist()):
            if i > start and size + n > max_bytes:
                yield batch.slice(start, i - start)
                start, size = i, 0.0
            size += n
        yield batch.slice(start)


def _guarded(batches: Iterator[ReadBatch], file: InputFile) -> Iterator[ReadBatch]:
    """A reader's batches; if the reader itself raises after giving records, the rest of the file is
    one ``reader_error`` reject (readers turn bad data into rejects themselves: this is the net
    under their bugs). A reader that raises before giving any record re-raises: that is a broken
    reader or option, to be fixed, not a file to skip silently."""
    given = 0
    try:
        for batch in batches:
            given += batch.docs.num_rows + (batch.rejects.num_rows if batch.rejects is not None else 0)
            yield batch
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:
        if given == 0:
            raise
        out = BatchBuilder(file, 1)
        out.reject(f"after-{given}", "reader_error",
                   f"the reader failed after {given} records; the rest of the file is not read: "
                   f"{describe_error(exc)}")
        yield out.flush()  # type: ignore[misc]


def _with_n_chars(table: pa.Table) -> pa.Table:
    """Every document row, kept or rejected, carries its length in characters (for the audit)."""
    return table.append_column("n_chars", pc.cast(pc.fill_null(pc.utf8_length(table["text"]), 0), pa.int64()))


def _load_decisions(spec: RunSpec, folder: RunFolder, segment: Segment, shard: Shard) -> pa.Table | None:
    if segment.apply_global is None:
        return None
    stage = build_stage(spec, segment.apply_global)
    if isinstance(stage, ShuffledGlobalStage) and stage.decides_in_partitions:
        return partition_decisions(folder, segment.index - 1, stage, shard.ordinal)
    path = folder.decisions_file(segment.index - 1, shard.key)
    return pq.read_table(path) if path.exists() else None


def _load_state(folder: RunFolder, segment: Segment, shard: Shard) -> pa.Table | None:
    """The applied stage's ``combine_state``: this shard's rows where it is per shard, else all of it."""
    if segment.apply_global is None:
        return None
    path = folder.state_file(segment.index - 1)
    if not path.exists():
        return None
    if "shard" in pq.read_schema(path).names:
        return pq.read_table(path, filters=[("shard", "=", shard.ordinal)])
    return pq.read_table(path)


def partition_decisions(folder: RunFolder, segment: int, stage: ShuffledGlobalStage, ordinal: int) -> pa.Table | None:
    """One shard's decisions, gathered from every partition output of every round (no combine step)."""
    import pyarrow.dataset as pads

    files = [str(f) for r in range(stage.rounds()) for p in range(stage.partitions())
             if (f := folder.partition_output(segment, p, r)).exists()]
    if not files:
        return None
    return pads.dataset(files, format="parquet").to_table(filter=pads.field("shard") == ordinal)


def _join_decisions(batch: pa.Table, decisions: pa.Table | None) -> tuple[Decision, dict[str, pa.Array]]:
    if decisions is None or decisions.num_rows == 0:
        return Decision.keep_all(batch.num_rows), {}
    # index_in keeps the batch's row order (a hash join would not).
    idx = pc.index_in(batch["id"], value_set=decisions["id"])
    picked = decisions.take(pc.fill_null(idx, 0))
    hit = pc.is_valid(idx)

    def col(name: str) -> pa.Array:
        values = picked[name].combine_chunks()
        return pc.if_else(hit, values, pa.scalar(None, values.type))

    extra = {n: col(n) for n in decisions.column_names if n not in ("id", "shard", "reason", "detail")}
    return Decision(col("reason"), col("detail")), extra


def _stage_step(stage: Stage) -> Step:
    def step(batch: pa.Table) -> tuple[pa.Table, Decision]:
        computed = stage.compute(batch)
        return computed, stage.decide(computed)
    return step


def _compute_step(stage: Stage) -> Step:
    def step(batch: pa.Table) -> tuple[pa.Table, Decision]:
        computed = stage.compute(batch)
        return computed, Decision.keep_all(computed.num_rows)
    return step


def _encode(spec: RunSpec, batch: pa.Table) -> tuple[pa.Table, Decision]:
    """Token ids per document as a transient column (written to the token sink, then dropped)."""
    assert spec.tokenizer is not None and spec.tokenize is not None
    texts = pc.fill_null(batch["text"], "").to_pylist()
    tokens = encode_documents(texts, spec.tokenizer)
    split = assign_split(batch["id"].to_pylist(), spec.tokenize.val_fraction)
    batch = batch.append_column("n_tokens", pc.cast(pc.list_value_length(tokens), pa.int64()))
    batch = batch.append_column("split", split).append_column(_TOKENS, tokens)
    return batch, Decision.keep_all(batch.num_rows)


def _write_tokens(batch: pa.Table, sink: TokenSink) -> pa.Table:
    sink.write(batch["id"].combine_chunks(), batch["split"].combine_chunks(), batch[_TOKENS].combine_chunks())
    return batch.drop_columns([_TOKENS])


def _value_counts(values: pa.ChunkedArray) -> list[tuple[str, int]]:
    vc = pc.value_counts(values)
    return [(v["values"], v["counts"]) for v in vc.to_pylist()]


def _reduce_inputs(spec: RunSpec, folder: RunFolder, segment: Segment) -> ReduceInputs:
    present = [(s.ordinal, p) for s in spec.shards if (p := folder.map_output(segment.index, s.key)).exists()]
    scratch = folder.work / f"reduce{segment.index}-scratch"
    return ReduceInputs([str(p) for _, p in present], [o for o, _ in present], str(scratch))


def reduce_stage(spec: RunSpec, segment: Segment) -> dict[str, Any]:
    """The corpus-wide step of the global stage that ends ``segment``."""
    started = time.perf_counter()
    folder = RunFolder(Path(spec.root))
    assert segment.compute_global is not None
    stage = build_stage(spec, segment.compute_global)
    present = [(s.ordinal, folder.map_output(segment.index, s.key)) for s in spec.shards]
    present = [(o, p) for o, p in present if p.exists()]
    scratch = folder.work / f"reduce{segment.index}-scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    inputs = ReduceInputs([str(p) for _, p in present], [o for o, _ in present], str(scratch))
    if isinstance(stage, ShuffledGlobalStage):
        parts = [folder.partition_output(segment.index, p) for p in range(stage.partitions())]
        decisions = stage.combine([str(p) for p in parts if p.exists()], inputs)
        state = stage.combine_state([str(p) for p in parts if p.exists()], inputs)
        folder.state_file(segment.index).unlink(missing_ok=True)  # a stale one must not apply
        if state is not None:
            with atomic_path(folder.state_file(segment.index)) as tmp:
                pq.write_table(state, tmp)
    elif present:
        decisions = stage.reduce(inputs)
    else:
        decisions = pa.table({"id": pa.array([], pa.string()), "shard": pa.array([], pa.int32())})
    # Decisions come sorted by shard: slice each shard's rows instead of filtering per shard.
    decisions = decisions.sort_by([("shard", "ascending")])
    shard_col = decisions["shard"].to_numpy()
    written = 0
    for shard in spec.shards:
        path = folder.decisions_file(segment.index, shard.key)
        lo, hi = np.searchsorted(shard_col, [shard.ordinal, shard.ordinal + 1])
        if hi == lo:
            path.unlink(missing_ok=True)  # a stale file from an earlier attempt must not apply
            continue
        with atomic_path(path) as tmp:
            pq.write_table(decisions.slice(lo, hi - lo), tmp)
        written += int(hi - lo)
    return {"segment": segment.index, "stage": spec.stage_name(segment.compute_global), "decisions": written,
            "seconds": round(time.perf_counter() - started, 3)}


def reduce_partition(spec: RunSpec, segment: Segment, partition: int, round: int = 0) -> dict[str, Any]:
    """One partition of one round of a shuffled global stage: its rows from every shard (round 0)
    or from every partition of the round before, reduced."""
    import pyarrow.dataset as pads

    started = time.perf_counter()
    folder = RunFolder(Path(spec.root))
    stage = build_stage(spec, segment.compute_global)  # type: ignore[arg-type]
    assert isinstance(stage, ShuffledGlobalStage)
    if round == 0:
        sources = [folder.shuffle_file(segment.index, s.key) for s in spec.shards]
    else:
        sources = [folder.forward_file(segment.index, round - 1, p) for p in range(stage.partitions())]
    files = [str(f) for f in sources if f.exists()]
    # Row-group statistics on `part` let the scan skip other partitions' data.
    rows = pads.dataset(files, format="parquet").to_table(filter=pads.field("part") == partition) if files else None
    result = None
    if rows is not None and rows.num_rows:
        result = stage.reduce_partition(rows, round, _reduce_inputs(spec, folder, segment))
    if not isinstance(result, PartitionResult):
        result = PartitionResult(result)
    out = folder.partition_output(segment.index, partition, round)
    n = _write_or_remove(out, result.output, sort_by_shard=stage.decides_in_partitions)
    forward = ShuffleSink(folder.forward_file(segment.index, round, partition))
    if round + 1 < stage.rounds() and result.forward is not None:
        forward.write(result.forward)
    forward.close()  # nothing to forward: removes a stale file of an earlier attempt
    return {"segment": segment.index, "partition": partition, "round": round,
            "rows_in": rows.num_rows if rows is not None else 0, "rows_out": n,
            "forwarded": result.forward.num_rows if result.forward is not None else 0,
            "seconds": round_(time.perf_counter() - started)}


def _write_or_remove(path: Path, table: pa.Table | None, sort_by_shard: bool) -> int:
    if table is None or table.num_rows == 0:
        path.unlink(missing_ok=True)  # a stale file from an earlier attempt must not count
        return 0
    if sort_by_shard:
        # Decisions read by each shard's map task: sorted by shard in small row groups, so that
        # task's filter on `shard` skips the rest by row-group statistics.
        table = table.sort_by([("shard", "ascending")])
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, row_group_size=_DECISION_ROW_GROUP)
    return table.num_rows


_DECISION_ROW_GROUP = 1 << 15


def round_(x: float) -> float:
    return round(x, 3)


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
    return {"source": rng.source, "split": rng.split, "range": rng.index, "shards": manifest,
            "seconds": round(time.perf_counter() - started, 3)}


def _packing_setup(spec: RunSpec, folder: RunFolder, source: str, split: str, first_file: int = 0):
    """The packer, shard buffer, manifest and shard writer of one (source, split)."""
    assert spec.tokenizer is not None and spec.tokenize is not None
    info, cfg = spec.tokenizer, spec.tokenize
    row_len = cfg.seq_len + (1 if cfg.labels else 0)
    dtype = np.dtype(info.dtype)
    meta = ShardMeta(tokenizer_fingerprint=info.fingerprint, vocab_size=info.vocab_size, seq_len=cfg.seq_len,
                     row_len=row_len, eos_id=info.eos_id, pad_id=info.pad_id, bos_id=info.bos_id,
                     packing=cfg.packing, source=source, split=split, dtype=info.dtype)
    packer = make_packer(cfg.packing, row_len, info.pad_id, dtype, cfg.bestfit_window)
    buffer = ShardBuffer(cfg.rows_per_shard, row_len, dtype)
    manifest: list[dict[str, Any]] = []

    def emit(rows: PackedRows) -> None:
        path = folder.shards_dir / source / f"{split}-{first_file + len(manifest):05d}.arrow"
        written = write_shard(path, rows.tokens, rows.doc_start_splits, rows.doc_start_values, rows.n_tokens,
                              shard_meta_for(meta, rows))
        manifest.append({"path": path.relative_to(folder.root).as_posix(), "source": source, "split": split,
                         "rows": written.rows, "tokens": written.tokens, "documents": written.documents,
                         "sha256": file_sha256(path), "tokenizer_fingerprint": info.fingerprint,
                         "seq_len": cfg.seq_len, "row_len": row_len, "packing": cfg.packing})

    return packer, buffer, manifest, emit


def _split_tokens(path: Path, split: str) -> tuple[np.ndarray, np.ndarray] | None:
    """One shard's tokens of one split: the flat stream and document offsets (n_docs + 1, from 0)."""
    with pa.memory_map(str(path)) as mm:
        table = pa.ipc.open_file(mm).read_all()
        part = table.filter(pc.equal(table["split"], split))
        if part.num_rows == 0:
            return None
        lists = part["tokens"].combine_chunks()
        offsets = lists.offsets.to_numpy()
        flat = lists.flatten().to_numpy()  # flatten() honours the array's slice offset
        return flat, offsets - offsets[0]


def _pack_split(spec: RunSpec, folder: RunFolder, source: str, split: str) -> list[dict[str, Any]]:
    packer, buffer, manifest, emit = _packing_setup(spec, folder, source, split)
    for shard in spec.shards_of(source):
        path = folder.tokens_file(shard.key)
        if not path.exists():
            continue  # nothing of this shard was kept
        got = _split_tokens(path, split)
        if got is None:
            continue
        for rows in buffer.add(packer.add(*got)):
            emit(rows)
    for rows in buffer.add(packer.finish()):
        emit(rows)
    for rows in buffer.finish():
        emit(rows)
    return manifest


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
        got = _split_tokens(folder.tokens_file(key), rng.split)
        assert got is not None and len(got[0]) == n, f"token counts of {key} differ from its map marker"
        flat, offsets = got
        lo = max(lo_tok - at, 0)
        hi = n if hi_tok is None else min(hi_tok - at, n)
        starts = offsets[:-1]
        starts = starts[(starts >= lo) & (starts < hi)] - lo
        for rows in buffer.add(packer.add_pieces(flat[lo:hi], starts)):
            emit(rows)
        at += n
    if rng.last:
        for rows in buffer.add(packer.finish()):
            emit(rows)
        for rows in buffer.finish():
            emit(rows)
    if len(manifest) != rng.n_files:
        raise RuntimeError(f"pack range {rng.key} wrote {len(manifest)} shard files, planned {rng.n_files}")
    return manifest
