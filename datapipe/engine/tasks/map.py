"""The map task: one input shard (or the previous segment's output of it) through one segment's stages.

Reads (or loads), applies the decisions of the global stage before, runs the per-document stages,
computes the next global stage's signals (and its shuffle rows), tokenizes in the final segment,
and writes kept documents, rejects, shuffle rows and tokens; returns the marker contents.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datapipe.audit.aggregates import task_aggregates
from datapipe.config.mixture import REPEAT_COLUMN
from datapipe.engine.plan import RunSpec, Segment, Shard, build_stage
from datapipe.engine.shuffle_plan import RunFile
from datapipe.engine.splits import InputRange
from datapipe.engine.tasks.isolate import Step
from datapipe.engine.tasks.prefetch import prefetched
from datapipe.engine.tasks.recorded import ShardSignals, tokens_with_recorded, with_recorded
from datapipe.engine.tasks.reduce import partitions_decide, shard_rows
from datapipe.engine.tasks.shard_outputs import MapCounts, ShardOutputs
from datapipe.engine.work_files import WorkFiles
from datapipe.readers import InputFile, ReadBatch, reader_path, reader_spec
from datapipe.readers.base import BatchBuilder, describe_error
from datapipe.run_folder.layout import LINES_PHASE, RunFolder
from datapipe.schema import READ_STAGE, SOURCE_LICENSE
from datapipe.stages.base import Decision, Stage
from datapipe.stages.columns import set_column
from datapipe.stages.global_stage import CombineStep, GlobalStage, PartitionStep, step_of
from datapipe.stages.row_keys import row_key, row_keys
from datapipe.storage.atomic import atomic_path
from datapipe.storage.input_reads import ReadRecord, recording_reads, unavailable
from datapipe.storage.uri import InputUnavailable, input_identity, input_key
from datapipe.tokens.encode import assign_split, encode_documents, encode_threads, encoder_used

_NULL_STR = pa.scalar(None, pa.string())
_TOKENS = "__tokens"  # transient column between encoding and the token sink
TOKENIZE_STAGE = "tokenize"  # stage name of documents the tokenizer raised on
# Text per batch through the stages. `batch_size` counts documents, and a batch of long documents
# multiplied a map worker's memory inside the langid and quality stages, whose working memory
# grows with the batch's text: bounding the text bounds it.
MAX_BATCH_TEXT_BYTES = 4 << 20
# A segment that tokenizes holds more per byte of text: the texts as Python strings, the Rust
# encodings of a sub-batch, the token arrays, the Parquet and token writers' buffers (the run's
# largest worker was always a tokenizing one); half the text per batch lowers its peak, at the
# same CPU time.
MAX_TOKENIZE_BATCH_TEXT_BYTES = 2 << 20


# A step of a map segment: a batch in, the batch on (what it drops goes to ``out``'s rejects, what
# it routes elsewhere to ``out``'s other sinks). ``segment_steps`` lists a task's steps once; the
# task runs every batch through them in order, then keeps what is left.
BatchStep = Callable[[pa.Table, ShardOutputs], pa.Table]


@dataclass
class _Built:
    """What a map task builds before its first batch: the segment's stages (set up), the global stages
    it applies and computes, and what an earlier run recorded for this shard (``run --from``)."""

    stages: list[tuple[int, Stage]]
    skips: set[int]  # stages that pass this shard's kind through untouched (counted)
    reused: dict[int, pa.Table]  # recorded signals by stage position
    recorded_tokens: pa.Table | None
    compute_global: GlobalStage | None
    partitioned: PartitionStep | None

    def told(
        self, spec: RunSpec, segment: Segment, applying: _Applying | None, work: WorkFiles, shard: Shard
    ) -> list[tuple[Stage, Path]]:
        """The stages told of this task (``Stage.start_task``), with their work folders: the global
        stages of this segment too (annotate keeps per-task state in compute, its bottom-k, and does
        paid work in apply: requests, journaled in its work folder)."""
        told: list[tuple[int | None, Stage | None]] = [
            (segment.apply_global, applying.stage if applying else None),
            (segment.compute_global, self.compute_global),
        ]
        told += [(pos, stage) for pos, stage in self.stages if pos not in self.skips]
        # Re-deciding: a stage's task folder of the earlier run (what it paid for) is carried over.
        earlier = RunFolder(spec.recorded.root) if spec.recorded is not None else None
        out: list[tuple[Stage, Path]] = []
        for at, stage in told:
            if at is not None and stage is not None:
                out.append((stage, work.stage_work_dir(at, stage.name, shard.key, earlier)))
        return out


def _build(spec: RunSpec, shard: Shard, segment: Segment) -> _Built:
    stages = [(pos, build_stage(spec, pos)) for pos in segment.stages]
    skips = {pos for pos, st in stages if not st.applies_to(shard.source.kind)}
    recorded = ShardSignals(spec.recorded, shard.key) if spec.recorded is not None else None
    reused = {pos: t for pos, _ in stages if recorded is not None and (t := recorded.table(pos)) is not None}
    recorded_tokens = recorded.tokens() if recorded is not None and segment.final and spec.tokenizer else None
    for pos, _ in stages:
        # The engine's one setup() per stage and worker (a skipped stage loads nothing; a reused one
        # only if some document has no recorded values: _reused_step).
        if pos not in skips and pos not in reused:
            build_stage(spec, pos, setup=True)
    compute_global = build_stage(spec, segment.compute_global, setup=True) if segment.compute_global else None
    partitioned = step_of(compute_global, PartitionStep) if compute_global is not None else None
    return _Built(stages, skips, reused, recorded_tokens, cast(GlobalStage | None, compute_global), partitioned)


# The runs holding a shard's rows of the deciding step it applies, by kind (decisions, state, copies):
# handed to its map task by the driver (engine/shuffles.py ``final_outputs``).
ShardRuns = dict[str, tuple[RunFile, ...]]


def map_shard(spec: RunSpec, shard: Shard, segment: Segment, decided: ShardRuns | None = None) -> dict[str, Any]:
    """Run one map segment over one input shard; returns the marker contents. ``decided``: where the
    shard's rows of the partition step before are (none: it has no deciding partition step)."""
    started = time.perf_counter()
    cpu_started = time.process_time()  # this worker's CPU (all its threads): for utilisation figures
    folder = RunFolder(Path(spec.root))
    built = _build(spec, shard, segment)
    out = ShardOutputs(spec, folder, shard, segment, shuffles=built.partitioned is not None)
    applying = _Applying(spec, folder, segment, shard, decided or {}) if segment.apply_global is not None else None
    steps = segment_steps(spec, shard, segment, built, applying, out.counts)
    # What this task reads of its input files, hashed as it is read: the run checks it at its end and
    # at every resume (engine/input_identity.py). A file a reader opens by its own means (archives,
    # folders) is known by its identity before it is read.
    opened = [_identity_only(r.path) for r in shard.inputs if segment.index == 0 and not reader_spec(r.format).streamed]
    with _reads_of(segment) as reads, _task_lifecycle(built.told(spec, segment, applying, WorkFiles(folder), shard), out):
        if applying is not None:
            out.index_copies(applying.position, applying.name, applying.copies)
        max_bytes = MAX_BATCH_TEXT_BYTES if out.tokens is None else MAX_TOKENIZE_BATCH_TEXT_BYTES
        for batch in _bounded(_segment_input(spec, folder, shard, segment, out.counts, out.reject), max_bytes):
            for step in steps:
                batch = step(batch, out)
            out.keep(batch)
    result = {
        "shard": shard.key,
        "segment": segment.index,
        **out.counts.as_dict(),
        "audit_files": out.audit_files(segment.final),
        "aggregates": _write_aggregates(spec, folder, shard, segment, out.audit_files(segment.final)),
        **({"copies_files": out.copies_files()} if applying is not None else {}),
        **({"shuffle_rows": out.shuffle.rows} if out.shuffle is not None else {}),
        "seconds": round(time.perf_counter() - started, 3),
        "cpu_seconds": round(time.process_time() - cpu_started, 3),
    }
    if segment.index == 0:
        result["reads"] = _reads_marker(shard, [r for r in opened if r is not None] + reads)
    if segment.final and spec.tokenizer is not None and (encoder := encoder_used(spec.tokenizer)) is not None:
        result["encoder"] = encoder  # which library this worker encoded with (run.json's encoder.tasks)
    return result


def segment_steps(
    spec: RunSpec, shard: Shard, segment: Segment, built: _Built, applying: _Applying | None, counts: MapCounts
) -> list[BatchStep]:
    """A map task's steps, in order: the decisions of the global stage before this segment applied,
    the per-document stages, the next global stage's signals (and shuffle rows), then in the final
    segment tokenizing, the mixture's repeat counts and the tokens written. A new kind of work in a
    map task is a step here, not a branch in the loop."""
    steps: list[BatchStep] = [applying.apply] if applying is not None else []
    if built.stages:
        steps.append(_Stages(spec, built, counts))
    if built.compute_global is not None:
        assert segment.compute_global is not None  # the position of the stage built
        steps.append(_ComputeGlobal(segment.compute_global, built.compute_global, built.partitioned, shard.ordinal))
    if segment.final and spec.tokenizer is not None:
        steps.append(_Tokenize(spec, built.recorded_tokens))
    repeat = spec.repeats.get(shard.source.name) if segment.final else None
    if repeat is not None:
        steps.append(partial(_repeat_counts, repeat))
    if segment.final and spec.tokenizer is not None:
        steps.append(_write_tokens)
    return steps


@contextlib.contextmanager
def _reads_of(segment: Segment) -> Iterator[list[ReadRecord]]:
    """The reads of input files while the block runs (the first segment's tasks read inputs; later
    ones read the previous segment's output)."""
    if segment.index != 0:
        yield []
        return
    with recording_reads() as reads:
        yield reads


@contextlib.contextmanager
def _task_lifecycle(told: list[tuple[Stage, Path]], out: ShardOutputs) -> Iterator[None]:
    """A task's stages told of it (``Stage.start_task``), then of its end: completed, before its
    outputs are closed (a stage may still fail the task then, before anything is committed), or not,
    with its outputs aborted."""
    started: list[Stage] = []
    try:
        for stage, work_dir in told:
            stage.start_task(work_dir)
            started.append(stage)
        yield
        while started:
            started.pop(0).end_task(completed=True)
        out.close()
    except BaseException:
        for stage in started:
            stage.end_task(completed=False)
        out.abort()
        raise


class _Stages:
    """The segment's per-document stages, each computing its signals and deciding (or deciding on the
    signals an earlier run recorded), its drops rejected and its edits counted. One step, not one per
    stage: once a batch is empty, the chain ends at the first stage that would run it (the stages
    after it count nothing for that batch)."""

    def __init__(self, spec: RunSpec, built: _Built, counts: MapCounts) -> None:
        self.stages, self.skips = built.stages, built.skips
        self.steps = {
            pos: _stage_step(stage) if pos not in built.reused else _reused_step(spec, pos, stage, built.reused[pos], counts)
            for pos, stage in built.stages
        }

    def __call__(self, batch: pa.Table, out: ShardOutputs) -> pa.Table:
        counts = out.counts
        for pos, stage in self.stages:
            counts.stage_in[pos] += batch.num_rows
            if pos in self.skips:
                counts.stage_skipped[pos] += batch.num_rows
                continue
            if batch.num_rows == 0:
                break
            batch, decision = out.isolated(pos, stage.name, batch, self.steps[pos])
            batch = out.reject(pos, stage.name, batch, decision)
            counts.add_edits(pos, stage, batch)
        return batch


class _ComputeGlobal:
    """The signals of the global stage that ends this segment, and its shuffle rows (row keys: this
    shard, the rows' place in its output)."""

    def __init__(self, position: int, stage: GlobalStage, partitioned: PartitionStep | None, ordinal: int) -> None:
        self.position, self.stage, self.partitioned, self.ordinal = position, stage, partitioned, ordinal
        self.step = _compute_step(stage)

    def __call__(self, batch: pa.Table, out: ShardOutputs) -> pa.Table:
        if not batch.num_rows:
            return batch
        batch, _ = out.isolated(self.position, self.stage.name, batch, self.step)
        if self.partitioned is not None and batch.num_rows:
            assert out.shuffle is not None
            out.shuffle.write(self.partitioned.shuffle(batch, row_key(self.ordinal, out.counts.kept)))
        return batch


class _Tokenize:
    """Token ids per document, a stage after the last one for the counts and the rejects."""

    def __init__(self, spec: RunSpec, recorded_tokens: pa.Table | None) -> None:
        self.position = len(spec.stages) + 1
        self.encode: Step = lambda b: _encode(spec, b, recorded_tokens)

    def __call__(self, batch: pa.Table, out: ShardOutputs) -> pa.Table:
        if not batch.num_rows:
            return batch
        out.counts.stage_in[self.position] += batch.num_rows
        batch, _ = out.isolated(self.position, TOKENIZE_STAGE, batch, self.encode)
        return batch


def _repeat_counts(repeat: Any, batch: pa.Table, out: ShardOutputs) -> pa.Table:
    """The mixture's count of each kept document (after its split is assigned)."""
    return set_column(batch, REPEAT_COLUMN, repeat.counts(batch)) if batch.num_rows else batch


def _write_aggregates(
    spec: RunSpec, folder: RunFolder, shard: Shard, segment: Segment, files: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The task's aggregate file (``audit/aggregates.py``: its documents' counts for the report and
    ``datapipe stats``), written beside its outputs; for the marker: its path and rows, None when the
    task wrote no document."""
    path = folder.aggregates_file(segment.index, shard.key)
    table = task_aggregates([(folder.root / f["path"], f["status"]) for f in files], spec.stage_types)
    if table is None:
        path.unlink(missing_ok=True)  # a stale file from an earlier attempt must not count
        return None
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return {"path": path.relative_to(folder.root).as_posix(), "rows": table.num_rows}


def _identity_only(path: str) -> ReadRecord | None:
    """A read known by the file's identity alone (no hash): for readers that open files themselves."""
    identity = input_identity(path)
    return None if identity is None else ReadRecord(input_key(path), identity, hashed=False)


def _reads_marker(shard: Shard, reads: list[ReadRecord]) -> list[dict[str, Any]]:
    """The marker's ``reads``: every open of an input, and each input of the task that was not opened
    at all (a reader that failed first) by its identity now, so that every input a task stands for
    is in its marker."""
    out = [r.as_dict() for r in reads]
    seen = {r.path for r in reads}
    for piece in shard.inputs:
        key = input_key(piece.path)
        if key not in seen and (identity := input_identity(piece.path)) is not None:
            out.append({"path": key, **identity})
            seen.add(key)
    return out


class _Applying:
    """The decisions (and ``apply``) of the global stage before this segment, for one shard."""

    def __init__(self, spec: RunSpec, folder: RunFolder, segment: Segment, shard: Shard, decided: ShardRuns) -> None:
        assert segment.apply_global is not None
        self.position = segment.apply_global
        # apply_global names a global stage (plan_segments ends a segment only at one)
        self.stage = cast(GlobalStage, build_stage(spec, self.position, setup=True))
        self.name = spec.stage_name(self.position)
        self.ordinal = shard.ordinal
        self.decisions = _load_decisions(spec, folder, segment, shard, decided)
        self.copies = _load_copies(spec, folder, segment, shard, decided)  # dropped in favour of this shard's documents
        self.state = _load_state(
            spec, folder, segment, shard, decided
        )  # what the applied stage's apply() needs besides decisions
        self.rows_read = 0  # position in the previous segment's output: the row keys the reduce used

    def apply(self, batch: pa.Table, out: ShardOutputs) -> pa.Table:
        out.counts.stage_in[self.position] += batch.num_rows
        keys = row_keys(self.ordinal, self.rows_read, batch.num_rows)
        self.rows_read += batch.num_rows
        decision, extra = _join_decisions(batch, self.decisions)
        keys = keys[~pc.fill_null(pc.is_valid(decision.reason), False).to_numpy(zero_copy_only=False)]
        batch = out.reject(self.position, self.name, batch, decision, extra)
        transient = [c for c in self.stage.transient_columns if c in batch.column_names]
        batch = batch.drop_columns(transient)  # e.g. signatures: needed only by the reduce
        batch, decision = self.stage.apply(batch, keys, self.state)  # e.g. boilerplate lines removed
        batch = out.reject(self.position, self.name, batch, decision)
        out.counts.add_edits(self.position, self.stage, batch)
        return batch


def _segment_input(
    spec: RunSpec, folder: RunFolder, shard: Shard, segment: Segment, counts: MapCounts, reject: Any
) -> Iterator[pa.Table]:
    if segment.index > 0:
        prev = WorkFiles(folder).map_output(segment.index - 1, shard.key)
        if not prev.exists():
            return  # every document of this shard was dropped earlier
        for rb in pq.ParquetFile(prev).iter_batches(batch_size=spec.batch_size):
            yield pa.Table.from_batches([rb])
        return
    for piece in shard.inputs:
        yield from _read_piece(spec, folder, shard, piece, counts, reject)


def _read_piece(
    spec: RunSpec, folder: RunFolder, shard: Shard, piece: InputRange, counts: MapCounts, reject: Any
) -> Iterator[pa.Table]:
    """The documents of one input file, or of one range of it (engine/splits.py)."""
    reader = reader_spec(piece.format).read
    first = _first_record(folder, shard, piece) if not piece.whole else 0
    file = InputFile(
        reader_path(piece.path, piece.format),
        piece.input_name,
        shard.source,
        spec.limits,
        start=piece.start,
        end=piece.end,
        first_record=first,
        ranged=not piece.whole,
    )
    batches = reader(file, spec.batch_size)
    if encode_threads() > 1 and spec.tokenizer is not None and not spec.stages:
        # A run in the driver with no per-document stage: encoding uses every core, reading one.
        batches = prefetched(batches)
    for rb in _guarded(batches, file):
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
        if shard.source.license is not None:  # sources[i].license, for the license stage (any reader)
            docs = docs.append_column(SOURCE_LICENSE, pa.array([shard.source.license] * docs.num_rows, pa.string()))
        yield docs


def _first_record(folder: RunFolder, shard: Shard, piece: InputRange) -> int:
    """Records before a range that the reader cannot know by itself (for JSONL, the newlines before
    it: its global line numbering), from the pre-pass markers of the file's earlier ranges. Formats
    without a ``prepass_count`` number their records from the file's own structure: 0."""
    count = reader_spec(piece.format).prepass_count
    if count is None or piece.part == 0:
        return 0
    prefix = shard.key.rsplit(".part", 1)[0]
    markers = [folder.markers.read(LINES_PHASE, f"{prefix}.part{j:04d}") for j in range(piece.part)]
    found = [m for m in markers if m is not None]
    if len(found) < len(markers):  # e.g. a task run on its own: count the bytes before the range
        return count(piece.path, 0, piece.start)
    return sum(int(m["newlines"]) for m in found)


def count_range_lines(spec: RunSpec, shard: Shard) -> dict[str, Any]:
    """One task of the pre-pass: what a later range's first record adds up, in one range (JSONL:
    newlines; the marker key says so, as in run folders written before formats declared it)."""
    started, cpu_started = time.perf_counter(), time.process_time()
    piece = shard.inputs[0]
    count = reader_spec(piece.format).prepass_count
    assert count is not None, f"{piece.format} needs no pre-pass"
    with recording_reads() as reads:  # later ranges number their records by it: its bytes count too
        newlines = count(piece.path, piece.start, piece.end)
    return {
        "shard": shard.key,
        "newlines": newlines,
        "reads": _reads_marker(shard, reads),
        "seconds": round(time.perf_counter() - started, 3),
        "cpu_seconds": round(time.process_time() - cpu_started, 3),
    }


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
    reader or option, to be fixed, not a file to skip silently. An input its store failed to give
    (``InputUnavailable``, noted as it was raised even where the reader caught it) fails the task:
    its documents are not bad records, and a rerun once the store is back reads them."""
    given = 0
    try:
        for batch in batches:
            if (failed := unavailable()) is not None:  # the store failed the reader: no reject stands for it
                raise failed
            given += batch.docs.num_rows + (batch.rejects.num_rows if batch.rejects is not None else 0)
            yield batch
        if (failed := unavailable()) is not None:
            raise failed
    except (MemoryError, KeyboardInterrupt, InputUnavailable):
        raise
    except Exception as exc:
        if given == 0:
            raise
        out = BatchBuilder(file, 1)
        out.reject(
            f"after-{given}",
            "reader_error",
            f"the reader failed after {given} records; the rest of the file is not read: {describe_error(exc)}",
        )
        yield out.flush()  # type: ignore[misc]


def _with_n_chars(table: pa.Table) -> pa.Table:
    """Every document row, kept or rejected, carries its length in characters (for the audit)."""
    return table.append_column("n_chars", pc.cast(pc.fill_null(pc.utf8_length(table["text"]), 0), pa.int64()))


def _load_decisions(spec: RunSpec, folder: RunFolder, segment: Segment, shard: Shard, decided: ShardRuns) -> pa.Table | None:
    if segment.apply_global is None:
        return None
    stage = build_stage(spec, segment.apply_global)
    parts = []
    if partitions_decide(stage):  # the partition outputs are decisions
        parts.append(shard_rows(folder, decided.get("decisions", ()), shard.ordinal))
    if step_of(stage, CombineStep) is not None:
        path = WorkFiles(folder).decisions_file(segment.index - 1, shard.key)
        parts.append(pq.read_table(path) if path.exists() else None)
    return _concat([t for t in parts if t is not None and t.num_rows])


def _load_copies(spec: RunSpec, folder: RunFolder, segment: Segment, shard: Shard, decided: ShardRuns) -> pa.Table | None:
    """The copies the applied stage dropped whose survivor is one of this shard's documents, from its
    partitions and its combine step (engine/tasks/copies.py)."""
    assert segment.apply_global is not None
    stage = build_stage(spec, segment.apply_global)
    parts = []
    if partitions_decide(stage):
        parts.append(shard_rows(folder, decided.get("copies", ()), shard.ordinal))
    path = WorkFiles(folder).combine_copies_file(segment.index - 1)
    if step_of(stage, CombineStep) is not None and path.exists():
        parts.append(pq.read_table(path, filters=[("shard", "=", shard.ordinal)]))
    return _concat([t for t in parts if t is not None and t.num_rows])


def _load_state(spec: RunSpec, folder: RunFolder, segment: Segment, shard: Shard, decided: ShardRuns) -> pa.Table | None:
    """The applied stage's ``CombineStep.state`` (this shard's rows where it is per shard, else all of it),
    with this shard's rows of its partitions' states."""
    if segment.apply_global is None:
        return None
    parts = [shard_rows(folder, decided.get("state", ()), shard.ordinal)]
    path = WorkFiles(folder).state_file(segment.index - 1)
    if path.exists():
        if "shard" in pq.read_schema(path).names:
            parts.append(pq.read_table(path, filters=[("shard", "=", shard.ordinal)]))
        else:
            parts.append(pq.read_table(path))
    return _concat([t for t in parts if t is not None and t.num_rows])


def _concat(tables: list[pa.Table]) -> pa.Table | None:
    if not tables:
        return None
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="permissive")


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


def _reused_step(spec: RunSpec, position: int, stage: Stage, recorded: pa.Table, counts: MapCounts) -> Step:
    """The stage's decision over its recorded signals (``run --from``); computed where there are none
    (set up only then: a stage whose every document has recorded signals loads no model). ``counts``:
    the documents whose signals were read (``stage_recorded``)."""
    assert spec.recorded is not None
    columns = spec.recorded.of(position) or ()

    def step(batch: pa.Table) -> tuple[pa.Table, Decision]:
        computed, hits = with_recorded(batch, recorded, columns, lambda b: build_stage(spec, position, setup=True).compute(b))
        counts.stage_recorded[position] += hits
        return computed, stage.decide(computed)

    return step


def _compute_step(stage: Stage) -> Step:
    def step(batch: pa.Table) -> tuple[pa.Table, Decision]:
        computed = stage.compute(batch)
        return computed, Decision.keep_all(computed.num_rows)

    return step


def _encode(spec: RunSpec, batch: pa.Table, recorded: pa.Table | None = None) -> tuple[pa.Table, Decision]:
    """Token ids per document as a transient column (written to the token sink, then dropped).
    ``recorded``: an earlier run's token lists by id, reused where a document has one (``run --from``)."""
    assert spec.tokenizer is not None and spec.tokenize is not None
    info = spec.tokenizer

    def encode(b: pa.Table) -> pa.Array:
        text = pc.fill_null(b["text"], "").combine_chunks()
        return encode_documents(text.to_pylist(), info, text)

    tokens = encode(batch) if recorded is None else tokens_with_recorded(batch, recorded, encode)
    split = assign_split(batch["id"].to_pylist(), spec.tokenize.val_fraction)
    batch = batch.append_column("n_tokens", pc.cast(pc.list_value_length(tokens), pa.int64()))
    batch = batch.append_column("split", split).append_column(_TOKENS, tokens)
    return batch, Decision.keep_all(batch.num_rows)


def _write_tokens(batch: pa.Table, out: ShardOutputs) -> pa.Table:
    """The tokens of the kept documents to the token sink (the transient column dropped)."""
    if not batch.num_rows or out.tokens is None:
        return batch
    repeat = batch[REPEAT_COLUMN].combine_chunks() if REPEAT_COLUMN in batch.column_names else None
    ids, split, tokens = (batch[c].combine_chunks() for c in ("id", "split", _TOKENS))
    out.tokens.write(ids, split, tokens, repeat)
    return batch.drop_columns([_TOKENS])
