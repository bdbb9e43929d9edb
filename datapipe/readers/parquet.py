"""Parquet files of documents (one row per document)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datapipe.readers.base import BatchBuilder, InputFile, ReadBatch, describe_error
from datapipe.schema import BASE_SCHEMA, doc_id


def read_parquet(file: InputFile, batch_size: int) -> Iterator[ReadBatch]:
    src = file.source
    out = BatchBuilder(file, batch_size)
    row = 0
    try:
        pf = pq.ParquetFile(file.path)
        names = pf.schema_arrow.names
        if src.text_field not in names:
            out.reject("file", "missing_text_field", f"no column {src.text_field!r}; columns: {names[:20]}")
            yield out.flush()  # type: ignore[misc]
            return
        columns = [src.text_field] + ([src.url_field] if src.url_field in names else [])
        for batch in pf.iter_batches(batch_size=batch_size, columns=columns):
            url_field = src.url_field if src.url_field in names else None
            yield ReadBatch(_to_docs(batch, file, row, src.text_field, url_field))
            row += batch.num_rows
    except Exception as exc:
        out.reject(f"{row}-", "unreadable_input", f"reading stopped at row {row}: {describe_error(exc)}")
        yield out.flush()  # type: ignore[misc]


def _to_docs(batch: pa.RecordBatch, file: InputFile, start: int, text_field: str, url_field: str | None) -> pa.Table:
    n = batch.num_rows
    src = file.source
    text = batch.column(text_field)
    if not pa.types.is_string(text.type) and not pa.types.is_large_string(text.type):
        text = pc.cast(text, pa.string())  # numbers etc.; binary that is not UTF-8 fails loudly here
    url = pc.cast(batch.column(url_field), pa.string()) if url_field else pa.nulls(n, pa.string())
    ids = [doc_id(src.name, file.name, start + i) for i in range(n)]
    return pa.Table.from_arrays(
        [pa.array(ids, pa.string()), pa.array([src.name] * n, pa.string()), pa.array([src.kind] * n, pa.string()),
         pc.cast(text, pa.string()), url, pa.array([file.name] * n, pa.string())],
        schema=BASE_SCHEMA,
    )
