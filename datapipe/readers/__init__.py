"""Reader registry: input format -> function reading one input file into document batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel

from datapipe.readers.arxiv import ArxivOptions, read_arxiv
from datapipe.readers.base import InputFile, ReadBatch
from datapipe.readers.code_repos import RepoOptions, TableOptions, read_repo
from datapipe.readers.html_pages import HtmlOptions, read_html
from datapipe.readers.jsonl import read_jsonl
from datapipe.readers.parquet import read_parquet
from datapipe.readers.warc import read_warc, read_wat, read_wet
from datapipe.storage.uri import ensure_local

Reader = Callable[[InputFile, int], Iterator[ReadBatch]]

READERS: dict[str, Reader] = {
    "jsonl": read_jsonl,
    "parquet": read_parquet,
    "warc": read_warc,  # WARC and ARC, plain or gzipped
    "wet": read_wet,
    "wat": read_wat,  # metadata only: every record rejected as wat_metadata_not_text
    "html": read_html,
    "repo": read_repo,
    "arxiv": read_arxiv,
}

# Typed options a format's reader accepts under `sources[i].options` (validated before any work;
# the reader re-validates the same dict with the same model to get defaults).
READER_OPTIONS: dict[str, type[BaseModel]] = {
    "warc": HtmlOptions, "html": HtmlOptions, "repo": RepoOptions, "arxiv": ArxivOptions,
    "jsonl": TableOptions, "parquet": TableOptions,
}

# Formats whose reader reads an object in object storage in place (storage.open_input: ranged
# reads, a split file's task only its range). The others walk folders or archives on disk
# (zip/tar members, a repository's files): they get a whole mirror copy on the node that reads them.
STREAMED_FORMATS = frozenset({"jsonl", "parquet", "warc", "wet", "wat"})


def reader_path(path: str | Path, fmt: str) -> Path:
    """The path a map task hands its reader: an object is read in place when the format streams,
    and downloaded whole to this node's mirror only when its reader needs a local file."""
    return Path(path) if fmt in STREAMED_FORMATS else ensure_local(path)


# Formats whose input may be a folder (a repository, a folder of HTML pages, an unpacked arXiv source).
DIRECTORY_FORMATS = {"repo", "html", "arxiv"}
_DIRECTORY_BY_KIND = {"code": "repo", "web": "html", "paper": "arxiv"}
_ARCHIVE_BY_KIND = {"code": "repo", "paper": "arxiv"}
_ARCHIVES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar", ".zip")

# Longest suffix first, so ".warc.wet.gz" wins over ".gz".
_SUFFIXES: list[tuple[str, str]] = [
    (".jsonl.gz", "jsonl"), (".jsonl.zst", "jsonl"), (".jsonl.bz2", "jsonl"), (".jsonl.xz", "jsonl"),
    (".json.gz", "jsonl"), (".jsonl", "jsonl"), (".ndjson", "jsonl"), (".json", "jsonl"),
    (".parquet", "parquet"), (".pq", "parquet"),
    (".warc.wet.gz", "wet"), (".wet.gz", "wet"), (".wet", "wet"), (".warc.wat.gz", "wat"), (".wat.gz", "wat"),
    (".wat", "wat"), (".warc.gz", "warc"), (".warc", "warc"), (".arc.gz", "warc"), (".arc", "warc"),
    (".html", "html"), (".htm", "html"), (".xhtml", "html"), (".tex.gz", "arxiv"), (".tex", "arxiv"),
]


def infer_format(path: Path, kind: str = "text") -> str | None:
    """The format of an input from its name, and for folders and archives from the source kind
    (a .tar.gz is a code repository for kind code and an arXiv source for kind paper)."""
    if path.is_dir():
        return _DIRECTORY_BY_KIND.get(kind)
    name = path.name.lower()
    if name.endswith(_ARCHIVES):
        return _ARCHIVE_BY_KIND.get(kind)
    if kind == "paper" and name.endswith(".gz") and not name.endswith((".jsonl.gz", ".json.gz")):
        return "arxiv"  # arXiv ships single-file sources as a bare gzipped .tex (e.g. 1603.07285.gz)
    for suffix, fmt in _SUFFIXES:
        if name.endswith(suffix):
            return fmt
    return None


__all__ = ["DIRECTORY_FORMATS", "READERS", "READER_OPTIONS", "InputFile", "ReadBatch", "Reader", "infer_format"]
