"""Small helpers stages share for adding signal columns."""

from __future__ import annotations

import pyarrow as pa


def set_column(batch: pa.Table, name: str, values: pa.Array | pa.ChunkedArray) -> pa.Table:
    """Add or replace a column (a stage applied twice must not duplicate its signals)."""
    i = batch.schema.get_field_index(name)
    if i >= 0:
        return batch.set_column(i, name, values)
    return batch.append_column(name, values)
