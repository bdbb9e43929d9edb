"""The ``shout`` stage: counts a configured word in each document and drops those that contain it."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datapipe.stages import Decision, Stage, StageOptions


class ShoutOptions(StageOptions):
    word: str = Field(min_length=1, description="Documents containing this word (any case) are dropped.")


class Shout(Stage):
    name = "shout"
    Options = ShoutOptions

    @classmethod
    def output_columns(cls, options: Any, context: Any) -> set[str] | None:
        return {"shout_count"}

    def compute(self, batch: pa.Table) -> pa.Table:
        count = pc.count_substring(pc.fill_null(batch["text"], ""), self.options.word, ignore_case=True)
        return batch.append_column("shout_count", pc.cast(count, pa.int64()))

    def decide(self, batch: pa.Table) -> Decision:
        n = batch["shout_count"]
        hit = pc.greater(n, 0)
        none = pa.scalar(None, pa.string())
        detail = pc.binary_join_element_wise(f"{self.options.word!r} x", pc.cast(n, pa.string()), "")
        return Decision(pc.if_else(hit, "shouted", none), pc.if_else(hit, detail, none))
