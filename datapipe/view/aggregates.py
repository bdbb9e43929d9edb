"""The Overview's numbers behind one small interface, so that the page never scans the corpus.

Exact from the index, whatever the size of the run: documents per stage and reason (``stage_reasons``),
per source and status and per rejecting stage (``document_files``: every file is one source's, and a
rejected file one stage's), tokens per source and split (the shard manifest).

What needs the rows (languages, characters per reason, length and score distributions) comes from
an ``Aggregates``. ``SampledAggregates`` reads a few columns of the run's files: all of them in a run of
up to ``SAMPLE_ROWS`` documents (exact), else files spread over every (status, source, stage) group,
each group's counts scaled by its share read (an estimate, and the page says so). Per-task aggregate
tables written by the run (per stage/reason/source/language counts, binned histograms) will answer
the same questions exactly at any size: an ``Aggregates`` over them goes first in ``aggregates_for``
when the database has them.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datapipe.view.listing import Histogram, bin_counts, bin_edges, spread
from datapipe.view.runs import DocFile, RunView

SAMPLE_ROWS = 120_000  # rows read at most for the Overview's estimates (at least one file of each group)
SCORE_PREFIXES = ("cls_",)
DISTRIBUTIONS = ("n_chars", "n_tokens", "lang_score")


class Aggregates(Protocol):
    @property
    def exact(self) -> bool: ...

    @property
    def description(self) -> str:
        """Where the numbers come from, shown on the page."""
        ...

    def source_lang(self) -> list[dict[str, Any]]:
        """source, lang, status, documents, chars, tokens."""
        ...

    def reasons(self) -> list[dict[str, Any]]:
        """position, stage, reason, documents, chars (rejected documents)."""
        ...

    def histogram(self, column: str, status: str | None = None) -> Histogram | None: ...

    def distribution_columns(self) -> list[str]: ...


@dataclass(frozen=True)
class _Sample:
    table: pa.Table  # status, source, position, stage, weight, and the columns read
    files_read: int
    files_total: int
    exact: bool


class SampledAggregates:
    """The Overview's row-level numbers from the run's own files, read once per server (cached)."""

    def __init__(self, run: RunView, max_rows: int = SAMPLE_ROWS) -> None:
        self.run, self.max_rows = run, max_rows
        self._sample: _Sample | None = None
        self._key: object = None
        self._lock = threading.RLock()  # also held while an answer is computed: two pages never compute it twice
        self._answers: dict[tuple[Any, ...], Any] = {}  # computed from the sample: kept while it is

    def _columns(self) -> list[str]:
        names = self.run.index().column_names
        wanted = ["reason", "lang", *DISTRIBUTIONS]
        wanted += [c for c in names if c.startswith(SCORE_PREFIXES)]
        return [c for c in dict.fromkeys(wanted) if c in names]

    def sample(self) -> _Sample:
        index = self.run.index()
        with self._lock:
            if self._sample is None or self._key is not index:
                self._sample, self._key = self._read(index.files), index
                self._answers = {}
            return self._sample

    def _memo(self, key: tuple[Any, ...], compute: Any) -> Any:
        with self._lock:
            self.sample()
            if key not in self._answers:
                self._answers[key] = compute()
            return self._answers[key]

    def _read(self, files: list[DocFile]) -> _Sample:
        columns = self._columns()
        groups: dict[tuple[str, str, str | None], list[DocFile]] = {}
        for f in files:
            groups.setdefault((f.status, f.source, f.stage), []).append(f)
        total = sum(f.rows for f in files)
        exact = total <= self.max_rows
        parts, files_read = [], 0
        for group in groups.values():
            rows = sum(f.rows for f in group)
            target = rows if exact else max(1, math.ceil(self.max_rows * rows / max(total, 1)))
            read_rows, tables = 0, []
            for f in spread(group):
                if read_rows >= target:
                    break
                tables.append(self._read_file(f, columns))
                read_rows += f.rows
                files_read += 1
            weight = rows / read_rows if read_rows else 0.0
            for t in tables:
                parts.append(t.append_column("weight", pa.array(np.full(t.num_rows, weight))))
        table = (
            pa.concat_tables(parts, promote_options="permissive") if parts else pa.table({"weight": pa.array([], pa.float64())})
        )
        return _Sample(table, files_read, len(files), exact)

    def _read_file(self, f: DocFile, columns: list[str]) -> pa.Table:
        have = [c for c in columns if c in f.columns]
        with self.run.parquet(f) as pf:
            table = pf.read(columns=have)
        n = table.num_rows
        for c in columns:
            if c not in have:
                table = table.append_column(c, pa.nulls(n, pa.string() if c in ("reason", "lang") else pa.float64()))
        table = table.select(columns)
        for c in columns:  # one type per column across files and layouts
            if c not in ("reason", "lang") and table[c].type != pa.float64():
                table = table.set_column(table.schema.get_field_index(c), c, pc.cast(table[c], pa.float64()))
            elif c in ("reason", "lang") and table[c].type != pa.string():
                table = table.set_column(table.schema.get_field_index(c), c, pc.cast(table[c], pa.string()))
        return (
            table.append_column("status", pa.array([f.status] * n, pa.string()))
            .append_column("source", pa.array([f.source] * n, pa.string()))
            .append_column("position", pa.array([f.position] * n, pa.int64()))
            .append_column("stage", pa.array([f.stage] * n, pa.string()))
        )

    @property
    def exact(self) -> bool:
        return self.sample().exact

    @property
    def description(self) -> str:
        s = self.sample()
        if s.exact:
            return f"all {s.files_total:,} document files read"
        return f"estimated from {s.files_read:,} of {s.files_total:,} document files ({s.table.num_rows:,} documents read)"

    def _grouped(self, keys: list[str], where: pa.Array | None = None) -> list[dict[str, Any]]:
        t = self.sample().table
        if t.num_rows == 0 or any(k not in t.column_names for k in keys):
            return []
        if where is not None:
            t = t.filter(where)
        chars = pc.multiply(pc.fill_null(t["n_chars"], 0.0), t["weight"]) if "n_chars" in t.column_names else t["weight"]
        tokens = pc.multiply(pc.fill_null(t["n_tokens"], 0.0), t["weight"]) if "n_tokens" in t.column_names else t["weight"]
        t = pa.table({**{k: t[k] for k in keys}, "documents": t["weight"], "chars": chars, "tokens": tokens})
        out = t.group_by(keys).aggregate([("documents", "sum"), ("chars", "sum"), ("tokens", "sum")]).to_pylist()
        return [
            {**{k: r[k] for k in keys}, "documents": r["documents_sum"], "chars": r["chars_sum"], "tokens": r["tokens_sum"]}
            for r in out
        ]

    def source_lang(self) -> list[dict[str, Any]]:
        return self._memo(("source_lang",), lambda: self._grouped(["source", "lang", "status"]))

    def reasons(self) -> list[dict[str, Any]]:
        return self._memo(("reasons",), self._reasons)

    def _reasons(self) -> list[dict[str, Any]]:
        t = self.sample().table
        if "status" not in t.column_names:
            return []
        return self._grouped(["position", "stage", "reason"], pc.equal(t["status"], "rejected"))

    def distribution_columns(self) -> list[str]:
        t = self.sample().table
        return [c for c in self._columns() if c not in ("reason", "lang") and c in t.column_names]

    def histogram(self, column: str, status: str | None = None) -> Histogram | None:
        return self._memo(("histogram", column, status), lambda: self._histogram(column, status))

    def _histogram(self, column: str, status: str | None) -> Histogram | None:
        s = self.sample()
        t = s.table
        if column not in t.column_names:
            return None
        if status is not None:
            t = t.filter(pc.equal(t["status"], status))
        valid = pc.is_valid(t[column])
        values = t[column].filter(valid).to_numpy(zero_copy_only=False).astype(np.float64)
        weights = t["weight"].filter(valid).to_numpy(zero_copy_only=False)
        if not len(values):
            return None
        edges, log = bin_edges(values)
        counts = bin_counts(values, edges, log, weights)
        integral = bool(np.all(values == np.floor(values)))
        return Histogram(
            column,
            edges,
            [float(c) for c in counts],
            log,
            s.exact,
            t.num_rows,
            s.files_read,
            s.files_total,
            float(weights.sum()),
            integral,
        )


def aggregates_for(run: RunView) -> Aggregates:
    """The best source of the Overview's row-level numbers this run has."""
    return SampledAggregates(run)
