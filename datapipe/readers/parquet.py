"""Parquet files of documents (one row per document)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datapipe.readers.base import BatchBuilder, InputFile, ReadBatch, describe_error
from datapipe.readers.rows import add_table_row, row_builder, table_options, text_field
from datapipe.schema import BASE_SCHEMA, doc_id


def read_parquet(file: InputFile, batch_size: int) -> Iterator[ReadBatch]:
    src = file.source
    opts = table_options(file)
    rows = row_builder(file, batch_size)  # code/paper rows carry their kind's columns: row by row
    out = rows or BatchBuilder(file, batch_size)
    field = text_field(file, opts)
    row = 0
    try:
        pf = pq.ParquetFile(file.path)
        names = pf.schema_arrow.names
        if field not in names:
            out.reject("file", "missing_text_field", f"no column {field!r}; columns: {names[:20]}")
            yield out.flush()  # type: ignore[misc]
            return
        url_field = src.url_field if src.url_field in names else None
        extra = [f for f in (opts.path_field, opts.repo_field, opts.language_field, opts.arxiv_id_field)
                 if f and f in names and f not in (field, url_field)]
        columns = [field] + ([url_field] if url_field else []) + extra
        for batch in pf.iter_batches(batch_size=batch_size, columns=columns):
            if rows is None:
                yield ReadBatch(_to_docs(batch, file, row, field, url_field))
            else:
                yield from _rows(rows, file, opts, batch, row, field, url_field)
            row += batch.num_rows
    except Exception as exc:
        out.reject(f"{row}-", "unreadable_input", f"reading stopped at row {row}: {describe_error(exc)}")
        yield out.flush()  # type: ignore[misc]


def _rows(out: BatchBuilder, file: InputFile, opts, batch: pa.RecordBatch, start: int, field: str,  # type: ignore[no-untyped-def]
          url_field: str | None) -> Iterator[ReadBatch]:
    for i, obj in enumerate(batch.to_pylist()):
        text = obj.get(field)
        if not isinstance(text, str):
            out.reject(start + i, "missing_text_field" if text is None else "malformed_record",
                       f"{field!r} is {type(text).__name__}, not a string")
        else:
            url = obj.get(url_field) if url_field else None
            add_table_row(out, file, opts, start + i, obj, text, url if isinstance(url, str) else None)  # type: ignore[arg-type]
    if (flushed := out.flush()) is not None:
        yield flushed


def _to_docs(batch: pa.RecordBatch, file: InputFile, start: int, text_field: str, url_field: str | None) -> pa.Table:
    n = batch.num_rows
    src = file.source
    text = batch.column(text_field)
    if not pa.types.is_string(text.type) and not pa.types.is_large_string(text.type):
        text = pc.cast(text, pa.string())  # numbers etc.; binary that is not UTF-8 fails loudly here
    url = pc.cast(batch.column(url_field), pa.string()) if url_field else pa.nulls(n, pa.string())
    # Vectorized doc_id(): the same "<source>/<file>#<row>" for every row, without a Python loop.
    rows = pc.cast(pa.array(np.arange(start, start + n, dtype=np.int64)), pa.string())
    ids = pc.binary_join_element_wise(doc_id(src.name, file.name, ""), rows, "")
    return pa.Table.from_arrays(
        [ids, pa.array([src.name] * n, pa.string()), pa.array([src.kind] * n, pa.string()),
         pc.cast(text, pa.string()), url, pa.array([file.name] * n, pa.string())],
        schema=BASE_SCHEMA,
    )
