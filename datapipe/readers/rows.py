"""Code and paper rows from JSONL/Parquet (The Stack style code dumps, RedPajama style papers).

With ``kind: code`` each row is one source file: ``path_field``/``repo_field``/``language_field``
fill the code columns and the repository reader's reject rules apply (vendored, lockfile,
binary, minified, generated, too large). With ``kind: paper`` the arXiv id field and the
metadata join fill the paper columns. Other kinds keep the plain base columns.
"""

from __future__ import annotations

import json
from typing import Any

from datapipe.readers.arxiv import PAPER_COLUMNS, metadata_columns
from datapipe.readers.base import InputFile
from datapipe.readers.code_repos import CODE_COLUMNS, TableOptions, add_code_file
from datapipe.readers.columns import ColumnsBuilder
from datapipe.schema import RECORD_LICENSE


def table_options(file: InputFile) -> TableOptions:
    return TableOptions.model_validate(file.source.options)


def text_field(file: InputFile, opts: TableOptions) -> str:
    return opts.content_field or file.source.text_field


MAX_LICENSE_CHARS = 500  # an SPDX expression is short; more is not one


def row_builder(file: InputFile, batch_size: int) -> ColumnsBuilder | None:
    """A builder with the kind's columns (and the record's licence, when the source names its field),
    or None when rows need no extra columns."""
    columns = dict({"code": CODE_COLUMNS, "paper": PAPER_COLUMNS}.get(file.source.kind, {}))
    if file.source.license_field:
        columns[RECORD_LICENSE] = "string"
    return ColumnsBuilder.create(file, batch_size, columns) if columns else None


def record_license(obj: dict[str, Any], field: str | None) -> str | None:
    """The record's licence field as text: a string as it is, anything else (a list, a mapping) as
    JSON, so that the license stage can say what it found instead of a value vanishing."""
    value = obj.get(field) if field else None
    if value is None or value == "":
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text[:MAX_LICENSE_CHARS]


def _str(obj: dict[str, Any], field: str | None) -> str | None:
    value = obj.get(field) if field else None
    return value if isinstance(value, str) and value else None


def add_table_row(
    out: ColumnsBuilder, file: InputFile, opts: TableOptions, record: int | str, obj: dict[str, Any], text: str, url: str | None
) -> None:
    lic = record_license(obj, file.source.license_field)
    if file.source.kind == "code":
        path = _str(obj, opts.path_field) or ""
        added = len(out.docs["id"])
        add_code_file(
            out,
            str(record),
            path,
            text.encode("utf-8", "surrogatepass"),
            _str(obj, opts.repo_field),
            None,
            opts.max_file_bytes,
            _str(obj, opts.language_field),
            url,
        )
        if lic is not None and len(out.docs["id"]) > added:  # a file the code rules kept
            out.extra_docs[RECORD_LICENSE][-1] = lic
    elif file.source.kind == "paper":
        cols = metadata_columns(file, opts.metadata, _str(obj, opts.arxiv_id_field))
        out.add_row(record, text, url, **cols, **{RECORD_LICENSE: lic})
    else:
        out.add_row(record, text, url, **{RECORD_LICENSE: lic})
