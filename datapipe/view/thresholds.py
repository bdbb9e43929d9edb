"""The thresholds a run decided by, per signal column, as its run.json recorded them: drawn on the
histograms and shown beside a document's values.

- ``length``: ``n_chars`` against ``min_chars`` / ``max_chars``;
- ``langid``: ``lang_score`` against ``min_score``;
- ``quality``: every rule of every rule set the run recorded (the run's own thresholds, not today's
  rule files: ``stages.quality.explain.recorded_rule_set``);
- ``classify``: each keep rule's ``min`` / ``max`` on its score column.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datapipe.audit.explain import recorded_run
from datapipe.stages.quality.explain import recorded_rule_set


@dataclass(frozen=True)
class Threshold:
    column: str
    value: float
    op: str  # "min": documents below it are dropped; "max": above it
    rule: str  # what sets it, as a user finds it in the pipeline or rule file

    @property
    def label(self) -> str:
        return f"{self.rule} {'>=' if self.op == 'min' else '<='} {self.value:g}"


def _stage_options(run: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for entry in (run.get("config") or {}).get("stages") or []:
        if isinstance(entry, dict) and len(entry) == 1:
            name, options = next(iter(entry.items()))
            out.append((str(name), options if isinstance(options, dict) else {}))
    return out


def thresholds(run_dir: Path, run: dict[str, Any]) -> dict[str, list[Threshold]]:
    """Column -> the thresholds on it, in the order of the pipeline's stages."""
    from datapipe.stages.quality.rules import FILTERS

    out: dict[str, list[Threshold]] = {}

    def add(column: str, value: Any, op: str, rule: str) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.setdefault(column, []).append(Threshold(column, float(value), op, rule))

    for name, options in _stage_options(run):
        if name == "length":
            add("n_chars", options.get("min_chars"), "min", "length.min_chars")
            add("n_chars", options.get("max_chars"), "max", "length.max_chars")
        elif name == "langid":
            add("lang_score", options.get("min_score"), "min", "langid.min_score")
        elif name == "classify":
            for rule in options.get("keep") or []:
                if isinstance(rule, dict) and rule.get("score"):
                    add(str(rule["score"]), rule.get("min"), "min", f"classify keep {rule['score']}.min")
                    add(str(rule["score"]), rule.get("max"), "max", f"classify keep {rule['score']}.max")
    keys = [e.get("key") for e in run.get("resources") or [] if e.get("role") == "rules" and e.get("key")]
    recorded = recorded_run(run_dir)
    for key in dict.fromkeys(keys):
        rules, _ = recorded_rule_set(recorded, key)
        if rules is None:
            continue
        for fname, params in rules.filters.items():
            for rule in FILTERS[fname].rules:
                if rule.op in ("min", "max"):
                    add(rule.column, params.get(rule.key), rule.op, f"{key} {fname}:{rule.name}")
    return out


def stage_decision(run: dict[str, Any], position: int | None, stage: str | None) -> dict[str, Any]:
    """The options the run recorded for the stage at ``position`` (1-based, as in the funnel), or the
    first stage of that name: what a reader needs beside a document's detail to see its threshold."""
    stages = _stage_options(run)
    if position is not None and 1 <= position <= len(stages) and stages[position - 1][0] == stage:
        return stages[position - 1][1]
    return next((o for n, o in stages if n == stage), {})
