"""The quality stage's part of ``datapipe explain``: each rule of a document's rule set against its
recorded signal, with the thresholds the run recorded in its run.json (not today's rule file, which
may have been edited since)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from datapipe.stages.explain_section import ExplainSection, RecordedRun
from datapipe.stages.quality.rules import BUILTIN_DIR, FILTERS, Rule, RuleSet, RuleSetError, describe, rule_file


@dataclass(frozen=True)
class RuleCheck:
    """One rule of a quality rule set against a document's recorded signal."""

    filter: str
    rule: str  # the reason it gives is "<filter>:<rule>"
    column: str
    op: str  # "min", "max" or "true" (drop where the signal is true)
    threshold: Any
    value: Any
    failed: bool

    def line(self) -> str:
        bound = "" if self.op == "true" else f"  ({self.op} {self.threshold})"
        rule = Rule(self.rule, self.column, self.op)
        shown = describe(rule, self.value, self.threshold).split(" ")[0] if self.op != "true" else f"{self.column}={self.value}"
        return f"  {'FAIL' if self.failed else 'ok  '} {self.filter}:{self.rule:<22} {shown}{bound}"


def rule_checks(row: dict[str, Any], run: RecordedRun) -> tuple[list[RuleCheck], str | None]:
    """Each rule of the document's quality rule set with value, threshold and whether it failed, in the
    order they are checked, and a note (the rule file changed since, or no rule set to grade against)."""
    name = row.get("quality_rules")
    if not name:
        return [], None
    rules, note = recorded_rule_set(run, name)
    if rules is None:
        return [], note
    out = []
    for fname, params in rules.filters.items():
        for rule in FILTERS[fname].rules:
            threshold, value = params.get(rule.key), row.get(rule.column)
            if threshold is None or value is None:
                continue
            failed = bool(rule.fails(np.array([value], dtype=float), threshold)[0])
            out.append(RuleCheck(fname, rule.name, rule.column, rule.op, threshold, value, failed))
    return out, note


def explain(row: dict[str, Any], run: RecordedRun) -> list[ExplainSection]:
    """One line per rule of the document's rule set: value, threshold, pass or FAIL; a changed rule file
    is pointed out in one line before the rules."""
    checks, note = rule_checks(row, run)
    lines = ([note] if note else []) + [c.line() for c in checks]
    if not lines:
        return []
    return [ExplainSection(f"quality rules ({row['quality_rules']}), in the order they are checked", lines)]


def recorded_rule_set(run: RecordedRun, name: str) -> tuple[RuleSet | None, str | None]:
    """(the rule set ``name`` as the run recorded it in run.json, or None; a note line or None)."""
    entry = next((e for e in run.run.get("resources") or [] if e.get("role") == "rules" and e.get("key") == name), None)
    if entry is not None and entry.get("content") is not None:
        try:
            rules = RuleSet.from_text(entry["content"], f"{entry['path']} (as recorded in run.json)", name)
        except RuleSetError as exc:
            return None, f"  (rule set {name} as recorded cannot be read: {exc})"
        if run.changed(entry):
            return rules, (
                f"  ({entry['path']} has changed since this run: these are the thresholds the run used, from run.json)"
            )
        return rules, None
    # No record (a run.json from before rule files were recorded): today's file is all there is.
    path = Path(entry["file"]) if entry else _rule_file_today(run, name)
    try:
        rules = RuleSet.load(path, name)
    except RuleSetError:
        return None, f"  (rule set {name} not found here; signals above are what it saw)"
    return rules, f"  (run.json does not record rule set {name}: graded against today's {path})"


def _rule_file_today(run: RecordedRun, name: str) -> Path:
    """The file the run's config names for rule-set key ``name`` (a user's own), else the built-in one."""
    for options in run.stage_options("quality"):
        rules = options.get("rules")
        if isinstance(rules, dict) and name in rules:
            return rule_file(str(rules[name]), Path(run.run.get("pipeline_file") or "pipeline.yaml").parent)
    return BUILTIN_DIR / f"{name}.yaml"
