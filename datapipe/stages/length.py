"""Length filter: the cheapest signal, in characters (so Chinese and English compare fairly)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from datapipe.stages.base import CheckContext, Decision, Stage, StageOptions
from datapipe.stages.columns import set_column
from datapipe.stages.explain_section import RecordedRun, Threshold, threshold_if_set


class LengthOptions(StageOptions):
    min_chars: int = Field(1, ge=0, description="Drop documents with fewer characters (after stripping).")
    max_chars: int = Field(1_000_000, ge=1, description="Drop documents with more characters.")

    @model_validator(mode="after")
    def _ordered(self) -> LengthOptions:
        if self.max_chars < self.min_chars:
            raise ValueError(f"max_chars ({self.max_chars}) must be >= min_chars ({self.min_chars})")
        return self


class LengthFilter(Stage):
    name = "length"
    summary = "document length in characters"
    signals = "`n_chars_stripped`"
    reasons = ("too_short", "too_long")
    Options = LengthOptions
    decision_options = frozenset({"min_chars", "max_chars"})

    @classmethod
    def keeps_text(cls, options: LengthOptions) -> bool:
        return True

    @classmethod
    def output_columns(cls, options: LengthOptions, context: CheckContext) -> set[str] | None:
        return {"n_chars_stripped"}

    @classmethod
    def thresholds(cls, options: dict[str, Any], run: RecordedRun) -> list[Threshold]:
        # Decided on n_chars_stripped; drawn on n_chars too, the length every run has an aggregate of
        # (the two differ by leading and trailing whitespace only).
        out = []
        for column in ("n_chars_stripped", "n_chars"):
            out += threshold_if_set(column, options.get("min_chars"), "min", "length.min_chars")
            out += threshold_if_set(column, options.get("max_chars"), "max", "length.max_chars")
        return out

    def compute(self, batch: pa.Table) -> pa.Table:
        # n_chars counts the raw text (the engine adds it at read time); length uses stripped text.
        stripped = pc.utf8_length(pc.utf8_trim_whitespace(pc.fill_null(batch["text"], "")))
        return set_column(batch, "n_chars_stripped", pc.cast(stripped, pa.int64()))

    def decide(self, batch: pa.Table) -> Decision:
        n = batch["n_chars_stripped"]
        short = pc.less(n, self.options.min_chars)
        long = pc.greater(n, self.options.max_chars)
        reason = pc.if_else(short, "too_short", pc.if_else(long, "too_long", pa.scalar(None, pa.string())))
        detail = pc.if_else(
            pc.or_(short, long), pc.binary_join_element_wise("chars=", pc.cast(n, pa.string()), ""), pa.scalar(None, pa.string())
        )
        return Decision(reason, detail)
