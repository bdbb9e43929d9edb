"""Map markers whose counts disagree with themselves or with the files they name: found when a run's
end finds inputs != kept + rejected, so the task is named and redone instead of the folder blocked.

The end of a run sums the markers' counts (``finish.collect_counts``) and checks that every input
document is a kept or rejected row (``finish.check_conservation``). Tasks count what they write, so
a marker that breaks that balance was changed after its task wrote it (edited by hand, or damaged
in a way its JSON still parses). Which one? Each map marker is checked against the rows of its own
files, as their Parquet footers give them (a read of each footer, only when the balance is broken):

* its rejected counts add up to the rows of the rejected files it wrote, and each file's recorded
  ``rows`` (``audit_files``, what the audit database indexes) to its footer's;
* ``kept`` is the rows it handed on: its documents file in the last map phase, its map output
  (under ``_work/``) in an earlier one;
* what came in went out: the documents it read (``docs_in``, the first map phase) or the shard's
  documents the map task before it kept (a later phase) are its kept plus its rejected ones.

A marker failing any of these is discarded (``integrity.discard``), its task redone (tasks are
deterministic: the same files), and the run finished again.
"""

from __future__ import annotations

from typing import Any

from datapipe.engine.plan import RunSpec
from datapipe.engine.work_files import WorkFiles, map_phase
from datapipe.run_folder.integrity import Damage
from datapipe.run_folder.layout import RunFolder


def count_damage(folder: RunFolder, spec: RunSpec) -> list[Damage]:
    """The map markers whose counts disagree with their files (see the module doc), one ``Damage``
    each, naming the marker and what disagrees."""
    work = WorkFiles(folder)
    found: list[Damage] = []
    handed_on: dict[str, int] = {}  # shard -> the kept documents of its map task before this phase's
    stopped: set[str] = set()  # shards with a marker missing or whose balance broke (the later phases' rests on it)
    for segment in spec.segments:
        phase = map_phase(segment.index)
        # Whole (``full``): the counts checked here (rejected, audit_files) are what a held marker leaves
        # out (``markers.compact``); one phase at a time, not kept.
        markers = folder.markers.read_all(phase, full=True)
        for shard in spec.shards:
            marker = markers.get(shard.key)
            if shard.key in stopped or marker is None:
                stopped.add(shard.key)
                continue
            output = None if segment.final else work.map_output(segment.index, shard.key, fetch=False)
            what = _disagrees(folder, marker, handed_on.get(shard.key), output)
            if what is not None:
                found.append(Damage(phase, shard.key, folder.markers.rel(phase, shard.key), what))
                stopped.add(shard.key)
                continue
            handed_on[shard.key] = int(marker.get("kept", 0))
    return found


def _disagrees(folder: RunFolder, marker: dict[str, Any], handed_on: int | None, output: Any) -> str | None:
    """What in ``marker`` disagrees with its files or itself, or None. ``handed_on``: the documents this
    shard's previous map task kept (None: this is the first map phase); ``output``: the map output
    path of a phase before the last (None in the last)."""
    kept = int(marker.get("kept", 0))
    rejected = sum(int(n) for reasons in (marker.get("rejected") or {}).values() for n in reasons.values())
    if "audit_files" not in marker:  # a marker of a datapipe before files were recorded: its balance only
        came_in = int(marker.get("docs_in", 0)) if handed_on is None else handed_on
        return None if came_in == kept + rejected else f"{came_in:,} documents in, but {kept:,} kept + {rejected:,} rejected"
    rows: dict[str, int] = {"kept": 0, "rejected": 0}
    for entry in marker["audit_files"]:
        have = _rows(folder, entry["path"])
        if have is None:
            return f"{entry['path']}, which it names, is not readable"
        if int(entry.get("rows", have)) != have:
            return f"it says {entry['path']} holds {entry['rows']} rows; the file holds {have}"
        rows[entry["status"]] = rows.get(entry["status"], 0) + have
    if rejected != rows["rejected"]:
        return f"its rejected counts add up to {rejected:,}; its rejected files hold {rows['rejected']:,} rows"
    if output is None:
        handed, where = rows["kept"], "its documents file"
    else:
        handed, where = (_rows(folder, output) or 0) if folder.is_committed(output) else 0, "its map output"
    if kept != handed:
        return f"it says it kept {kept:,} documents; {where} holds {handed:,}"
    came_in = int(marker.get("docs_in", 0)) if handed_on is None else handed_on
    if came_in != kept + rejected:
        read = "read" if handed_on is None else "were handed on to it"
        return f"{came_in:,} documents {read}, but {kept:,} kept + {rejected:,} rejected"
    return None


def _rows(folder: RunFolder, path: Any) -> int | None:
    """The rows of a Parquet file of the run (a path relative to it, or a path in it), from its footer."""
    full = folder.root / path if isinstance(path, str) else path
    try:
        return int(folder.parquet(full).metadata.num_rows)
    except (OSError, ValueError):
        return None
