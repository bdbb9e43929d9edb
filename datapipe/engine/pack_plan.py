"""Packing split into tasks over (source, split, range of output shard files).

``concat`` packing lays a split's documents end to end and cuts the stream every ``row_len``
tokens, ``rows_per_shard`` rows a file, so output file f holds stream tokens
[f * R * L, (f + 1) * R * L). Given each input shard's token count for the split (recorded by
its final map marker), a task for files [f0, f1) knows which input shards it needs and where
it starts, and writes exactly the files the single-task packer would.

``bestfit`` packing stays one task per (source, split): a window of ``bestfit_window``
documents is packed independently of the others, but the number of rows each window yields
depends on its bin packing, so where file f starts in the window sequence is only known after
packing every earlier window (a pre-pass over document lengths could place it; not done).
A source with mixture repeats is one task per split too: its stream is rounds over its input
shards, as many as its largest count, known only from every document's count (``engine/tasks/pack.py``).

The plan depends on the map phase's outputs, so it is computed from the markers once the final
map phase is complete; it is the same every time for the same markers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from datapipe.engine.plan import RunSpec
from datapipe.engine.work_files import map_phase
from datapipe.run_folder.layout import RunFolder

SPLITS = ("train", "val")
# A concat range task packs about this many tokens (whole files): enough to amortize a task (each
# is a dispatch for the driver, the run's serial step: fewer tasks as it grows), small enough that a
# source of a few billion tokens spreads over a cluster. Memory does not depend on it beyond its
# first output file: a task holds one record batch of an input shard and the output file being
# filled (rows_per_shard x row_len tokens; a range smaller than one file holds less, so a task's
# peak grows with its range up to one file), the same shard bytes either way
# (bench/scaling/pack_task_memory.py).
TOKENS_PER_TASK = 1 << 30


@dataclass(frozen=True)
class PackRange:
    source: str
    split: str
    index: int
    first_file: int
    n_files: int | None  # None: the whole split in one task (bestfit)
    last: bool  # holds the split's last file: writes the padded last row
    stream_start: int  # stream position of the first token of shard_tokens[0]
    shard_tokens: tuple[tuple[str, int], ...]  # (shard key, tokens of this split) of the input shards it reads

    @property
    def key(self) -> str:
        return f"{self.source}/{self.split}-{self.index:05d}"


def split_token_counts(folder: RunFolder, spec: RunSpec, source: str) -> dict[str, list[tuple[str, int]]] | None:
    """Per split, (shard key, tokens) of the source's shards in run order; None until the final map is done."""
    final = spec.segments[-1].index
    out: dict[str, list[tuple[str, int]]] = {s: [] for s in SPLITS}
    markers = folder.markers.read_all(map_phase(final))  # one listing, cached: called once per source
    for shard in spec.shards_of(source):
        marker = markers.get(shard.key)
        if marker is None:
            return None
        counts = marker.get("split_tokens")
        if counts is None:  # a marker from before per-split counts: count from the token file
            counts = _count_from_file(folder, shard.key)
        for split in SPLITS:
            out[split].append((shard.key, int(counts.get(split, 0))))
    return out


def _count_from_file(folder: RunFolder, key: str) -> dict[str, int]:
    path = folder.tokens_file(key)
    if not path.exists():
        return {}
    with pa.memory_map(str(path)) as mm:
        table = pa.ipc.open_file(mm).read_all()
    lengths = pc.list_value_length(table["tokens"])
    return {s: int(pc.sum(pc.if_else(pc.equal(table["split"], s), lengths, 0)).as_py() or 0) for s in SPLITS}


def pack_ranges(folder: RunFolder, spec: RunSpec, files_per_task: int | None = None) -> list[PackRange] | None:
    """Every packing task of the run in manifest order; None while the final map phase is incomplete."""
    assert spec.tokenize is not None
    cfg = spec.tokenize
    row_len = cfg.seq_len + (1 if cfg.labels else 0)
    span = cfg.rows_per_shard * row_len  # tokens per output file
    per_task = files_per_task or max(1, TOKENS_PER_TASK // span)
    ranges: list[PackRange] = []
    for source in spec.sources:
        counts = split_token_counts(folder, spec, source)
        if counts is None:
            return None
        for split in SPLITS:
            shards = counts[split]
            total = sum(n for _, n in shards)
            if total == 0:
                continue
            if cfg.packing != "concat" or source in spec.repeats:  # repeats: rounds over the shards, one task
                ranges.append(PackRange(source, split, 0, 0, None, True, 0, tuple(shards)))
                continue
            n_files = math.ceil(math.ceil(total / row_len) / cfg.rows_per_shard)
            for index, first in enumerate(range(0, n_files, per_task)):
                n = min(per_task, n_files - first)
                last = first + n == n_files
                lo, hi = first * span, (first + n) * span
                at, picked, start = 0, [], None
                for key, t in shards:
                    if t and at + t > lo and (last or at < hi):
                        start = at if start is None else start
                        picked.append((key, t))
                    at += t
                ranges.append(PackRange(source, split, index, first, n, last, start or 0, tuple(picked)))
    return ranges
