"""The thresholds a run decided by, per signal column, as its run.json recorded them: drawn on the
histograms and shown beside a document's values. Each stage says its own (``Stage.thresholds``);
a stage type this datapipe does not know (a plugin not installed here) draws none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datapipe.audit.explain import recorded_run
from datapipe.stages import STAGES
from datapipe.stages.explain_section import Threshold

__all__ = ["Threshold", "stage_decision", "thresholds"]


def _stage_options(run: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for entry in (run.get("config") or {}).get("stages") or []:
        if isinstance(entry, str):  # a stage named without options
            out.append((entry, {}))
        elif isinstance(entry, dict) and len(entry) == 1:
            name, options = next(iter(entry.items()))
            out.append((str(name), options if isinstance(options, dict) else {}))
    return out


def thresholds(run_dir: Path, run: dict[str, Any]) -> dict[str, list[Threshold]]:
    """Column -> the thresholds on it, in the order of the pipeline's stages."""
    out: dict[str, list[Threshold]] = {}
    recorded = recorded_run(run_dir)
    for name, options in _stage_options(run):
        if name not in STAGES:
            continue
        for t in STAGES[name].thresholds(options, recorded):
            out.setdefault(t.column, []).append(t)
    return out


def stage_decision(run: dict[str, Any], position: int | None, stage: str | None) -> dict[str, Any]:
    """The options the run recorded for the stage at ``position`` (1-based, as in the funnel), or the
    first stage of that name: what a reader needs beside a document's detail to see its threshold."""
    stages = _stage_options(run)
    if position is not None and 1 <= position <= len(stages) and stages[position - 1][0] == stage:
        return stages[position - 1][1]
    return next((o for n, o in stages if n == stage), {})
