"""Is every input still what the run's tasks read? Checked at the end of a run and at every resume.

Each task that reads input files (``map0``, and the newline pre-pass ``lines`` whose counts later
ranges number their records by) keeps in its marker, under ``reads``, every input it opened: the
file's identity when opened (``bytes``, ``mtime_ns``, and ``change``: inode and ctime of a local
file, version or ETag of an object; see ``storage.uri.input_identity``) and, for the readers that
read through ``storage.uri.open_input`` (JSONL, Parquet, WARC), the extents of the bytes read and
their sha256, hashed while they were read (``storage/input_reads.py``).

The check, cheapest first, per input file:

1. the file now: one ``stat`` (one metadata request for an object). Gone, or of another size or
   modification time than a task (or, at the end, the run's start) saw: changed; nothing is read.
2. the same size, mtime and change token as each task saw: unchanged; nothing is read. This is the
   common case, so a run pays a stat per input, not a second read of its inputs.
3. otherwise only the change token differs (a same-size rewrite with its mtime put back shows a
   new ctime; an object overwritten a new ETag; a copy put back with ``cp -p`` a new inode): the
   tasks' extents of that file, and only those, are read again and hashed. The same bytes (a
   restored copy) go on; other bytes are a changed input. A read recorded without hashes (a
   reader that opens files itself: archives, folders) cannot be settled so: changed.

A changed input stops the run with :class:`InputChanged`, naming the file, before run.json says
complete: the finished tasks and the rest would mix two versions of it.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from datapipe.config.input_names import path_of_display_name
from datapipe.engine.errors import PipelineError
from datapipe.engine.work_files import map_phase
from datapipe.run_folder.layout import LINES_PHASE, RunFolder
from datapipe.storage.uri import input_identity, is_uri, mirror_of, read_again_sha256

READ_PHASES = (LINES_PHASE, map_phase(0))  # the phases whose tasks read input files
START = "the run started"  # when the listing's identity was seen
Reads = dict[str, list[tuple[str, dict[str, Any]]]]  # input -> (when: the task, what it read) of every read


# Reads found to match a file's bytes again (check_one step 3), with the file's identity then: the
# check at a run's end does not read again what the check at its start read, if nothing changed since.
_CONFIRMED: set[tuple[Any, ...]] = set()


class InputChanged(PipelineError):
    """An input file is not what the run's finished tasks read; the message names it and says how to go on."""


def recorded_reads(folder: RunFolder) -> Reads:
    """Every input read the finished tasks recorded, by input (as run.json lists it)."""
    out: Reads = defaultdict(list)
    for phase in READ_PHASES:
        for key, marker in folder.markers.read_all(phase, full=True).items():
            for read in marker.get("reads", []):
                out[read["path"]].append((f"task {phase} {key} read it", read))
    return out


def check_inputs(folder: RunFolder, inputs: list[dict[str, Any]], at_end: bool, log: Callable[[str], None]) -> Reads:
    """Raise :class:`InputChanged` if an input is not what the finished tasks read (``at_end``: nor
    what this attempt listed at its start). ``inputs``: run.json's listing. Returns the reads."""
    reads = recorded_reads(folder)
    checked = [e for e in inputs if reads.get(e["path"]) or at_end]
    with ThreadPoolExecutor(16) as pool:  # one metadata request per object on a store: in parallel
        now = dict(zip((e["path"] for e in checked), pool.map(lambda e: input_identity(_local_name(e["path"])), checked)))
    problems: list[str] = []
    for entry in checked:
        name = entry["path"]
        seen = [(START, entry)] if at_end else []
        problem = _check_one(name, now[name], seen + reads.get(name, []), log)
        if problem:
            problems.append(problem)
    if problems:
        when = "while the run ran" if at_end else "since its tasks read them"
        raise InputChanged(
            f"input files of the run in {folder.root} changed {when}: its finished tasks read other versions "
            f"of them, so its outputs would mix old and new contents"
            + (" (the run is not marked complete)" if at_end else "")
            + ":\n"
            + "\n".join(f"  - {p}" for p in problems[:30])
            + "\nUse --fresh to start over on the files as they are now, or put them back as the tasks read "
            "them (the same bytes, e.g. `cp -p` from a copy) and run the same command again."
        )
    return reads


def whole_file_sha256(reads: Reads, name: str, size: int) -> str | None:
    """The input's sha256 when one task read it through from its first byte to its last (free: the
    task hashed it as it read); None when it was read in ranges or in pieces (Parquet row groups)."""
    for _, read in reads.get(name, []):
        if read.get("bytes") == size and "sha256" in read and read["extents"] == ([[0, size]] if size else []):
            return read["sha256"]
    return hashlib.sha256(b"").hexdigest() if size == 0 and reads.get(name) else None


def _local_name(name: str) -> str:
    # an object: its mirror path names it; a local file: its recorded name (\xNN escapes) back to its path
    return str(mirror_of(name)) if is_uri(name) else path_of_display_name(name)


def _check_one(
    name: str, now: dict[str, Any] | None, seen: list[tuple[str, dict[str, Any]]], log: Callable[[str], None]
) -> str | None:
    """What is wrong with one input (None: nothing). ``seen``: (when, identity then) of each read,
    and at the end of a run the listing of its start."""
    if now is None:
        return f"{name}: deleted (since {seen[-1][0] if seen else 'the run started'})"
    for when, then in seen:  # steps 1 and 2: what the file's metadata tells
        if then.get("bytes") != now["bytes"]:
            return f"{name}: {then.get('bytes'):,} bytes when {when}, {now['bytes']:,} now (appended to or truncated)"
        if then.get("mtime_ns") is not None and now.get("mtime_ns") is not None and then["mtime_ns"] != now["mtime_ns"]:
            return f"{name}: modified since {when} (same size, another modification time)"
    # Step 3. The run's start is no read: a token changed since then is settled by what the tasks read.
    unsure = [(when, then) for when, then in seen if when != START and not _same_version(then, now)]
    if not unsure:
        return None
    known: dict[tuple[tuple[int, int], ...], str | None] = {}  # extents read again -> their sha256 now
    read_again = 0
    for when, then in unsure:
        if "sha256" not in then:
            return f"{name}: changed since {when} (its reader's bytes are not hashed, so it cannot be checked)"
        extents = tuple((int(a), int(b)) for a, b in then["extents"])
        confirmed = (name, now["bytes"], now.get("mtime_ns"), now["change"], extents, then["sha256"])
        if now["change"] is not None and confirmed in _CONFIRMED:
            continue  # read again by this process's check at its start, and the file has not changed since
        if extents not in known:
            known[extents] = read_again_sha256(_local_name(name), [list(e) for e in extents])
            read_again += sum(b - a for a, b in extents)
        if known[extents] != then["sha256"]:
            span = f"bytes {extents[0][0]:,}-{extents[-1][1]:,}" if extents else "its bytes"
            return f"{name}: rewritten since {when} ({span} are not what it read, with the same size" + (
                " and modification time)" if then.get("mtime_ns") is not None else ")"
            )
        _CONFIRMED.add(confirmed)
    if not read_again:
        return None
    log(
        f"datapipe: {name} was replaced or rewritten since it was read, but holds the bytes the run's tasks "
        f"read (read again: {read_again:,} bytes); going on"
    )
    return None


def _same_version(then: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether two identities surely are one version of the file (same size, mtime and change token);
    False where they differ or cannot tell (a store that gives no version or ETag)."""
    if then.get("change") is None or then.get("change") != now.get("change"):
        return False
    return then.get("mtime_ns") is None or now.get("mtime_ns") is None or then["mtime_ns"] == now["mtime_ns"]
