"""What a completion marker says about the files its task wrote (``files``: path, bytes, sha256
of documents files and the footer length of Parquet files), so that a later start can tell a
missing or damaged output from a good one (``run_folder/integrity.py``) on local disk and in
object storage alike, and a reader on another node can fetch a Parquet footer in one request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datapipe.storage.parquet_reads import footer_length
from datapipe.tokens.shard_format import file_sha256

# Files whose sha256 a marker records besides their size: the documents a run reports (kept and
# rejected) and the copies index `explain` reads (copies/). The token shards' sha256 is in the pack
# markers' manifest rows already; intermediates under _work/ get sizes only (hashing them would
# cost every task a second read of its outputs).
HASHED_PREFIXES = ("docs/", "rejected/", "copies/")


def describe_files(root: Path, written: list[Path]) -> list[dict[str, Any]]:
    """The files a task wrote, for its marker: path relative to ``root``, bytes, and sha256 for
    documents files (a read of a file just written: from the page cache, ~1 GB/s)."""
    files = []
    for path in dict.fromkeys(written):
        p = Path(path)
        if not p.is_file() or not p.is_relative_to(root):
            continue  # written, then removed by the task itself; or not in the run folder (a fetched input)
        rel = p.relative_to(root).as_posix()
        entry: dict[str, Any] = {"path": rel, "bytes": p.stat().st_size}
        if rel.startswith(HASHED_PREFIXES):
            entry["sha256"] = file_sha256(p)
        if rel.endswith(".parquet") and (footer := footer_length(p)) is not None:
            entry["footer"] = footer  # a reader on another node reads it in one request (storage/parquet_reads.py)
        files.append(entry)
    return sorted(files, key=lambda f: f["path"])
