"""Reader registry: input format -> its ``ReaderSpec`` (how to read it and everything else about it).

Each reader module declares its format's spec once (``datapipe/readers/spec.py``); this is the one
list of built-in formats, each imported when first needed. Formats of other packages come in
through entry points (``datapipe/plugins``, ``datapipe/readers/registry.py``).
"""

from __future__ import annotations

from pathlib import Path

from datapipe.readers.base import InputFile, ReadBatch
from datapipe.readers.registry import ReaderRegistry
from datapipe.readers.spec import Reader, ReaderSpec
from datapipe.storage.uri import ensure_local

# format -> "module:SPEC". A new format is one line here.
READER_SPECS = ReaderRegistry(
    {
        "jsonl": "datapipe.readers.jsonl:SPEC",
        "parquet": "datapipe.readers.parquet:SPEC",
        "warc": "datapipe.readers.warc:WARC",
        "wet": "datapipe.readers.warc:WET",
        "wat": "datapipe.readers.warc:WAT",  # metadata only: every record rejected as wat_metadata_not_text
        "html": "datapipe.readers.html_pages:SPEC",
        "repo": "datapipe.readers.code_repos:SPEC",
        "arxiv": "datapipe.readers.arxiv:SPEC",
    }
)


def reader_spec(fmt: str) -> ReaderSpec:
    """The spec of a format (a plugin's is loaded on first use); KeyError for an unknown one."""
    return READER_SPECS[fmt]


def infer_format(path: Path, kind: str = "text") -> str | None:
    """The format of an input from its name, and for folders and archives from the source kind."""
    return READER_SPECS.infer(path, kind)


def reader_path(path: str | Path, fmt: str) -> Path:
    """The path a map task hands its reader: an object is read in place when the format streams,
    and downloaded whole to this node's mirror only when its reader needs a local file."""
    return Path(path) if READER_SPECS[fmt].streamed else ensure_local(path)


__all__ = [
    "READER_SPECS",
    "InputFile",
    "ReadBatch",
    "Reader",
    "ReaderSpec",
    "infer_format",
    "reader_path",
    "reader_spec",
]
