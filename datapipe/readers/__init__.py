"""Reader registry: input format -> its ``ReaderSpec`` (how to read it and everything else about it).

Each reader module declares its format's spec once (``datapipe/readers/spec.py``); this is the one
list of built-in formats. Formats of other packages come in through entry points
(``datapipe/plugins``, ``datapipe/readers/registry.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from dataclasses import replace
from pathlib import Path

from datapipe.readers import arxiv, code_repos, html_pages, jsonl, parquet, warc
from datapipe.readers.base import InputFile, ReadBatch
from datapipe.readers.registry import ReaderRegistry
from datapipe.readers.spec import Reader, ReaderSpec
from datapipe.storage.uri import ensure_local

READER_SPECS = ReaderRegistry(
    jsonl.SPEC,
    parquet.SPEC,
    warc.WARC,
    warc.WET,
    warc.WAT,  # metadata only: every record rejected as wat_metadata_not_text
    html_pages.SPEC,
    code_repos.SPEC,
    arxiv.SPEC,
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


class _ReadFunctions(MutableMapping[str, Reader]):
    """Format -> its read function, a view of the registry. Setting one swaps the read function of a
    registered format (tests put a failing reader in place this way); new formats come as specs."""

    def __getitem__(self, fmt: str) -> Reader:
        return READER_SPECS[fmt].read

    def __setitem__(self, fmt: str, read: Reader) -> None:
        READER_SPECS.replace(replace(READER_SPECS[fmt], read=read))

    def __delitem__(self, fmt: str) -> None:
        raise TypeError("formats cannot be removed from the reader registry")

    def __iter__(self) -> Iterator[str]:
        return iter(READER_SPECS)

    def __len__(self) -> int:
        return len(READER_SPECS)


READERS: MutableMapping[str, Reader] = _ReadFunctions()

__all__ = [
    "READERS",
    "READER_SPECS",
    "InputFile",
    "ReadBatch",
    "Reader",
    "ReaderSpec",
    "infer_format",
    "reader_path",
    "reader_spec",
]
