"""``jsonl``: kept documents with the chosen columns, one JSON object per line, for anything else.

Files: ``<source>/<split>-NNNNN.jsonl`` of at most ``docs_per_file`` documents each.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from datapipe.export.core import temp_for
from datapipe.export.documents import RunDocuments


class JsonlPart:
    def __init__(self, out: Path, rel: str, docs_per_file: int) -> None:
        self.rel, self.limit, self.n = rel, docs_per_file, 0
        self.tmp = temp_for(out, rel)
        self.f = self.tmp.open("w", encoding="utf-8")

    def room(self, table: pa.Table) -> int:
        return self.limit - self.n

    def write(self, table: pa.Table) -> None:
        for row in table.to_pylist():
            self.f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        self.n += table.num_rows

    def close(self) -> dict[str, Any]:
        self.f.close()
        return {}

    def abort(self) -> None:
        self.f.close()
        self.tmp.unlink(missing_ok=True)

    @property
    def temp_files(self) -> dict[str, Path]:
        return {self.rel: self.tmp}


class JsonlFormat:
    name = "jsonl"
    default_columns: tuple[str, ...] = ("id", "text")

    def __init__(self, docs_per_file: int = 100_000) -> None:
        self.docs_per_file = docs_per_file

    def options(self) -> dict[str, Any]:
        return {"docs_per_file": self.docs_per_file}

    def open_part(self, out: Path, source: str, split: str, part: int, schema: pa.Schema, docs: RunDocuments) -> JsonlPart:
        return JsonlPart(out, f"{source}/{split}-{part:05d}.jsonl", self.docs_per_file)

    def finish_stream(
        self, out: Path, source: str, split: str, parts: list[dict[str, Any]], schema: pa.Schema
    ) -> dict[str, Path]:
        return {}

    def finish(self, out: Path, result: Any, docs: RunDocuments) -> dict[str, Path]:
        return {}
