"""What a stage adds to ``datapipe explain`` (and the viewer's document page) for one document.

A stage that can grade a document against its own rules returns :class:`ExplainSection` values from
``Stage.explain(row, run)``; ``audit/explain.py`` prints them after the signals, in the order of the
run's stages. The run is handed in as a :class:`RecordedRun` (run.json, SQL over the run's documents,
whether a recorded resource file changed since), so a stage reads what it needs without importing
``datapipe.audit``, which sits above it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RecordedRun:
    """What a stage's explanation may read of a finished run."""

    run: dict[str, Any]  # run.json ({} when it cannot be read)
    query: Callable[[str, dict[str, Any]], list[tuple[Any, ...]]]  # a SELECT over the run's tables, its rows
    changed: Callable[[dict[str, Any]], bool]  # whether a run.json resource entry's file differs from it today

    def stage_options(self, name: str) -> list[dict[str, Any]]:
        """The options of each of the run's ``name`` stages, as the run recorded them, in pipeline order."""
        out: list[dict[str, Any]] = []
        for stage in (self.run.get("config") or {}).get("stages") or []:
            if stage == name:  # a stage named without options
                out.append({})
            elif isinstance(stage, dict) and name in stage:
                options = stage[name]
                out.append(options if isinstance(options, dict) else {})
        return out


@dataclass(frozen=True)
class ExplainSection:
    """A heading (``classify keep rules, in the order they are checked``) and its indented lines."""

    title: str
    lines: list[str]


@dataclass(frozen=True)
class Threshold:
    """A bound ``decide`` applies to a signal column, as the run recorded it: the viewer draws it on
    the column's histogram and beside a document's value."""

    column: str
    value: float
    op: str  # "min": documents below it are dropped; "max": above it
    rule: str  # what sets it, as a user finds it in the pipeline or rule file ("length.min_chars")

    @property
    def label(self) -> str:
        return f"{self.rule} {'>=' if self.op == 'min' else '<='} {self.value:g}"


def threshold_if_set(column: str, value: Any, op: str, rule: str) -> list[Threshold]:
    """``[Threshold]`` when ``value`` is a recorded number, ``[]`` when the option is unset or not one."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [Threshold(column, float(value), op, rule)]
    return []
