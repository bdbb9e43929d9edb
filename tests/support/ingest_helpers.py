"""Running one reader over one file in-process, for the ingest tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from datapipe.pipeline.load import SourceConfig
from datapipe.readers import infer_format, reader_spec
from datapipe.readers.base import InputFile


def read_all(
    path: Path, kind: str, fmt: str | None = None, options: dict[str, Any] | None = None, name: str | None = None
) -> tuple[list[dict], list[dict]]:
    """(documents, rejects) as row dicts; checks the reader contract on the way."""
    fmt = fmt or infer_format(path, kind)
    assert fmt is not None, f"no format inferred for {path}"
    src = SourceConfig(name="s", kind=kind, paths=["x"], options=options or {})
    docs: list[dict] = []
    rejects: list[dict] = []
    schemas: set[pa.Schema] = set()
    for batch in reader_spec(fmt).read(InputFile(path, name or path.name, src), 50):
        schemas.add(batch.docs.schema)
        docs += batch.docs.to_pylist()
        if batch.rejects is not None:
            rejects += batch.rejects.to_pylist()
    assert len(schemas) <= 1, "column types must be the same in every batch"
    ids = [r["id"] for r in docs + rejects]
    assert len(ids) == len(set(ids)), "document ids must be unique within an input file"
    return docs, rejects
