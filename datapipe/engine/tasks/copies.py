"""The copies index: the documents a dedup stage dropped as copies, listed by their survivor.

A deciding step names each copy's survivor twice (``drop_rows``): by id in ``dup_of``, which goes to
rejected/ with the copy, and by row key in ``DUP_OF_KEY``. The engine hands each copy's row to two
map tasks: the copy's own, which rejects it, and the survivor's (the shard of its row key), which
writes the copies of its documents to one file, ``copies/<shard>.<n>-<stage>.parquet`` (``dup_of``,
``id``, ``reason``, ``detail``, sorted by ``dup_of``), and records the file's ``dup_of`` range in its
marker; the driver turns those records into the table ``copies_files`` of stats.duckdb. A survivor
and its copies may be anywhere in the run, but `datapipe explain SURVIVOR` reads only the copies
files whose range holds the id: the files of the survivor's own task, as for its row, whatever the
size of the run (audit/documents.py). No step gathers the copies: the partition or combine task that
decides a copy sends its row on, sorted by the survivor's shard, as it does the decisions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datapipe.engine.tasks.sinks import ParquetSink
from datapipe.schema import COPIES_SCHEMA
from datapipe.stages.global_stage import DUP_OF_KEY
from datapipe.stages.row_keys import shard_of

COLUMNS = tuple(COPIES_SCHEMA.names)


def split_copies(decisions: pa.Table | None, stage: str) -> tuple[pa.Table | None, pa.Table | None]:
    """(the decisions as the copies' map tasks apply them, without ``DUP_OF_KEY``; the copies among
    them as rows for their survivors' map tasks: ``shard``, the survivor's, and ``COLUMNS``, or None)."""
    if decisions is None:
        return None, None
    names = decisions.column_names
    if DUP_OF_KEY not in names:
        if "dup_of" in names:  # explain would miss these copies: the index must hold every one
            raise TypeError(
                f"stage {stage!r}: its decisions name survivors (dup_of) without their row keys "
                f"({DUP_OF_KEY}): pass dup_of_keys to drop_rows"
            )
        return decisions, None
    named = decisions.filter(pc.is_valid(decisions["dup_of"]))
    keys = named[DUP_OF_KEY].to_numpy()
    copies = pa.table(
        {
            "shard": pa.array(shard_of(keys).astype(np.int32), pa.int32()),
            **{c: named[c].cast(pa.string()) for c in COLUMNS},
        }
    )
    return decisions.drop_columns([DUP_OF_KEY]), copies


class CopiesSink:
    """A map task's copies index for the global stage it applies: the copies of its own documents."""

    def __init__(self, path: Path, stage: str) -> None:
        self.stage = stage
        self.sink = ParquetSink(path)
        self.range: tuple[str, str] | None = None

    def write(self, copies: pa.Table | None) -> None:
        """All of the task's copy rows at once (as loaded: a few per survivor), sorted for the reader."""
        if copies is None or copies.num_rows == 0:
            return
        table = copies.select(list(COLUMNS)).cast(COPIES_SCHEMA).sort_by([("dup_of", "ascending"), ("id", "ascending")])
        self.sink.write(table)
        self.range = (table["dup_of"][0].as_py(), table["dup_of"][-1].as_py())

    def audit_entry(self, root: Path) -> dict[str, Any] | None:
        """For the marker's ``copies_files`` (None: no copies): path, stage, rows, the ``dup_of`` range."""
        if self.range is None:
            return None
        return {
            "path": self.sink.path.relative_to(root).as_posix(),
            "stage": self.stage,
            "rows": self.sink.rows,
            "min_dup_of": self.range[0],
            "max_dup_of": self.range[1],
        }

    def close(self) -> None:
        self.sink.close()

    def abort(self) -> None:
        self.sink.abort()
