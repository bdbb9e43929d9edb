"""Code and paper rows from JSONL/Parquet (The Stack style code dumps, RedPajama style papers).

With ``kind: code`` each row is one source file: ``path_field``/``repo_field``/``language_field``
fill the code columns and the repository reader's reject rules apply (vendored, lockfile,
binary, minified, generated, too large). With ``kind: paper`` the arXiv id field and the
metadata join fill the paper columns. Other kinds keep the plain base columns.
"""

from __future__ import annotations

from typing import Any

from datapipe.readers.arxiv import PAPER_COLUMNS, metadata_columns
from datapipe.readers.base import InputFile
from datapipe.readers.code_repos import CODE_COLUMNS, TableOptions, add_code_file
from datapipe.readers.columns import ColumnsBuilder


def table_options(file: InputFile) -> TableOptions:
    return TableOptions.model_validate(file.source.options)


def text_field(file: InputFile, opts: TableOptions) -> str:
    return opts.content_field or file.source.text_field


def row_builder(file: InputFile, batch_size: int) -> ColumnsBuilder | None:
    """A builder with the kind's columns, or None when rows need no extra columns."""
    columns = {"code": CODE_COLUMNS, "paper": PAPER_COLUMNS}.get(file.source.kind)
    return ColumnsBuilder.create(file, batch_size, columns) if columns else None


def _str(obj: dict[str, Any], field: str | None) -> str | None:
    value = obj.get(field) if field else None
    return value if isinstance(value, str) and value else None


def add_table_row(
    out: ColumnsBuilder, file: InputFile, opts: TableOptions, record: int | str, obj: dict[str, Any], text: str, url: str | None
) -> None:
    if file.source.kind == "code":
        path = _str(obj, opts.path_field) or ""
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
    else:
        cols = metadata_columns(file, opts.metadata, _str(obj, opts.arxiv_id_field))
        out.add_row(record, text, url, **cols)
