"""The work of one task, as plain functions: no Ray here, so each is testable on its own.

Each function writes its outputs atomically, then returns the marker contents
(counts, timings) that the runner records. Running one twice gives the same files.
The functions live by what they own; this module gathers them for tests and benches:

    map_task.py     map_shard, count_range_lines (the lines pre-pass)
    reduce_task.py  reduce_partition, reduce_stage, partition_decisions, partition_state
    pack_task.py    pack_range, pack_source
    sinks.py        ParquetSink, ShuffleSink, TokenSink
"""

from __future__ import annotations

from datapipe.engine.map_task import (
    MAX_BATCH_TEXT_BYTES,
    TOKENIZE_STAGE,
    MapCounts,
    _bounded,
    count_range_lines,
    map_shard,
)
from datapipe.engine.pack_task import pack_range, pack_source
from datapipe.engine.reduce_task import partition_decisions, partition_state, reduce_partition, reduce_stage
from datapipe.engine.run_folder import LINES_PHASE
from datapipe.engine.sinks import ParquetSink, ShuffleSink, TokenSink

__all__ = ["LINES_PHASE", "MAX_BATCH_TEXT_BYTES", "TOKENIZE_STAGE", "MapCounts", "ParquetSink", "ShuffleSink",
           "TokenSink", "_bounded", "count_range_lines", "map_shard", "pack_range", "pack_source",
           "partition_decisions", "partition_state", "reduce_partition", "reduce_stage"]
