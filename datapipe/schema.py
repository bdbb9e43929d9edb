"""The document batch: one ``pyarrow.Table`` schema that every reader emits and every stage extends.

Readers emit the base columns below; stages append signal columns (``lang``,
``lang_score``, ``text_hash``, ...). Rejected rows keep every column they had when
they were dropped, plus ``stage``, ``reason`` and ``detail``.
"""

from __future__ import annotations

import pyarrow as pa

BASE_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),  # "<source>/<input file>#<record>": stable, readable
        pa.field("source", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # web | code | paper | text
        pa.field("text", pa.string()),
        pa.field("url", pa.string()),
        pa.field("path", pa.string()),  # input file, or the file inside a repository/archive
    ]
)
BASE_COLUMNS = tuple(BASE_SCHEMA.names)

# Columns the engine adds to rejected rows.
REJECT_COLUMNS = (
    pa.field("stage", pa.string()),
    pa.field("reason", pa.string()),
    pa.field("detail", pa.string()),
)

READ_STAGE = "read"  # the stage name for documents rejected while reading their input


def empty_batch() -> pa.Table:
    return BASE_SCHEMA.empty_table()


def make_batch(columns: dict[str, list], extra: dict[str, pa.Array] | None = None) -> pa.Table:
    """Build a batch from python lists of the base columns (missing ones become null)."""
    n = len(columns["id"])
    arrays = [pa.array(columns.get(f.name, [None] * n), type=f.type) for f in BASE_SCHEMA]
    table = pa.Table.from_arrays(arrays, schema=BASE_SCHEMA)
    for name, values in (extra or {}).items():
        table = table.append_column(name, values)
    return table


def doc_id(source: str, input_name: str, record: int | str) -> str:
    return f"{source}/{input_name}#{record}"
