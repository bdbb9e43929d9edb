"""What a completion marker says about the files its task wrote (``files``: path, bytes, sha256
and the footer length of Parquet files), so that a later start can tell a missing or damaged
output from a good one (``run_folder/integrity.py``) on local disk and in object storage alike,
and a reader on another node can fetch a Parquet footer in one request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datapipe.storage.parquet_reads import footer_length
from datapipe.tokens.shard_format import file_sha256

# Every file a marker names gets its sha256, intermediates under _work/ too (map outputs, token
# lists, shuffle and merge files, decisions: whatever a phase writes, of any format): a bit flipped
# in one of a killed run's intermediates is then found when the run starts again and its task
# redone, where the task reading it failed the same way on every resume ("Corrupt Lz4 compressed
# data"), or read other values without an error. It costs each task a read of what it just wrote,
# from the page cache (sha256 ~1.5 GB/s on one core: well under 1% of a task's CPU on the shared
# corpus), and a resumed run one read of the earlier attempts' files.


def describe_files(root: Path, written: list[Path]) -> list[dict[str, Any]]:
    """The files a task wrote, for its marker: path relative to ``root``, bytes and sha256 (a read of
    a file just written: from the page cache)."""
    files = []
    for path in dict.fromkeys(written):
        p = Path(path)
        if not p.is_file() or not p.is_relative_to(root):
            continue  # written, then removed by the task itself; or not in the run folder (a fetched input)
        rel = p.relative_to(root).as_posix()
        entry: dict[str, Any] = {"path": rel, "bytes": p.stat().st_size, "sha256": file_sha256(p)}
        if rel.endswith(".parquet") and (footer := footer_length(p)) is not None:
            entry["footer"] = footer  # a reader on another node reads it in one request (storage/parquet_reads.py)
        files.append(entry)
    return sorted(files, key=lambda f: f["path"])
