"""A document's text as its reader read it, before any stage changed it: the "before" of its edits.

The stages that change text (``pii``, ``boilerplate``, ``substrings``, ``langid`` with
``to_simplified``) keep only the result, so the text before them is read again from the input file,
through the same reader with the run's own source options and limits. A document id is
``<source>/<input name>#<record>``; run.json lists the run's inputs with their size and modification
time. A JSON Lines record is found by its line number (a plain file is cut to that line's byte range,
as a split run reads it); other formats are read from the start until the record comes, within a
time limit. An input that changed since the run (another size or modification time) is not used.
"""

from __future__ import annotations

import difflib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datapipe.storage import uri as storage

FIND_SECONDS = 1.0
SCAN_CHUNK = 1 << 20
DIFF_MAX_CHARS = 400_000  # texts beyond this are compared line by line without in-line highlights
INLINE_MAX_CHARS = 4_000


@dataclass(frozen=True)
class Original:
    text: str | None
    note: str  # where it came from, or why there is none


def _input_of(run: dict[str, Any], source: str, name: str) -> dict[str, Any] | None:
    for entry in run.get("inputs") or []:
        path = str(entry.get("path", ""))
        if entry.get("source") == source and (path == name or path.endswith("/" + name)):
            return entry
    return None


def _unchanged(entry: dict[str, Any]) -> str | None:
    """None when the input is as the run read it, else why not."""
    path = str(entry["path"])
    if storage.is_uri(path):
        found = storage.info(path)
        if found is None:
            return f"{path} is gone"
        if entry.get("bytes") is not None and found.size != entry["bytes"]:
            return f"{path} changed since the run ({found.size:,} bytes, the run read {entry['bytes']:,})"
        return None
    try:
        st = os.stat(path)
    except OSError:
        return f"{path} is not there any more"
    if entry.get("bytes") is not None and st.st_size != entry["bytes"]:
        return f"{path} changed since the run ({st.st_size:,} bytes, the run read {entry['bytes']:,})"
    if entry.get("mtime_ns") is not None and st.st_mtime_ns != entry["mtime_ns"]:
        return f"{path} was modified since the run"
    return None


def _line_start(path: str, line: int, deadline: float) -> int | None:
    """The byte offset where 1-based line ``line`` of a plain file starts; None past the deadline."""
    if line <= 1:
        return 0
    seen, offset = 0, 0
    with open(path, "rb") as f:
        while True:
            if time.perf_counter() > deadline:
                return None
            chunk = f.read(SCAN_CHUNK)
            if not chunk:
                return None
            n = chunk.count(b"\n")
            if seen + n >= line - 1:
                i = -1
                for _ in range(line - 1 - seen):
                    i = chunk.index(b"\n", i + 1)
                return offset + i + 1
            seen += n
            offset += len(chunk)


def original_text(run: dict[str, Any], doc_id: str, source: str, seconds: float = FIND_SECONDS) -> Original:
    """The text the reader gave document ``doc_id`` of ``source`` (``run``: its run.json)."""
    from datapipe.config.limits import ReadLimits
    from datapipe.config.sections import SourceConfig
    from datapipe.readers import READER_SPECS, reader_path
    from datapipe.readers.base import InputFile

    deadline = time.perf_counter() + seconds
    name, sep, record = doc_id[len(source) + 1 :].rpartition("#")
    entry = _input_of(run, source, name) if sep else None
    if entry is None:
        return Original(None, f"its input file ({name or doc_id}) is not among the run's inputs")
    changed = _unchanged(entry)
    if changed is not None:
        return Original(None, changed)
    config = run.get("config") or {}
    source_cfg = next((s for s in config.get("sources") or [] if s.get("name") == source), None)
    fmt = str(entry.get("format") or "")
    if source_cfg is None or fmt not in READER_SPECS:
        return Original(None, f"the reader of {entry['path']} is not known here (format {fmt!r})")
    spec = READER_SPECS[fmt]
    path = str(entry["path"])
    if storage.is_uri(path):
        if not spec.streamed:
            return Original(None, f"{path} would have to be downloaded whole to read it again")
        local = storage.mirror_of(path)
    else:
        local = Path(path)
    start, end, first = 0, None, 0
    plain_jsonl = fmt == "jsonl" and not storage.is_uri(path) and not path.endswith((".gz", ".zst", ".bz2", ".xz"))
    if plain_jsonl and record.startswith("L") and record[1:].isdigit():
        offset = _line_start(path, int(record[1:]), deadline)
        if offset is None:
            return Original(None, f"line {record[1:]} of {path} was not reached within {seconds:g} s")
        start, end, first = offset, offset + 1, int(record[1:]) - 1
    file = InputFile(
        reader_path(local, fmt),
        name,
        SourceConfig.model_validate(source_cfg),
        ReadLimits.model_validate(config.get("limits") or {}),
        start=start,
        end=end,
        first_record=first,
        ranged=end is not None,
    )
    for batch in spec.read(file, 64):
        ids = batch.docs["id"].to_pylist()
        if doc_id in ids:
            text = batch.docs["text"][ids.index(doc_id)].as_py()
            return Original(text, f"as the {fmt} reader reads it from {path}")
        if time.perf_counter() > deadline:
            return Original(None, f"record {record} of {path} was not reached within {seconds:g} s")
    return Original(None, f"record {record} is not in {path} as it is now")


@dataclass(frozen=True)
class DiffLine:
    kind: str  # "same", "del", "add", "skip" (unchanged lines left out)
    text: str
    spans: tuple[tuple[bool, str], ...] = ()  # (changed, piece) for an in-line highlight


def diff_lines(before: str, after: str, context: int = 2) -> list[DiffLine]:
    """A line diff of two texts, unchanged runs folded to ``context`` lines around each change; a
    changed line pair gets its changed characters marked."""
    a, b = before.splitlines(), after.splitlines()
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=len(before) + len(after) > DIFF_MAX_CHARS)
    out: list[DiffLine] = []
    for group in matcher.get_grouped_opcodes(context):
        if out:
            out.append(DiffLine("skip", "…"))
        for op, i1, i2, j1, j2 in group:
            if op == "equal":
                out += [DiffLine("same", line) for line in a[i1:i2]]
                continue
            old, new = a[i1:i2], b[j1:j2]
            if op == "replace" and len(old) == len(new):
                for x, y in zip(old, new):
                    left, right = _inline(x, y)
                    out += [DiffLine("del", x, left), DiffLine("add", y, right)]
                continue
            out += [DiffLine("del", line) for line in old] + [DiffLine("add", line) for line in new]
    return out


def _inline(x: str, y: str) -> tuple[tuple[tuple[bool, str], ...], tuple[tuple[bool, str], ...]]:
    if len(x) + len(y) > INLINE_MAX_CHARS:
        return ((True, x),), ((True, y),)
    m = difflib.SequenceMatcher(None, x, y, autojunk=False)
    left: list[tuple[bool, str]] = []
    right: list[tuple[bool, str]] = []
    for op, i1, i2, j1, j2 in m.get_opcodes():
        if x[i1:i2]:
            left.append((op != "equal", x[i1:i2]))
        if y[j1:j2]:
            right.append((op != "equal", y[j1:j2]))
    return tuple(left), tuple(right)
