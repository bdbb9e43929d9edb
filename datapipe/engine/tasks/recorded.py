"""A map task's reused signals: one shard's rows of an earlier run, looked up by document id.

The earlier run (``run --from``, engine/redecide.py) was split into the same map tasks, so this
shard's documents are in its ``docs/<shard>.parquet`` and ``rejected/<shard>.<n>-<stage>.parquet``
files; a file holds a stage's values where it has the stage's columns (a document dropped before
the stage, or on which it raised, is in a file without them). Documents with no recorded values
are computed, in the same batch, and the batch keeps its row order.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datapipe.engine.plan import Recorded
from datapipe.engine.work_files import map_phase
from datapipe.run_folder.checked import Recorded as RecordedFile
from datapipe.run_folder.checked import damage
from datapipe.run_folder.layout import RunFolder
from datapipe.stages.columns import set_column


class ShardSignals:
    """The recorded signal columns of one shard's documents, per reused stage position (read once).

    Each file of the earlier run is checked before it is read against the size and sha256 that the
    earlier run's task recorded in its marker (this shard's markers of each map phase, a few small
    reads): a damaged one fails the task with an error naming that run folder and the file
    (``redecide.damaged_source``), never a signal read from other bytes."""

    def __init__(self, recorded: Recorded, shard_key: str) -> None:
        self.recorded = recorded
        folder = RunFolder(recorded.root)
        self._folder = folder
        self._record = _shard_record(folder, shard_key)
        self.files = _shard_files(folder, shard_key, self._check)
        self._tables: dict[int, pa.Table] = {}
        self._tokens_file = folder.tokens_file(shard_key) if recorded.tokens else None

    def _check(self, path: Path) -> None:
        if not self._record:
            return  # a run of a datapipe before markers named their files: nothing to check against
        rel = path.relative_to(self._folder.root).as_posix()
        entry = self._record.get(rel)
        what = "not named by its task's marker" if entry is None else damage(path, entry)
        if what is not None:
            from datapipe.engine.redecide import damaged_source

            raise damaged_source(self._folder, self._folder.load_run_json() or {}, rel, what)

    def table(self, position: int) -> pa.Table | None:
        """``id`` and the stage's columns of every document that has them; None: the stage is not reused."""
        columns = self.recorded.of(position)
        if columns is None:
            return None
        if position not in self._tables:
            parts = [pq.read_table(path, columns=["id", *columns]) for path, names in self.files if set(columns) <= names]
            empty = pa.table({"id": pa.array([], pa.string())})
            self._tables[position] = pa.concat_tables(parts) if parts else empty
        return self._tables[position]

    def tokens(self) -> pa.Table | None:
        """``id`` and ``tokens`` of the shard's documents the earlier run kept (memory-mapped); None:
        token lists are not reused (or the earlier run's intermediate files are gone)."""
        if self._tokens_file is None or not self._tokens_file.is_file():
            return None
        self._check(self._tokens_file)
        # Not closed here: the table's buffers are the mapped file's pages, freed with the table.
        return pa.ipc.open_file(pa.memory_map(str(self._tokens_file))).read_all().select(["id", "tokens"])


def _shard_record(folder: RunFolder, shard_key: str) -> dict[str, RecordedFile]:
    """What the earlier run's map tasks of this shard recorded of the files they wrote (path -> entry)."""
    out: dict[str, RecordedFile] = {}
    segment = 0
    while (marker := folder.markers.read(map_phase(segment), shard_key, full=True)) is not None:  # with hashes
        for entry in marker.get("files") or ():
            out[entry["path"]] = RecordedFile(map_phase(segment), shard_key, int(entry["bytes"]), entry.get("sha256"))
        segment += 1
    return out


def _shard_files(folder: RunFolder, shard_key: str, check: Callable[[Path], None]) -> list[tuple[Path, set[str]]]:
    """The shard's kept and rejected files with their column names, each ``check``ed before it is read."""
    docs = folder.docs_file(shard_key)
    rejected = folder.rejected_dir / shard_key
    # "<key>.<position>-<stage>[-<n>].parquet": the digits after the key tell it from a longer key
    # ("00003.part0001", "00003..00007") that starts the same way.
    pattern = re.compile(re.escape(rejected.name) + r"\.\d+-.+\.parquet")
    paths = [docs] if docs.is_file() else []
    if rejected.parent.is_dir():
        paths += sorted(p for p in rejected.parent.iterdir() if pattern.fullmatch(p.name))
    out = []
    for p in paths:
        check(p)
        out.append((p, set(pq.read_schema(p).names)))
    return out


def _match(batch: pa.Table, recorded: pa.Table) -> tuple[pa.Array, pa.Array, int]:
    """Per document of ``batch``: its row in ``recorded`` (null: none), whether it has one, and how many do."""
    idx = pc.index_in(batch["id"], value_set=recorded["id"])
    hit = pc.is_valid(idx)
    return idx, hit, pc.sum(pc.cast(hit, pa.int64())).as_py() or 0


def _batch_order(hit: pa.Array) -> pa.Array:
    """The indices that put rows concatenated as (those with a hit, then the others) back in the batch's order."""
    mask = hit.to_numpy(zero_copy_only=False)
    return pa.array(np.argsort(np.concatenate([np.flatnonzero(mask), np.flatnonzero(~mask)])))


def tokens_with_recorded(batch: pa.Table, recorded: pa.Table, encode: Callable[[pa.Table], pa.Array]) -> pa.Array:
    """Token lists per document of ``batch``: the recorded one where the document has one, ``encode``
    of the others, in the batch's order."""
    idx, hit, hits = _match(batch, recorded)
    if hits == 0:
        return encode(batch)
    found = recorded["tokens"].take(pc.drop_null(idx)).combine_chunks()
    if hits == batch.num_rows:
        return found
    computed = encode(batch.filter(pc.invert(hit)))
    return pa.concat_arrays([found, computed.cast(found.type)]).take(_batch_order(hit))


def with_recorded(
    batch: pa.Table, recorded: pa.Table, columns: tuple[str, ...], compute: Callable[[pa.Table], pa.Table]
) -> tuple[pa.Table, int]:
    """``batch`` with the stage's ``columns`` as ``compute`` would add them: recorded values where the
    document has them, ``compute`` over the rest (its output decides the columns' order and types);
    and how many documents had recorded values."""
    idx, hit, hits = _match(batch, recorded)
    if hits == 0:
        return compute(batch), 0
    if hits == batch.num_rows:
        picked = recorded.take(idx)
        for name in columns:
            batch = set_column(batch, name, picked[name])
        return batch, hits
    found = batch.filter(hit)
    picked = recorded.take(pc.drop_null(idx))
    for name in columns:
        found = set_column(found, name, picked[name])
    computed = compute(batch.filter(pc.invert(hit)))
    found = found.select(computed.column_names).cast(computed.schema)
    return pa.concat_tables([found, computed]).take(_batch_order(hit)), hits
