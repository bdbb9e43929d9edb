"""What one map task writes, with its counts: kept documents, rejects, the copies index, shuffle rows
and tokens, closed together or aborted together (engine/tasks/map.py runs the task)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datapipe.engine.plan import RunSpec, Segment, Shard
from datapipe.engine.tasks.copies import CopiesSink
from datapipe.engine.tasks.isolate import Isolator, Step
from datapipe.engine.tasks.runs import RunSink
from datapipe.engine.tasks.sinks import ParquetSink, TokenSink
from datapipe.engine.work_files import WorkFiles
from datapipe.run_folder.layout import RunFolder
from datapipe.stages.base import Decision, Stage


class MapCounts:
    """A map task's counts, by stage position, as its marker records them (the audit sums them)."""

    def __init__(self) -> None:
        self.docs_in = 0
        self.kept = 0
        self.tokens = 0
        self.split_tokens: dict[str, int] = {}
        self.stage_in: dict[int, int] = defaultdict(int)  # documents reaching the stage
        self.stage_skipped: dict[int, int] = defaultdict(int)  # of those, passed untouched (kind not in its kinds)
        self.stage_recorded: dict[int, int] = defaultdict(int)  # of those, signals read from an earlier run (--from)
        self.rejected: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        # What stages that change documents did to those they passed on (Stage.edit_counts): the sum
        # of each counting column, and how many documents any of them changed.
        self.stage_edits: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.stage_changed: dict[int, int] = defaultdict(int)

    def add_edits(self, position: int, stage: Stage, batch: pa.Table) -> None:
        columns = [c for c in stage.edits() if c in batch.column_names]
        if not columns or batch.num_rows == 0:
            return
        changed = np.zeros(batch.num_rows, dtype=bool)
        for c in columns:
            values = pc.fill_null(pc.cast(batch[c], pa.int64()), 0).to_numpy()
            self.stage_edits[position][c] += int(values.sum())
            changed |= values > 0
        self.stage_changed[position] += int(changed.sum())

    def as_dict(self) -> dict[str, Any]:
        return {
            "docs_in": self.docs_in,
            "kept": self.kept,
            "tokens": self.tokens,
            "split_tokens": self.split_tokens,
            "stage_in": {str(k): v for k, v in sorted(self.stage_in.items())},
            "stage_skipped": {str(k): v for k, v in sorted(self.stage_skipped.items())},
            "stage_recorded": {str(k): v for k, v in sorted(self.stage_recorded.items())},
            "rejected": {str(k): dict(v) for k, v in sorted(self.rejected.items())},
            "stage_edits": {str(k): dict(v) for k, v in sorted(self.stage_edits.items())},
            "stage_changed": {str(k): v for k, v in sorted(self.stage_changed.items())},
        }


class ShardOutputs:
    """Everything one map task writes, with its counts: kept documents (docs/ in the final segment,
    else the segment's map output), rejects (one file per stage position and column set),
    the next global stage's shuffle rows and the tokens. Closed together, or aborted together."""

    def __init__(self, spec: RunSpec, folder: RunFolder, shard: Shard, segment: Segment, shuffles: bool) -> None:
        self.folder = folder
        self.shard = shard
        self.limits = spec.limits
        self.counts = MapCounts()
        self.rejects: dict[tuple[int, tuple[str, ...]], ParquetSink] = {}
        # A segment's kept documents before the last are scratch (_work/), read by the next segment
        # only: lz4 writes and reads them in about half zstd's CPU, for a little more disk.
        self.docs = (
            ParquetSink(folder.docs_file(shard.key))
            if segment.final
            else ParquetSink(WorkFiles(folder).map_output(segment.index, shard.key), compression="lz4")
        )
        repeats = shard.source.name in spec.repeats
        self.tokens = (
            TokenSink(folder.tokens_file(shard.key), repeats, compress=folder.remote is not None)
            if segment.final and spec.tokenizer
            else None
        )
        # The next global stage's rows: one run sorted by part (engine/tasks/runs.py).
        self.shuffle = RunSink(WorkFiles(folder).shuffle_file(segment.index, shard.key)) if shuffles else None
        self.copies: CopiesSink | None = None  # the copies of this shard's documents the applied stage dropped
        self._isolators: dict[int, Isolator] = {}

    def index_copies(self, position: int, stage: str, copies: pa.Table | None) -> None:
        """Write the copies index of the global stage this segment applies (engine/tasks/copies.py)."""
        self.copies = CopiesSink(self.folder.copies_file(self.shard.key, position, stage), stage)
        self.copies.write(copies)

    def reject(
        self, position: int, stage: str, batch: pa.Table, decision: Decision, extra: dict[str, pa.Array] | None = None
    ) -> pa.Table:
        """Write the rows ``decision`` drops as rejects of ``stage`` (at ``position``); return the rest."""
        drop = pc.fill_null(pc.is_valid(decision.reason), False)
        n_drop = pc.sum(drop).as_py() or 0
        if n_drop == 0:
            return batch
        dropped = batch.filter(drop)
        for name, values in (extra or {}).items():
            dropped = dropped.append_column(name, values.filter(drop))
        detail = decision.detail if decision.detail is not None else pa.nulls(batch.num_rows, pa.string())
        dropped = (
            dropped.append_column("stage", pa.array([stage] * n_drop, pa.string()))
            .append_column("reason", decision.reason.filter(drop))
            .append_column("detail", detail.filter(drop))
        )
        # One file per stage position and column set: reading rejects bad records with only the
        # base columns and records without text with all the reader's columns, for example.
        sink_key = (position, tuple(dropped.column_names))
        if sink_key not in self.rejects:
            n = sum(1 for p, _ in self.rejects if p == position)
            name = stage if n == 0 else f"{stage}-{n}"
            self.rejects[sink_key] = ParquetSink(self.folder.reject_file(self.shard.key, position, name))
        self.rejects[sink_key].write(dropped)
        for reason, n in _value_counts(dropped["reason"]):
            self.counts.rejected[position][reason] += n
        return batch.filter(pc.invert(drop))

    def isolated(self, position: int, stage: str, batch: pa.Table, step: Step) -> tuple[pa.Table, Decision]:
        """``step`` over the batch; rows on which it raises become record_error rejects of the stage."""
        if position not in self._isolators:
            self._isolators[position] = Isolator(stage, self.limits.max_record_errors, self.limits.max_record_error_fraction)
        out, decision, bad, details = self._isolators[position].run(step, batch)
        if bad is not None:
            self.reject(
                position,
                stage,
                bad,
                Decision(pa.array(["record_error"] * bad.num_rows, pa.string()), pa.array(details, pa.string())),
            )
        return out, decision

    def keep(self, batch: pa.Table) -> None:
        self.counts.kept += batch.num_rows
        self.docs.write(batch)

    def _sinks(self) -> list[ParquetSink | CopiesSink | RunSink | TokenSink]:
        """Every sink of the task, in the order they are closed (or aborted)."""
        optional = (self.copies, self.shuffle, self.tokens)
        return [self.docs, *self.rejects.values(), *(sink for sink in optional if sink is not None)]

    def close(self) -> None:
        for sink in self._sinks():
            sink.close()
        if self.tokens is not None:
            self.counts.tokens = self.tokens.tokens
            self.counts.split_tokens = self.tokens.split_tokens

    def audit_files(self, final: bool) -> list[dict[str, Any]]:
        """The kept (final segment) and rejected files this task wrote, for the marker (``ParquetSink.audit_entry``)."""
        root = self.folder.root
        entries = [self.docs.audit_entry(root, "kept")] if final else []
        entries += [sink.audit_entry(root, "rejected") for sink in self.rejects.values()]
        return sorted((e for e in entries if e is not None), key=lambda e: e["path"])

    def copies_files(self) -> list[dict[str, Any]]:
        """The copies index this task wrote, for the marker (``CopiesSink.audit_entry``): empty where it
        applied a global stage that dropped no copy of its documents."""
        entry = self.copies.audit_entry(self.folder.root) if self.copies is not None else None
        return [entry] if entry is not None else []

    def abort(self) -> None:
        for sink in self._sinks():
            sink.abort()


def _value_counts(values: pa.ChunkedArray) -> list[tuple[str, int]]:
    vc = pc.value_counts(values)
    return [(v["values"], v["counts"]) for v in vc.to_pylist()]
