"""The Documents page's data: filters from the query string, the files they can match, and a scan of
those files that stops as soon as a page is full (or its time is up), never the whole corpus.

Filters on ``status``, ``stage`` and ``source`` pick files from the index alone (rejected files are
per stage; every file is one source's). ``reason`` narrows to the stages that gave that reason
(``stage_reasons``). Row filters (``reason``, ``lang``, ``<signal>_min`` / ``_max``) first skip row
groups by their Parquet statistics, then test the rows; ``q`` (text contains) reads the text.

Pages follow the order of the ``documents`` view (files by path, rows in file order), and the next
page starts where the last one stopped (``after=<file>:<row>`` in its URL), so page 1,000 costs what
page 1 costs. A histogram reads only the signal's column and those of the row filters, from files
spread over the candidates, and says when it is an estimate from part of them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlencode

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datapipe.errors import UsageError
from datapipe.view.runs import DocFile, Index, RunView

PAGE_ROWS = 50
PAGE_SECONDS = 0.9  # a page's scan stops here: what it found is shown, with a link to go on
HIST_SECONDS = 0.35
HIST_ROWS = 400_000  # values a histogram reads at most (an estimate beyond)
HIST_BINS = 40
PREVIEW_CHARS = 240
LIST_COLUMNS = ("id", "source", "lang", "stage", "reason", "detail", "n_chars", "n_tokens")
STATUSES = ("kept", "rejected")


class FilterError(UsageError):
    """A query-string filter that cannot be used: the message names the parameter."""


@dataclass(frozen=True)
class Filters:
    status: str | None = None
    stage: str | None = None
    reason: str | None = None
    source: str | None = None
    lang: str | None = None
    q: str | None = None
    ranges: tuple[tuple[str, float | None, float | None], ...] = ()

    @classmethod
    def from_query(cls, params: Mapping[str, str], numeric: set[str]) -> Filters:
        def value(name: str) -> str | None:
            v = params.get(name, "").strip()
            return v or None

        status = value("status")
        if status is not None and status not in STATUSES:
            raise FilterError(f"status={status!r}: use kept or rejected")
        bounds: dict[str, list[float | None]] = {}
        for key, raw in params.items():
            for suffix, i in (("_min", 0), ("_max", 1)):
                if key.endswith(suffix) and raw.strip():
                    column = key[: -len(suffix)]
                    if column not in numeric:
                        raise FilterError(f"{key}: {column!r} is not a numeric signal of this run")
                    try:
                        number = float(raw)
                    except ValueError:
                        raise FilterError(f"{key}={raw!r} is not a number") from None
                    if math.isnan(number):
                        raise FilterError(f"{key}={raw!r} is not a number")
                    bounds.setdefault(column, [None, None])[i] = number
        ranges = tuple((c, lo, hi) for c, (lo, hi) in sorted(bounds.items()))
        return cls(status, value("stage"), value("reason"), value("source"), value("lang"), value("q"), ranges)

    def query(self, **changes: Any) -> str:
        """This filter set (with ``changes``) as a query string, for links."""
        f = replace(self, **{k: v for k, v in changes.items() if k in self.__dataclass_fields__})
        items = [(k, getattr(f, k)) for k in ("status", "stage", "reason", "source", "lang", "q")]
        items += [(f"{c}_{end}", _num(v)) for c, lo, hi in f.ranges for end, v in (("min", lo), ("max", hi)) if v is not None]
        items += [(k, v) for k, v in changes.items() if k not in self.__dataclass_fields__]
        return urlencode([(k, v) for k, v in items if v is not None and v != ""])

    def without_range(self, column: str) -> Filters:
        return replace(self, ranges=tuple(r for r in self.ranges if r[0] != column))

    def range_of(self, column: str) -> tuple[float | None, float | None]:
        return next(((lo, hi) for c, lo, hi in self.ranges if c == column), (None, None))

    @property
    def row_level(self) -> bool:
        """Whether rows must be read to know which match (else the index counts them)."""
        return bool(self.reason or self.lang or self.q or self.ranges)

    @property
    def columns(self) -> list[str]:
        """The columns the row filters read."""
        cols = [c for c, _, _ in self.ranges]
        cols += [c for c, v in (("reason", self.reason), ("lang", self.lang), ("text", self.q)) if v]
        return list(dict.fromkeys(cols))


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(v)


def candidate_files(index: Index, f: Filters) -> list[DocFile]:
    """The files that can hold a matching row, from the index alone."""
    stages_of_reason: set[tuple[int, str]] | None = None
    if f.reason:
        stages_of_reason = {(int(r["position"]), str(r["stage"])) for r in index.reasons if r["reason"] == f.reason}
    out = []
    for file in index.files:
        if f.status and file.status != f.status:
            continue
        if f.stage and file.stage != f.stage:
            continue
        if f.source and file.source != f.source:
            continue
        if stages_of_reason is not None and (file.status != "rejected" or (file.position, file.stage) not in stages_of_reason):
            continue
        if any(c not in file.columns for c in f.columns):
            continue
        out.append(file)
    return out


def _stat_skips(meta: Any, group: int, leaves: dict[str, int], f: Filters) -> bool:
    """Whether a row group's statistics rule out every row (an equality or range it cannot meet);
    ``leaves``: column name -> its leaf index (``RunView.leaves``)."""
    rg = meta.row_group(group)
    tests: list[tuple[str, Any, Any]] = [(c, lo, hi) for c, lo, hi in f.ranges]
    tests += [(c, v, v) for c, v in (("reason", f.reason), ("lang", f.lang)) if v]
    for column, lo, hi in tests:
        if column not in leaves:
            continue
        stats = rg.column(leaves[column]).statistics
        if stats is None or not stats.has_min_max:
            continue
        if stats.null_count == rg.num_rows:
            return True
        try:
            if (hi is not None and stats.min > hi) or (lo is not None and stats.max < lo):
                return True
        except TypeError:  # a statistic of another type than the bound (a boolean signal)
            continue
    return False


def _mask(table: pa.Table, f: Filters) -> pa.Array:
    mask = pa.array(np.ones(table.num_rows, dtype=bool))
    for column, lo, hi in f.ranges:
        values = table[column]
        if pa.types.is_boolean(values.type):
            values = pc.cast(values, pa.int8())
        if lo is not None:
            mask = pc.and_(mask, pc.greater_equal(values, lo))
        if hi is not None:
            mask = pc.and_(mask, pc.less_equal(values, hi))
    for column, value in (("reason", f.reason), ("lang", f.lang)):
        if value:
            mask = pc.and_(mask, pc.equal(table[column], value))
    if f.q:
        mask = pc.and_(mask, pc.match_substring(table["text"], f.q, ignore_case=True))
    return pc.fill_null(mask, False)


@dataclass
class Scanned:
    """What a scan read: rows matched per file (with their row numbers), and where it stopped."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    stopped_at: tuple[int, int] | None = None  # (file ordinal, row) to go on from; None: the end
    files_read: int = 0
    timed_out: bool = False


def _row_groups(meta: Any) -> Iterator[tuple[int, int, int]]:
    start = 0
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        yield g, start, n
        start += n


def scan_page(
    run: RunView,
    files: list[DocFile],
    f: Filters,
    after: tuple[int, int] = (0, 0),
    rows: int = PAGE_ROWS,
    extra: tuple[str, ...] = (),
    seconds: float = PAGE_SECONDS,
) -> Scanned:
    """Up to ``rows`` matching documents in ``documents`` order from ``after`` on, with a text preview."""
    deadline = time.perf_counter() + seconds
    out = Scanned()
    for file in files:
        if file.ordinal < after[0]:
            continue
        first_row = after[1] if file.ordinal == after[0] else 0
        with run.parquet(file) as pf:
            meta = pf.metadata
            names = file.columns
            leaves = run.leaves(file, meta)
            out.files_read += 1
            for g, start, n in _row_groups(meta):
                if start + n <= first_row or _stat_skips(meta, g, leaves, f):
                    continue
                if len(out.rows) >= rows or time.perf_counter() > deadline:
                    out.stopped_at = (file.ordinal, max(start, first_row))
                    out.timed_out = len(out.rows) < rows
                    return out
                wanted = [c for c in dict.fromkeys([*f.columns, *LIST_COLUMNS, *extra]) if c in names and c != "text"]
                table = pf.read_row_group(g, columns=wanted + (["text"] if f.q else []))
                numbers = pa.array(np.arange(start, start + n))
                mask = _mask(table, f)
                mask = pc.and_(mask, pc.greater_equal(numbers, first_row))
                if not pc.any(mask).as_py():
                    continue
                picked = table.filter(mask)
                at = numbers.filter(mask).to_pylist()
                take = rows - len(out.rows)
                texts = picked["text"] if f.q else pf.read_row_group(g, columns=["text"])["text"].filter(mask)
                previews = pc.utf8_slice_codeunits(texts.slice(0, take), 0, PREVIEW_CHARS).to_pylist()
                for i, row in enumerate(picked.slice(0, take).to_pylist()):
                    row.pop("text", None)
                    row.update(status=file.status, source=row.get("source") or file.source, preview=previews[i] or "")
                    row["_at"] = (file.ordinal, at[i])
                    out.rows.append(row)
                if len(out.rows) >= rows:
                    last = out.rows[-1]["_at"]
                    out.stopped_at = (last[0], last[1] + 1)
                    return out
    return out


@dataclass(frozen=True)
class Histogram:
    column: str
    edges: list[float]  # len(counts) + 1
    counts: list[float]  # estimated documents per bin (exact when ``exact``)
    log: bool
    exact: bool
    rows_read: int
    files_read: int
    files_total: int
    total: float  # matching documents with a value (estimated when not exact)
    integral: bool = False  # whole numbers only (a bin's inclusive upper bound is its end minus one)


def spread(items: list[Any]) -> list[Any]:
    """The items in an order that covers them evenly from the start (bit-reversed positions), so a scan
    cut short has read files from all over the run, not only its first sources."""
    n = len(items)
    if n <= 2:
        return list(items)
    bits = (n - 1).bit_length()
    order = sorted(range(1 << bits), key=lambda i: int(f"{i:0{bits}b}"[::-1], 2))
    return [items[i] for i in order if i < n]


def histogram(
    run: RunView,
    files: list[DocFile],
    f: Filters,
    column: str,
    seconds: float = HIST_SECONDS,
    max_rows: int = HIST_ROWS,
    bins: int = HIST_BINS,
) -> Histogram:
    """The distribution of ``column`` over the documents ``f`` matches (its own range on ``column``
    left out, so a selection shows where it lies), from as many candidate files as the time allows."""
    f = f.without_range(column)
    files = [x for x in files if column in x.columns]
    deadline = time.perf_counter() + seconds
    parts: list[np.ndarray] = []
    rows_read = files_read = candidate_rows_read = 0
    for file in spread(files):
        if files_read and (time.perf_counter() > deadline or rows_read >= max_rows):
            break
        with run.parquet(file) as pf:
            meta = pf.metadata
            leaves = run.leaves(file, meta)
            for g, _, _ in _row_groups(meta):
                if _stat_skips(meta, g, leaves, f):
                    continue
                table = pf.read_row_group(g, columns=list(dict.fromkeys([column, *f.columns])))
                values = table[column].filter(_mask(table, f))
                if pa.types.is_boolean(values.type):
                    values = pc.cast(values, pa.int8())
                parts.append(values.drop_null().to_numpy(zero_copy_only=False).astype(np.float64))
                rows_read += table.num_rows
        files_read += 1
        candidate_rows_read += file.rows
    values = np.concatenate(parts) if parts else np.zeros(0)
    values = values[np.isfinite(values)]
    exact = files_read == len(files)
    scale = 1.0 if exact or not candidate_rows_read else sum(x.rows for x in files) / candidate_rows_read
    edges, log = bin_edges(values, bins)
    counts = bin_counts(values, edges, log) if len(values) else np.zeros(0)
    return Histogram(
        column,
        edges,
        [float(c) * scale for c in counts],
        log,
        exact,
        rows_read,
        files_read,
        len(files),
        float(len(values)) * scale,
        bool(len(values)) and bool(np.all(values == np.floor(values))),
    )


def _transform(values: np.ndarray, log: bool) -> np.ndarray:
    return np.log10(1.0 + values) if log else values


def bin_counts(values: np.ndarray, edges: list[float], log: bool, weights: np.ndarray | None = None) -> np.ndarray:
    """Documents per bin; the bins are even in the (log) scale ``bin_edges`` chose, so numpy's fast
    path for even bins applies (no search per value)."""
    t = _transform(np.asarray(edges, dtype=np.float64), log)
    even = len(edges) > 2 and np.allclose(np.diff(t), t[1] - t[0], rtol=1e-9, atol=0)
    if even:
        return np.histogram(_transform(values, log), bins=len(edges) - 1, range=(t[0], t[-1]), weights=weights)[0]
    return np.histogram(_transform(values, log), bins=t, weights=weights)[0]


def bin_edges(values: np.ndarray, bins: int = HIST_BINS) -> tuple[list[float], bool]:
    """Bin edges over the values: even in log scale for counts spanning orders of magnitude (lengths),
    whole numbers for small integer ranges, else linear."""
    if not len(values):
        return [0.0, 1.0], False
    lo, hi = float(values.min()), float(values.max())
    integral = bool(np.all(values == np.floor(values)))
    log = lo >= 0 and hi > 1000 and hi > 100 * max(lo, 1.0)
    if log:
        t = np.linspace(math.log10(1 + lo), math.log10(1 + hi), bins + 1)
        return [float(10**x - 1) for x in t], True
    if integral and hi - lo + 1 <= bins:
        return [lo + i for i in range(int(hi - lo) + 2)], False
    if hi == lo:
        return [lo, lo + 1], False
    return [float(x) for x in np.linspace(lo, hi, bins + 1)], False
