"""The Overview's numbers behind one small interface, so that the page never scans the corpus.

Exact from the index, whatever the size of the run: documents per stage and reason (``stage_reasons``),
per source and status and per rejecting stage (``document_files``: every file is one source's, and a
rejected file one stage's), tokens per source and split (the shard manifest).

What needs the rows (languages, characters per reason, length and score distributions) comes from
an ``Aggregates``:

- ``TableAggregates``: the run's ``agg_`` tables (``audit/aggregates.py``: every map task counted its
  documents, the end of the run merged the counts), exact at any size and read in milliseconds:
  ``agg_documents`` (documents, characters and tokens by source, language, status, stage and reason),
  ``agg_lengths`` (lengths in bins of a quarter decade), ``agg_scores`` (classifier scores) and
  ``agg_lang_scores`` (language-ID confidence) in bins 0.01 wide;
- ``SampledAggregates``: for a run folder written before the tasks counted their documents (no
  ``agg_`` tables), a few columns of the run's files: all of them in a run of up to ``SAMPLE_ROWS``
  documents (exact), else files spread over every (status, source, stage) group, each group's counts
  scaled by its share read (an estimate, and the page says so).

``aggregates_for`` picks one per run, again whenever the database changes.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datapipe.audit.schema import LENGTH_BINS_PER_DECADE
from datapipe.audit.sql import reading
from datapipe.stages.classify.report import SCORE_BINS_PER_UNIT
from datapipe.stages.langid_report import LANG_SCORE_BINS
from datapipe.view.listing import HIST_BINS, Histogram, bin_counts, bin_edges, spread
from datapipe.view.runs import DocFile, Index, RunView

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
            return f"all {s.files_total:,} document files read ({NO_TABLES})"
        return (
            f"estimated from {s.files_read:,} of {s.files_total:,} document files ({s.table.num_rows:,} documents "
            f"read; {NO_TABLES})"
        )

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


NO_TABLES = "this run folder has no aggregate tables: a datapipe before them wrote it"
# The tables TableAggregates reads: present in every run whose tasks counted their documents.
CORE_TABLES = ("agg_documents", "agg_lengths")
MEMORY = 256 * 10**6  # the connection's cap: it reads small tables only


@dataclass(frozen=True)
class _Tables:
    """What the Overview needs of the ``agg_`` tables, read in one connection."""

    source_lang: list[dict[str, Any]]  # source, lang, status, documents, chars, tokens
    rejected: list[dict[str, Any]]  # stage, reason, documents, chars
    bins: dict[tuple[str, str | None], list[tuple[int, int]]]  # (column, status) -> (bin, documents), by bin
    width: dict[str, int]  # column -> bins per unit (scores) or 0 (lengths: LENGTH_BINS_PER_DECADE per decade)


class TableAggregates:
    """The Overview's row-level numbers from the run's ``agg_`` tables: exact, and a few thousand rows
    read whatever the size of the run (once per database: the tables never change after the run)."""

    exact = True
    description = "exact, from the counts every task kept (the run's aggregate tables)"

    def __init__(self, run: RunView) -> None:
        self.run = run
        self._lock = threading.Lock()
        self._tables: _Tables | None = None
        self._key: object = None

    def tables(self) -> _Tables:
        index = self.run.index()
        with self._lock:
            if self._tables is None or self._key is not index:
                self._tables, self._key = self._read(index), index
            return self._tables

    def _read(self, index: Index) -> _Tables:
        bins: dict[tuple[str, str | None], list[tuple[int, int]]] = {}
        width: dict[str, int] = {}

        def add(column: str, rows: list[tuple[Any, ...]], per_unit: int) -> None:
            for status, b, n in rows:  # rows ordered by bin: each (column, status) list too
                bins.setdefault((column, status), []).append((int(b), int(n)))
                bins.setdefault((column, None), []).append((int(b), int(n)))
            width[column] = per_unit

        with reading(self.run.root, index_only=True, memory_limit=MEMORY) as con:
            source_lang = _dicts(
                con,
                "SELECT source, lang, status, sum(documents) AS documents, sum(chars) AS chars, sum(tokens) AS tokens "
                "FROM agg_documents GROUP BY ALL ORDER BY ALL",
            )
            rejected = _dicts(
                con,
                "SELECT stage, reason, sum(documents) AS documents, sum(chars) AS chars FROM agg_documents "
                "WHERE status = 'rejected' GROUP BY ALL",
            )
            for measure, name in (("chars", "n_chars"), ("tokens", "n_tokens")):
                rows = con.execute(
                    "SELECT status, bin, sum(documents) FROM agg_lengths WHERE measure = ? GROUP BY ALL ORDER BY bin",
                    [measure],
                ).fetchall()
                if rows:
                    add(name, rows, 0)
            if "agg_lang_scores" in index.tables:
                rows = con.execute(
                    "SELECT status, score_bin, sum(documents) FROM agg_lang_scores GROUP BY ALL ORDER BY score_bin"
                ).fetchall()
                if rows:
                    add("lang_score", rows, LANG_SCORE_BINS)
            if "agg_scores" in index.tables:
                scores: dict[str, list[tuple[Any, ...]]] = {}
                for score, *row in con.execute(
                    "SELECT score, status, score_bin, sum(documents) FROM agg_scores GROUP BY ALL ORDER BY score, score_bin"
                ).fetchall():
                    scores.setdefault(score, []).append(tuple(row))
                for score, rows in scores.items():
                    add(score, rows, SCORE_BINS_PER_UNIT)
        for key, pairs in bins.items():  # the all-status lists hold each bin once per status: summed here
            summed: dict[int, int] = {}
            for b, n in pairs:
                summed[b] = summed.get(b, 0) + n
            bins[key] = sorted(summed.items())
        return _Tables(source_lang, rejected, bins, width)

    def source_lang(self) -> list[dict[str, Any]]:
        return self.tables().source_lang

    def reasons(self) -> list[dict[str, Any]]:
        """Rejected documents and their characters per stage position and reason. ``agg_documents`` knows
        a stage by its name: a reason is put at the position ``stage_reasons`` has it at, and left out
        where the same stage name dropped it at two positions (its characters are then not shown)."""
        positions: dict[tuple[str, str], list[int]] = {}
        for r in self.run.index().reasons:
            positions.setdefault((r["stage"], r["reason"]), []).append(int(r["position"]))
        out = []
        for r in self.tables().rejected:
            at = positions.get((r["stage"], r["reason"]), [])
            if len(at) == 1:
                out.append({"position": at[0], **r})
        return out

    def distribution_columns(self) -> list[str]:
        t = self.tables()
        first = [c for c in DISTRIBUTIONS if c in t.width]
        return first + sorted(c for c in t.width if c not in DISTRIBUTIONS)

    def histogram(self, column: str, status: str | None = None) -> Histogram | None:
        t = self.tables()
        pairs = t.bins.get((column, status))
        if not pairs:
            return None
        per_unit = t.width[column]
        if per_unit == 0:
            edges, counts = _length_bins(pairs)
            log, integral = True, True
        else:
            edges, counts = _score_bins(pairs, per_unit)
            log, integral = False, False
        total = float(sum(counts))
        files = len(self.run.index().files)
        return Histogram(column, edges, counts, log, True, int(total), files, files, total, integral)


def _dicts(con: Any, sql: str) -> list[dict[str, Any]]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def length_bin_start(b: int) -> int:
    """The least whole length in ``agg_lengths``' bin ``b`` (``floor(log10(greatest(n, 1)) * 4)``): bin 0
    holds 0 and 1, bin b > 0 the lengths from about 10^(b/4). Computed as DuckDB computes the bin, so
    the edges are exact for whole numbers."""
    if b <= 0:
        return 0
    per = LENGTH_BINS_PER_DECADE
    n = math.ceil(10 ** (b / per))
    while n > 1 and math.floor(math.log10(n - 1) * per) >= b:
        n -= 1
    while math.floor(math.log10(n) * per) < b:
        n += 1
    return n


def _length_bins(pairs: list[tuple[int, int]]) -> tuple[list[float], list[float]]:
    """Whole-number edges for the length bins from the least to the largest one counted (empty bins
    between them drawn as such)."""
    counts = dict(pairs)
    lo, hi = min(counts), max(counts)
    edges = [float(length_bin_start(b)) for b in range(lo, hi + 2)]
    return edges, [float(counts.get(b, 0)) for b in range(lo, hi + 1)]


def _score_bins(pairs: list[tuple[int, int]], per_unit: int) -> tuple[list[float], list[float]]:
    """Score bins (``per_unit`` to 1.0) joined into at most ``HIST_BINS`` bars of a round width (0.02,
    0.05, 0.1, ... of 1.0)."""
    lo, hi = min(b for b, _ in pairs), max(b for b, _ in pairs)
    join = next((j for j in _ROUND_WIDTHS if math.floor(hi / j) - math.floor(lo / j) + 1 <= HIST_BINS), max(1, hi - lo + 1))
    first, last = math.floor(lo / join), math.floor(hi / join)
    counts = [0.0] * (last - first + 1)
    for b, n in pairs:
        counts[math.floor(b / join) - first] += n
    edges = [(first + i) * join / per_unit for i in range(last - first + 2)]
    return edges, counts


_ROUND_WIDTHS = (1, 2, 5, 10, 20, 25, 50, 100, 200, 500, 1000)


class RunAggregates:
    """A run's ``Aggregates``: its tables where the database has them, else the sample (chosen again
    when the database changes: a run in progress has none until it ends)."""

    def __init__(self, run: RunView) -> None:
        self.run = run
        self.tables = TableAggregates(run)
        self.sampled = SampledAggregates(run)

    @property
    def chosen(self) -> Aggregates:
        tables = self.run.index().tables
        return self.tables if all(t in tables for t in CORE_TABLES) else self.sampled

    @property
    def exact(self) -> bool:
        return self.chosen.exact

    @property
    def description(self) -> str:
        return self.chosen.description

    def source_lang(self) -> list[dict[str, Any]]:
        return self.chosen.source_lang()

    def reasons(self) -> list[dict[str, Any]]:
        return self.chosen.reasons()

    def histogram(self, column: str, status: str | None = None) -> Histogram | None:
        return self.chosen.histogram(column, status)

    def distribution_columns(self) -> list[str]:
        return self.chosen.distribution_columns()


def aggregates_for(run: RunView) -> Aggregates:
    """The best source of the Overview's row-level numbers this run has."""
    return RunAggregates(run)
