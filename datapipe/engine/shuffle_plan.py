"""How a shuffle's runs reach their readers: merge levels of bounded fan-in, and readers sized by rows.

A shuffle has *writers* (map tasks, or a round's partition tasks), each writing one run sorted by key
(engine/tasks/runs.py) over a key space of ``keys`` keys (a global stage's parts, or the run's shards),
and *readers*, each reading a contiguous range of keys from every run that holds some of it: a
partition task its parts, a map task its shard's decisions. Read as written, each reader opens every
writer's run: writers x readers opens and footers, O(corpus^2) when both grow with it (issue 48).

So with more writers than a reader may open (``reader_files``), merge levels come first. Level l
groups the files of level l - 1 by ``fan_in`` consecutive groups (writer order), and cuts each key
range of level l - 1 into sub-ranges; a merge task is one (group, range): it reads that range from
each file of its group (at most ``fan_in`` byte ranges) and writes one run. Each level divides the
files covering a key by ``fan_in``, and the ranges are cut so that a task moves about ``task_bytes``,
so a level has about (shuffle bytes / task_bytes) tasks whatever the writers and keys. Levels stop
once a key is held by at most ``reader_files`` files: ceil(log_fan_in(writers / reader_files)) of
them (one at 37,253 map tasks with fan_in 256, two at 372,530).

Readers are cut by rows and bytes: every range of the last level into sub-ranges of about ``reader_rows``
rows and at most about ``reader_bytes`` bytes (by the rows and bytes its files hold, counted by their
writers' markers: wide rows, such as MinHash signatures, make fewer rows a task), so a reader's memory is bounded by
configuration at any corpus size, and it reads one byte range of each of at most ``reader_files``
files. Total work per level is O(rows + tasks x fan_in): linear in the corpus.

Everything here is a function of the writers' row and byte counts (their markers): the same plan on
every resume.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RunFile:
    """A run a task reads: its path in the run folder, what it holds (rows, keys ``lo``..``hi``-1), and
    for a run folder on an object store its size and footer length (so it is read in place without a
    listing or a marker: the task's own committed entry)."""

    path: str
    rows: int
    lo: int
    hi: int
    bytes: int = 0
    footer: int | None = None


@dataclass(frozen=True)
class Level:
    """One merge level's shape: ``groups`` groups of files, each cut into the same key ``ranges``."""

    groups: int
    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Grid:
    """The runs of one level (level 0: the writers), ``files[group][range]`` (None: no rows), over the
    key ``ranges`` shared by every group."""

    ranges: tuple[tuple[int, int], ...]
    files: tuple[tuple[RunFile | None, ...], ...]

    @property
    def groups(self) -> int:
        return len(self.files)

    def range_of(self, key: int) -> int:
        """The index of the range holding ``key``."""
        lo, hi = 0, len(self.ranges)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.ranges[mid][0] <= key:
                lo = mid
            else:
                hi = mid
        return lo

    def holding(self, lo: int, hi: int) -> list[RunFile]:
        """Every run with rows in [lo, hi), in reading order (group, then range): what a reader of that
        range reads (one range per group when readers nest in the ranges)."""
        first, last = self.range_of(lo), self.range_of(hi - 1)
        return [f for row in self.files for f in row[first : last + 1] if f is not None and f.rows]

    def holding_each(self, keys: int) -> list[tuple[RunFile, ...]]:
        """``tuple(holding(k, k + 1))`` for every key in [0, ``keys``), in one pass: the keys of a range
        share its tuple (a map phase asks this for every shard: a search per shard and kind was a third
        of its planning, issue 48)."""
        per_range = [tuple(f for row in self.files if (f := row[i]) is not None and f.rows) for i in range(len(self.ranges))]
        out: list[tuple[RunFile, ...]] = []
        i, last = 0, len(self.ranges) - 1
        for key in range(keys):
            while i < last and self.ranges[i + 1][0] <= key:  # as ``range_of``: the last range starting at or before
                i += 1
            out.append(per_range[i])
        return out

    @property
    def rows(self) -> int:
        return sum(f.rows for row in self.files for f in row if f is not None)


def writers_grid(writers: Sequence[RunFile | None], keys: int) -> Grid:
    """The writers' runs (in writer order; None: wrote nothing) as level 0: one range of every key."""
    return Grid(((0, keys),), tuple((w if w is not None and w.rows else None,) for w in writers))


@dataclass(frozen=True)
class MergeTask:
    """One merge task: level ``level``'s group ``group`` over key range [lo, hi) (``index`` among the
    level's ranges), reading ``inputs`` (at most fan_in runs, in writer order)."""

    level: int
    group: int
    index: int
    lo: int
    hi: int
    inputs: tuple[RunFile, ...] = field(repr=False)

    @property
    def key(self) -> str:
        """Its marker's name (and its output's)."""
        return merge_key(self.group, self.index)


def merge_key(group: int, index: int) -> str:
    return f"{group:07d}-{index:07d}"


def levels(writers: int, keys: int, total_bytes: int, fan_in: int, task_bytes: int, reader_files: int) -> list[Level]:
    """The merge levels of a shuffle of ``writers`` runs over ``keys`` keys holding ``total_bytes``: none
    when a reader may open every writer's run."""
    out: list[Level] = []
    groups = writers
    ranges: tuple[tuple[int, int], ...] = ((0, keys),)
    fan_in = max(2, fan_in)
    while groups > max(1, reader_files):
        groups = -(-groups // fan_in)
        want = max(1, -(-total_bytes // (groups * max(1, task_bytes))))  # ranges: a task moves ~task_bytes
        split = max(1, -(-want // len(ranges)))
        ranges = tuple(sub for lo, hi in ranges for sub in cut(lo, hi, split))
        out.append(Level(groups, ranges))
    return out


def cut(lo: int, hi: int, n: int) -> list[tuple[int, int]]:
    """[lo, hi) in ``n`` contiguous parts of about equal width (fewer when narrower than ``n``)."""
    n = max(1, min(n, hi - lo))
    bounds = [lo + (hi - lo) * i // n for i in range(n + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def level_tasks(prev: Grid, level: Level, number: int, fan_in: int) -> tuple[list[MergeTask], dict[tuple[int, int], RunFile]]:
    """The merge tasks of ``level`` (its ``number``: 1, 2, ...) over ``prev``, and the runs of ``prev`` that
    pass through unmerged (a group of one run whose range is not cut: that run is its own output)."""
    tasks: list[MergeTask] = []
    kept: dict[tuple[int, int], RunFile] = {}
    fan_in = max(2, fan_in)
    for g in range(level.groups):
        members = range(g * fan_in, min((g + 1) * fan_in, prev.groups))
        for j, (lo, hi) in enumerate(level.ranges):
            parent = prev.range_of(lo)
            inputs = [f for m in members if (f := prev.files[m][parent]) is not None and f.rows]
            if not inputs:
                continue
            if len(inputs) == 1 and (inputs[0].lo, inputs[0].hi) == (lo, hi):
                kept[g, j] = inputs[0]
                continue
            tasks.append(MergeTask(number, g, j, lo, hi, tuple(inputs)))
    return tasks, kept


def merged_grid(
    level: Level, tasks: Sequence[MergeTask], outputs: dict[str, RunFile | None], kept: dict[tuple[int, int], RunFile]
) -> Grid:
    """The runs a level made: each task's output (``outputs``, by task key: None where it wrote no rows)
    and the runs that passed through."""
    files: list[list[RunFile | None]] = [[None] * len(level.ranges) for _ in range(level.groups)]
    for (g, j), f in kept.items():
        files[g][j] = f
    for t in tasks:
        files[t.group][t.index] = outputs.get(t.key)
    return Grid(level.ranges, tuple(tuple(row) for row in files))


@dataclass(frozen=True)
class ReadTask:
    """One reader of a shuffle: key range [lo, hi) (its ``index`` among the readers), from ``inputs``."""

    index: int
    lo: int
    hi: int
    inputs: tuple[RunFile, ...] = field(repr=False)

    @property
    def rows(self) -> int:
        """About the rows it reads (its inputs' rows, each counted by the share of its keys it reads)."""
        return sum(f.rows * (min(self.hi, f.hi) - max(self.lo, f.lo)) // max(1, f.hi - f.lo) for f in self.inputs)


def read_tasks(grid: Grid, reader_rows: int, reader_bytes: int = 0) -> list[ReadTask]:
    """Readers of ``grid`` (the last level), each range of it cut into ranges of about ``reader_rows`` rows
    and at most about ``reader_bytes`` bytes of runs (0: rows only; at least one key each; none over a
    range without rows). Nested in the grid's ranges, so a reader reads one range of each group's run."""
    out: list[ReadTask] = []
    for j, (lo, hi) in enumerate(grid.ranges):
        inputs = tuple(f for row in grid.files if (f := row[j]) is not None and f.rows)
        rows = sum(f.rows for f in inputs)
        if not rows:
            continue
        pieces = -(-rows // max(1, reader_rows))
        if reader_bytes > 0:
            pieces = max(pieces, -(-sum(f.bytes for f in inputs) // reader_bytes))
        for a, b in cut(lo, hi, pieces):
            out.append(ReadTask(len(out), a, b, inputs))
    return out
