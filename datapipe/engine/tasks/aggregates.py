"""A task of the aggregate merge tree (engine/aggregate_tree.py): a few aggregate files merged into one."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from datapipe.audit.aggregates import merge_files, run_aggregates
from datapipe.engine.aggregate_tree import task_key
from datapipe.engine.errors import PipelineError
from datapipe.engine.plan import RunSpec
from datapipe.engine.work_files import WorkFiles
from datapipe.run_folder.layout import RunFolder
from datapipe.storage.atomic import atomic_path


def merge_aggregates(spec: RunSpec, level: int, first: int, end: int, inputs: tuple[str, ...]) -> dict[str, Any]:
    """Merge ``inputs`` (aggregate files of the level below, relative to the run folder) into this task's
    file, by each aggregate's declared keys and merge rules; returns the marker contents."""
    import pyarrow.fs as pafs

    started = time.perf_counter()
    folder = RunFolder(Path(spec.root))
    # The aggregates' columns and merge rules do not depend on the documents' columns (each map task
    # declares them from its own, and their files are merged as one): the run's stage types suffice.
    declared = run_aggregates(spec.stage_types, set())
    paths = [str(folder.fetched(folder.root / rel)) for rel in inputs]
    try:
        table = merge_files(paths, pafs.LocalFileSystem(), declared)
    except ValueError as exc:  # rows of an aggregate the run does not declare (a stage's plugin removed)
        raise PipelineError(f"merging aggregate files: {exc}") from None
    work = WorkFiles(folder)
    key = task_key(range(first, end))
    path = work.aggregates_merged(level, key, fetch=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return {
        "level": level,
        "inputs": len(inputs),
        "rows": table.num_rows,
        "aggregates": {"path": WorkFiles.aggregates_merged_rel(level, key), "rows": table.num_rows},
        "seconds": round(time.perf_counter() - started, 3),
    }
