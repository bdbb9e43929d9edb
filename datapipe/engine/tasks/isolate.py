"""Running one step of a stage over a batch so that one bad record cannot fail the task.

When a stage's compute or decide raises on a batch, the batch is bisected until the rows
that raise are found (``O(bad x log n)`` stage calls, nothing extra while nothing fails);
those rows become ``record_error`` rejects of that stage with the exception as detail, and
the other rows go on exactly as if the bad ones had never been in the batch.

A stage that is broken (a bug, a missing model, a bad option) must still fail loudly, not
reject the corpus. Two rules tell the cases apart:

- the probe: when a batch fails, the stage is first run on a row it handled before in this
  task (the known-good neighbour) or, before any success, on a copy of the first failing row
  whose text is a plain sentence. If that fails too, the stage is broken: re-raise.
- the budget: a stage may turn at most ``max(limits.max_record_errors,
  limits.max_record_error_fraction x rows it saw)`` rows of one task into record errors; past
  that, the failures are systematic: re-raise (Ray retries the task, then the run fails and
  names the error).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from datapipe.errors import DatapipeError
from datapipe.readers.base import describe_error
from datapipe.stages.base import Decision

CANARY_TEXT = "This is an ordinary sentence used to check that the stage itself works."

Step = Callable[[pa.Table], tuple[pa.Table, Decision]]


class StageBroken(DatapipeError, RuntimeError):
    """Too many rows of one task failed in one stage: the stage, not the data, is at fault."""


@dataclass
class Isolator:
    """Per task and stage: the known-good row and the error budget."""

    stage: str
    max_errors: int
    max_fraction: float
    seen: int = 0
    errors: int = 0
    good_row: pa.Table | None = field(default=None, repr=False)

    def run(self, step: Step, batch: pa.Table) -> tuple[pa.Table, Decision, pa.Table | None, list[str]]:
        """``step`` over ``batch``: (computed good rows, their decision, failed input rows or None, details)."""
        self.seen += batch.num_rows
        try:
            out, decision = step(batch)
        except MemoryError:
            raise
        except Exception as exc:
            if not self._probe(step, batch):
                raise  # the stage fails on a healthy row as well: it is broken, not this batch
            parts, failed = _bisect(step, batch, exc)
            self.errors += len(failed)
            if self.errors > max(self.max_errors, self.max_fraction * self.seen):
                raise StageBroken(
                    f"stage {self.stage!r} raised on {self.errors} of {self.seen} documents of this shard "
                    f"(more than limits.max_record_errors={self.max_errors} and "
                    f"limits.max_record_error_fraction={self.max_fraction}); first: {failed[0][1]}"
                ) from exc
            out, decision = _concat(parts, batch.schema)
            bad = batch.take(pa.array([i for i, _ in failed], pa.int64()))
            return out, decision, bad, [d for _, d in failed]
        if batch.num_rows and self.good_row is None:
            self.good_row = batch.slice(0, 1)
        return out, decision, None, []

    def _probe(self, step: Step, batch: pa.Table) -> bool:
        probe = self.good_row
        if probe is None:
            probe = batch.slice(0, 1)
            if "text" in probe.column_names:
                i = probe.column_names.index("text")
                probe = probe.set_column(i, probe.schema.field(i), pa.array([CANARY_TEXT], probe["text"].type))
        try:
            step(probe)
        except MemoryError:
            raise
        except Exception:
            return False
        return True


def _bisect(
    step: Step, batch: pa.Table, exc: Exception, offset: int = 0
) -> tuple[list[tuple[pa.Table, Decision]], list[tuple[int, str]]]:
    """Results of the rows that pass, in order, and (row index, error) of the rows that raise."""
    if batch.num_rows == 1:
        return [], [(offset, describe_error(exc))]
    half = batch.num_rows // 2
    parts: list[tuple[pa.Table, Decision]] = []
    failed: list[tuple[int, str]] = []
    for lo, part in ((0, batch.slice(0, half)), (half, batch.slice(half))):
        try:
            parts.append(step(part))
        except MemoryError:
            raise
        except Exception as sub:
            p, f = _bisect(step, part, sub, offset + lo)
            parts.extend(p)
            failed.extend(f)
    return parts, failed


def _concat(parts: list[tuple[pa.Table, Decision]], schema: pa.Schema) -> tuple[pa.Table, Decision]:
    if not parts:
        return schema.empty_table(), Decision.keep_all(0)
    tables = [t for t, _ in parts]
    out = pa.concat_tables(tables, promote_options="permissive")
    reason = pa.concat_arrays([_array(d.reason) for _, d in parts])
    if all(d.detail is None for _, d in parts):
        return out, Decision(reason)
    detail = pa.concat_arrays([_array(d.detail) if d.detail is not None else pa.nulls(len(t), pa.string()) for t, d in parts])
    return out, Decision(reason, detail)


def _array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    return arr.cast(pa.string())
