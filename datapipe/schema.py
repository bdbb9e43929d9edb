"""The document batch: one ``pyarrow.Table`` schema that every reader emits and every stage extends.

Readers emit the base columns below; stages append signal columns (``lang``,
``lang_score``, ``text_hash``, ...). Rejected rows keep every column they had when
they were dropped, plus ``stage``, ``reason`` and ``detail`` (added by the engine).
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

READ_STAGE = "read"  # the stage name for documents rejected while reading their input
# Declared licences a batch may carry to the license stage: sources[i].license (the engine adds it to
# every document of the source) and the raw value of a record's sources[i].license_field (the reader).
SOURCE_LICENSE = "source_license"
RECORD_LICENSE = "record_license"
# A copies index file (copies/): the documents a dedup stage dropped in favour of one task's
# documents, ``dup_of`` the survivor's id; written by the engine, read by `explain`.
COPIES_SCHEMA = pa.schema([(c, pa.string()) for c in ("dup_of", "id", "reason", "detail")])


def doc_id(source: str, input_name: str, record: int | str) -> str:
    return f"{source}/{input_name}#{record}"
