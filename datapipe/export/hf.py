"""``hf``: files Hugging Face ``datasets`` reads as they are.

``arrow`` (default): Arrow IPC *stream* files, the format of ``datasets``' own cache files, so
``Dataset.from_file(path)`` memory-maps them without a copy; ``load_dataset("arrow",
data_files=...)`` reads them too. ``parquet``: ``load_dataset("parquet", data_files=...)``.
Files: ``<source>/<split>-NNNNN.arrow|parquet`` of at most ``docs_per_file`` documents, with
the chosen columns (``input_ids`` as a list of the run's token dtype).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from datapipe.export.core import temp_for
from datapipe.export.documents import RunDocuments

FILE_FORMATS = ("arrow", "parquet")


class HfPart:
    def __init__(self, out: Path, rel: str, schema: pa.Schema, file_format: str, docs_per_file: int) -> None:
        self.rel, self.limit, self.n = rel, docs_per_file, 0
        self.tmp = temp_for(out, rel)
        self.schema = schema
        self.sink = pa.OSFile(str(self.tmp), "wb")
        self.writer: Any = (
            pa.ipc.new_stream(self.sink, self.schema) if file_format == "arrow" else pq.ParquetWriter(self.sink, self.schema)
        )

    def room(self, table: pa.Table) -> int:
        return self.limit - self.n

    def write(self, table: pa.Table) -> None:
        self.writer.write_table(table)
        self.n += table.num_rows

    def close(self) -> dict[str, Any]:
        self.writer.close()
        self.sink.close()
        return {}

    def abort(self) -> None:
        try:
            self.close()
        finally:
            self.tmp.unlink(missing_ok=True)

    @property
    def temp_files(self) -> dict[str, Path]:
        return {self.rel: self.tmp}


class HfFormat:
    name = "hf"
    default_columns: tuple[str, ...] = ("id", "text", "input_ids")

    def __init__(self, file_format: str = "arrow", docs_per_file: int = 100_000) -> None:
        self.file_format, self.docs_per_file = file_format, docs_per_file

    def options(self) -> dict[str, Any]:
        return {"file_format": self.file_format, "docs_per_file": self.docs_per_file}

    def open_part(self, out: Path, source: str, split: str, part: int, schema: pa.Schema, docs: RunDocuments) -> HfPart:
        return HfPart(out, f"{source}/{split}-{part:05d}.{self.file_format}", schema, self.file_format, self.docs_per_file)

    def finish_stream(
        self, out: Path, source: str, split: str, parts: list[dict[str, Any]], schema: pa.Schema
    ) -> dict[str, Path]:
        return {}

    def finish(self, out: Path, result: Any, docs: RunDocuments) -> dict[str, Path]:
        return {}
