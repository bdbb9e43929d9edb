"""Forming map tasks from input files: large files split into ranges, tiny files grouped.

One input file used to be one map task, so a 20 GB JSONL used one core. Here each source's
files, in the run's order, become *pieces* of about ``split.target_bytes`` (at most 10% over it):

- a file whose format can be split (its reader spec declares ``split_points``) is cut into
  ranges: the planner chooses how many (even byte cuts), the format moves each cut to where a
  record starts or plans its own units (the JSONL, Parquet and WARC modules in datapipe/readers
  say how). Where record ids count records from the file's start (JSONL line numbers), a range
  needs the count before it: a parallel pre-pass (phase ``lines``, one task per range but the
  last, the spec's ``prepass_count``) counts each range once, and a range adds up the counts of
  the ranges before it (k small marker reads for range k; linear, not quadratic).
- Whole files smaller than the target are grouped, consecutively within a source, until the
  group reaches the target: a thousand 100 KB files are a handful of tasks, not a thousand.

An input in object storage is planned without a download: its size comes from the store's
listing, and the few bytes a format's split points look at (a Parquet footer, a window after each
WARC cut) are ranged reads (``storage.input_stat``, ``storage.open_input``).

Ranges and groups keep the run's global order (sources, then sorted files, then ranges), so row
keys, dedup's "earliest" survivor and packing order are those of an unsplit run: outputs are
identical, only the task layout differs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from datapipe.pipeline.load import SplitConfig
from datapipe.readers import reader_spec
from datapipe.storage.uri import folder_stat, input_stat, is_input_file

__all__ = ["InputRange", "effective_target", "group_pieces", "plan_file", "task_key"]


@dataclass(frozen=True)
class InputRange:
    """One input file, or a part of it, read by a map task."""

    path: str
    input_name: str
    format: str
    file_index: int  # position among the source's files
    start: int = 0  # byte offset, or the format's own unit (ReaderSpec.split_unit: Parquet row groups)
    end: int | None = None  # exclusive; None: to the end of the file
    part: int = 0  # position among the file's ranges
    parts: int = 1
    nbytes: int = 0  # input bytes it covers, as planned (0: unknown); orders map tasks, largest first

    @property
    def whole(self) -> bool:
        return self.parts == 1


def effective_target(config: SplitConfig, total_bytes: int, cpus: int | None) -> int:
    """The range size for this corpus on this many CPUs: ``target_bytes``, shrunk so that a small
    corpus still gives ``min_tasks_per_cpu`` tasks per CPU, but never below ``min_bytes``
    (per-task overhead: starting a task, building stages, writing files)."""
    target = config.target_bytes
    if cpus and config.min_tasks_per_cpu > 0 and total_bytes > 0:
        # Rounded up: rounded down, a file of total_bytes would need one more (tiny) range.
        want = math.ceil(total_bytes / (config.min_tasks_per_cpu * cpus))
        target = min(target, max(want, min(config.min_bytes, target)))
    return max(target, 1)


def file_size(path: str) -> int:
    # a file here, an object in object storage, or a folder input (its files' sizes summed)
    st = input_stat(path) or folder_stat(path)
    return st.size if st is not None else 0


def plan_file(path: str, input_name: str, fmt: str, file_index: int, target: int) -> list[InputRange]:
    """The ranges of one file (one whole-file range when it is small or cannot be split)."""
    p = Path(path)
    st = input_stat(p)  # an object in object storage: its listed size, nothing downloaded
    if st is None:
        return [InputRange(path, input_name, fmt, file_index)]
    size = st.size
    whole = [InputRange(path, input_name, fmt, file_index, nbytes=size)]
    spec = reader_spec(fmt)
    in_bytes = spec.split_unit == "bytes"
    if spec.split_points is None or in_bytes and range_count(size, target) == 1:
        return whole  # nothing to cut, and nothing read to find that out
    bounds = sorted(set(spec.split_points(p, size, target, even_cuts(size, target))) | {0})
    if len(bounds) < 2:
        return whole
    ends: list[int | None] = [*bounds[1:], None]
    # Bounds in the format's own units (row groups) were planned near the target: an even share will do.
    sizes = [(e or size) - s for s, e in zip(bounds, ends)] if in_bytes else [size // len(bounds)] * len(bounds)
    return [
        InputRange(path, input_name, fmt, file_index, s, e, k, len(bounds), n)
        for k, (s, e, n) in enumerate(zip(bounds, ends, sizes))
    ]


def even_cuts(size: int, target: int) -> list[int]:
    """Start offsets of ``range_count(size, target)`` equal ranges. Equal, not ``target`` each plus
    a remainder: a short last range finishes early and leaves its core idle while the others work
    (2 GB in 256 MiB ranges on 2 CPUs: 7 full ranges and a 0.45 one, so at best 1.86 of 2 cores
    busy; 8 equal ranges: 2)."""
    n = range_count(size, target)
    return [size * k // n for k in range(n)]


# How far a range may exceed the target rather than add one more range to its file. A corpus of two
# equal halves on 2 CPUs gets a target of a sixth: the half a few bytes larger than three targets
# would become 4 ranges and the other 3 (the last wave of tasks then has one core idle, and the
# phase takes longer). With the slack both halves make 3.
RANGE_SLACK = 0.1


def range_count(size: int, target: int) -> int:
    """Ranges a file of ``size`` bytes is cut into: each at most ``target`` x (1 + ``RANGE_SLACK``)."""
    return max(1, math.ceil(size / target - RANGE_SLACK))


def group_pieces(ranges: list[InputRange], target: int, group: bool) -> list[tuple[InputRange, ...]]:
    """Tasks of one source in order: each range of a split file alone; whole small files grouped."""
    tasks: list[tuple[InputRange, ...]] = []
    current: list[InputRange] = []
    size = 0
    for r in ranges:
        n = (r.nbytes or file_size(r.path)) if r.whole else 0  # planned size; a folder's is summed here
        if not group or not r.whole or n >= target or not is_input_file(r.path):
            if current:
                tasks.append(tuple(current))
                current, size = [], 0
            tasks.append((r,))
            continue
        if current and size + n > target:
            tasks.append(tuple(current))
            current, size = [], 0
        current.append(r)
        size += n
    if current:
        tasks.append(tuple(current))
    return tasks


def task_key(source: str, pieces: tuple[InputRange, ...]) -> str:
    """Names every output of a task. A lone whole file keeps the key it always had."""
    first, last = pieces[0], pieces[-1]
    if len(pieces) > 1:
        return f"{source}/{first.file_index:05d}..{last.file_index:05d}"
    if not first.whole:
        return f"{source}/{first.file_index:05d}.part{first.part:04d}"
    return f"{source}/{first.file_index:05d}"
