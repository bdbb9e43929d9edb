"""Parquet files of documents (one row per document).

Read row group by row group: a row group that cannot be decoded (corrupt pages, bad
compression) becomes one ``unreadable_input`` reject for its rows and the next row group is
still read; only a file whose footer is unreadable is one reject as a whole. A text cell
over ``limits.max_record_bytes`` is rejected as ``record_too_large``, and cells that are not
valid UTF-8 as ``invalid_utf8`` (Arrow would otherwise carry them into every stage). Note
that Arrow decodes a whole row group column at once, so a huge cell is in memory while its
row group is read: the cap bounds what stages see, not what Parquet decoding costs.

Split (engine/splits.py): ranges of whole row groups, sized by their compressed bytes from the
footer; record ids are global row indexes, which the footer gives for free.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datapipe.readers.base import MAX_REJECT_TEXT, BatchBuilder, InputFile, ReadBatch, describe_error
from datapipe.readers.code_repos import TableOptions
from datapipe.readers.rows import add_table_row, record_license, row_builder, table_options, text_field
from datapipe.readers.spec import ReaderSpec
from datapipe.schema import BASE_SCHEMA, RECORD_LICENSE, doc_id
from datapipe.storage.uri import parquet_source


def read_parquet(file: InputFile, batch_size: int) -> Iterator[ReadBatch]:
    src = file.source
    opts = table_options(file)
    rows = row_builder(file, batch_size)  # code/paper rows carry their kind's columns: row by row
    out = rows or BatchBuilder(file, batch_size)
    field = text_field(file, opts)
    try:
        pf = pq.ParquetFile(parquet_source(file.path))  # an object in object storage: read in place
    except Exception as exc:
        out.reject("0-", "unreadable_input", f"cannot open as Parquet: {describe_error(exc)}")
        yield out.flush()  # type: ignore[misc]
        return
    names = pf.schema_arrow.names
    if field not in names:
        out.reject("file", "missing_text_field", f"no column {field!r}; columns: {names[:20]}")
        yield out.flush()  # type: ignore[misc]
        return
    url_field = src.url_field if src.url_field in names else None
    extra = [
        f
        for f in dict.fromkeys((opts.path_field, opts.repo_field, opts.language_field, opts.arxiv_id_field, src.license_field))
        if f and f in names and f not in (field, url_field)
    ]
    columns = [field] + ([url_field] if url_field else []) + extra
    by_row = rows is not None and src.kind in ("code", "paper")  # a licence field alone stays vectorized
    # A split file's task reads a range of row groups; rows keep their index in the whole file.
    first, stop = (file.start, file.end if file.end is not None else pf.num_row_groups) if file.ranged else (0, pf.num_row_groups)
    row = sum(pf.metadata.row_group(g).num_rows for g in range(first))
    for group in range(first, stop):
        end = row + pf.metadata.row_group(group).num_rows
        try:
            for batch in pf.iter_batches(batch_size=batch_size, row_groups=[group], columns=columns):
                yield from _batch(out, by_row, file, opts, batch, row, field, url_field)
                row += batch.num_rows
        except Exception as exc:  # this row group is unreadable: its unread rows are one reject
            if row < end:
                out.reject(
                    f"{row}-{end - 1}",
                    "unreadable_input",
                    f"row group {group} (rows {row}-{end - 1}) unreadable: {describe_error(exc)}",
                )
                if (flushed := out.flush()) is not None:
                    yield flushed
        row = end


def _batch(
    out: BatchBuilder,
    by_row: bool,
    file: InputFile,
    opts: TableOptions,
    batch: pa.RecordBatch,
    start: int,
    field: str,
    url_field: str | None,
) -> Iterator[ReadBatch]:
    """One decoded batch: oversized and non-UTF-8 cells become rejects, the rest documents."""
    text = _as_text(batch.column(field))
    url = _as_text(batch.column(url_field)) if url_field else pa.nulls(batch.num_rows, pa.string())
    others = [batch.column(c) for c in batch.schema.names if c not in (field, url_field)]
    good = _screen(out, file, text, url, others, start)
    positions = np.flatnonzero(good) if good is not None else np.arange(batch.num_rows)
    if good is not None:
        mask = pa.array(good)
        batch = batch.filter(mask)
        text, url = text.filter(mask), url.filter(mask)
    if by_row:
        _rows(out, file, opts, batch, start + positions, field, url_field)
        if (flushed := out.flush()) is not None:
            yield flushed
        return
    rejects = out.flush()
    docs = _to_docs(text, url, file, start + positions)
    if (lic_field := file.source.license_field) is not None:
        values = batch.column(lic_field).to_pylist() if lic_field in batch.schema.names else [None] * batch.num_rows
        lics = [record_license({lic_field: v}, lic_field) for v in values]
        docs = docs.append_column(RECORD_LICENSE, pa.array(lics, pa.string()))
    yield ReadBatch(docs, rejects.rejects if rejects else None)


def _as_text(column: pa.Array) -> pa.Array:
    """A string array (binary and numbers cast); invalid UTF-8 stays as binary for _screen to find."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.cast(pa.string()) if pa.types.is_large_string(column.type) else column
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        return column.cast(pa.binary())
    return pc.cast(column, pa.string())


def _screen(
    out: BatchBuilder, file: InputFile, text: pa.Array, url: pa.Array, others: list[pa.Array], start: int
) -> np.ndarray | None:
    """Rejects rows whose text is too large or any string cell not UTF-8; the mask of the rest, or None if all pass."""
    cap = file.limits.max_record_bytes
    sizes = pc.fill_null(pc.binary_length(text), 0).to_numpy(zero_copy_only=False)
    too_big = sizes > cap
    bad_utf8 = _invalid_utf8(text) | _invalid_utf8(url)
    for column in others:  # provenance columns of code rows (path, repo, language, ...)
        if pa.types.is_string(column.type):
            bad_utf8 |= _invalid_utf8(column)
    if not too_big.any() and not bad_utf8.any():
        return None
    for i in np.flatnonzero(too_big | bad_utf8):
        head = text[int(i)].as_buffer()
        raw = head.to_pybytes()[:MAX_REJECT_TEXT] if head is not None else b""
        record = start + int(i)
        if too_big[i]:
            out.reject(
                record,
                "record_too_large",
                f"text cell of {int(sizes[i]):,} bytes > limits.max_record_bytes={cap:,}",
                raw.decode("utf-8", "replace"),
            )
        else:
            out.reject(
                record,
                "invalid_utf8",
                "a string cell (text, url or a provenance column) is not valid UTF-8",
                raw.decode("utf-8", "replace"),
            )
    return ~(too_big | bad_utf8)


def _invalid_utf8(values: pa.Array) -> np.ndarray:
    """Per row: not valid UTF-8. One C pass in the usual case; row by row only when it fails."""
    as_str = values.view(pa.string()) if pa.types.is_binary(values.type) else values
    try:
        as_str.validate(full=True)
        return np.zeros(len(values), dtype=bool)
    except pa.ArrowInvalid:
        pass
    raw = values.view(pa.binary()) if pa.types.is_string(values.type) else values
    bad = np.zeros(len(values), dtype=bool)
    for i, v in enumerate(raw.to_pylist()):
        if v is not None:
            try:
                v.decode("utf-8")
            except UnicodeDecodeError:
                bad[i] = True
    return bad


def _rows(
    out: BatchBuilder,
    file: InputFile,
    opts: TableOptions,
    batch: pa.RecordBatch,
    positions: np.ndarray,
    field: str,
    url_field: str | None,
) -> None:
    for record, obj in zip(positions.tolist(), batch.to_pylist()):
        text = obj.get(field)
        if isinstance(text, bytes):
            text = text.decode("utf-8")  # checked by _screen
        if not isinstance(text, str):
            out.reject(
                record,
                "missing_text_field" if text is None else "malformed_record",
                f"{field!r} is {type(text).__name__}, not a string",
            )
            continue
        url = obj.get(url_field) if url_field else None
        mark = out.mark()
        try:
            add_table_row(out, file, opts, record, obj, text, url if isinstance(url, str) else None)  # type: ignore[arg-type]
        except Exception as exc:  # one row's surprise must not end the file
            out.rollback(mark)
            out.reject(record, "record_error", describe_error(exc), text[:MAX_REJECT_TEXT])


def _to_docs(text: pa.Array, url: pa.Array, file: InputFile, positions: np.ndarray) -> pa.Table:
    n = len(positions)
    src = file.source
    # Vectorized doc_id(): the same "<source>/<file>#<row>" for every row, without a Python loop.
    rows = pc.cast(pa.array(positions.astype(np.int64)), pa.string())
    ids = pc.binary_join_element_wise(doc_id(src.name, file.name, ""), rows, "")
    return pa.Table.from_arrays(
        [
            ids,
            pa.array([src.name] * n, pa.string()),
            pa.array([src.kind] * n, pa.string()),
            text.view(pa.string()) if pa.types.is_binary(text.type) else text,
            url.view(pa.string()) if pa.types.is_binary(url.type) else url,
            pa.array([file.name] * n, pa.string()),
        ],
        schema=BASE_SCHEMA,
    )


def split_points(path: Path, size: int, target: int, cuts: list[int]) -> list[int]:
    """First row groups of ranges of about ``target`` compressed bytes (from the footer only)."""
    try:
        meta = pq.ParquetFile(parquet_source(path)).metadata
    except Exception:  # noqa: BLE001 - unreadable: one task, and the reader makes it a reject
        return [0]
    bounds, held = [0], 0  # compressed bytes of the range being planned
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        n = sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
        if held and held + n > target:
            bounds.append(g)
            held = 0
        held += n
    return bounds


def columns(path: Path, max_record_bytes: int = 0) -> set[str]:
    return set(pq.ParquetFile(parquet_source(path)).schema_arrow.names)  # the footer only


SPEC = ReaderSpec(
    "parquet",
    read_parquet,
    TableOptions,
    suffixes=(".parquet", ".pq"),
    streamed=True,
    split_points=split_points,
    split_unit="row_groups",
    named_fields=True,
    probe_fields=columns,
    probed_as="column of",
)
