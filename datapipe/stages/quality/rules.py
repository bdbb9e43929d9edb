"""The contract every quality filter shares, and rule sets: YAML files of named thresholds.

A filter declares its signal columns (with types) and its rules; ``compute`` returns the
signals for a batch of ``Docs``. A rule compares one signal with one threshold from the rule
set; the first failing rule of a document names the drop reason ``<filter>:<rule>`` and the
detail ``<signal>=<value> <op> <threshold>``. A threshold left out of the YAML (or null)
switches its rule off, so a rule set can take a filter's signals without all of its rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import yaml

from datapipe.assets.filters_dir import filter_file
from datapipe.config.sections import read_yaml, yaml_error_text
from datapipe.errors import EXIT_USAGE, DatapipeError
from datapipe.stages.quality.text import Docs

BUILTIN_DIR = filter_file("quality")
PRESETS_DIR = BUILTIN_DIR / "presets"  # named rule sets a pipeline file picks by name, never applied by default


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def rule_file(value: str, base: Path) -> Path:
    """The file a ``rules`` mapping value names: a preset's name (``fineweb_datatrove``), or a
    path, relative to ``base`` (the pipeline file's folder) unless absolute."""
    if "/" not in value and "\\" not in value and not value.endswith((".yaml", ".yml")):
        preset = PRESETS_DIR / f"{value}.yaml"
        if preset.is_file():
            return preset
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p


@dataclass(frozen=True)
class Rule:
    name: str  # the reason is "<filter>:<name>"
    column: str  # the signal it reads
    op: str  # "min": drop below; "max": drop above; "true": drop where the signal is true
    param: str | None = None  # the threshold key in the rule set; default: the rule name

    @property
    def key(self) -> str:
        return self.param or self.name

    def fails(self, values: np.ndarray, threshold: Any) -> np.ndarray:
        if self.op == "true":
            return values.astype(bool) if threshold else np.zeros(len(values), bool)
        with np.errstate(invalid="ignore"):
            bad = values < threshold if self.op == "min" else values > threshold
        return np.asarray(bad, dtype=bool) & ~np.isnan(values.astype(np.float64))


@dataclass(frozen=True)
class Filter:
    name: str
    signals: dict[str, pa.DataType]
    rules: tuple[Rule, ...]
    compute: Callable[[Docs, dict[str, Any], pa.Table], dict[str, np.ndarray]]
    settings: frozenset[str] = field(default_factory=frozenset)  # non-threshold options, e.g. word lists
    flags: frozenset[str] = field(default_factory=frozenset)  # the settings among them that are true/false


FILTERS: dict[str, Filter] = {}


def register(f: Filter) -> Filter:
    FILTERS[f.name] = f
    return f


class RuleSetError(DatapipeError, ValueError):
    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class RuleSet:
    name: str  # builtin name ("en_web") or the file path
    filters: dict[str, dict[str, Any]]  # filter name -> its thresholds/settings, in YAML order

    @staticmethod
    def load(path: Path, name: str | None = None) -> RuleSet:
        try:
            data = read_yaml(path) or {}
        except yaml.YAMLError as exc:
            raise RuleSetError(f"rule set {yaml_error_text(exc)}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise RuleSetError(f"cannot read rule set {path}: {exc}") from None
        return RuleSet.from_data(data, str(path), name)

    @staticmethod
    def from_text(text: str, where: str, name: str | None = None) -> RuleSet:
        """A rule set from recorded YAML text (run.json keeps the rules a run used); ``where`` names it in errors."""
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise RuleSetError(f"rule set {where}: {yaml_error_text(exc)}") from None
        return RuleSet.from_data(data, where, name)

    @staticmethod
    def from_data(data: Any, where: str, name: str | None = None) -> RuleSet:
        filters = data.get("filters") if isinstance(data, dict) else None
        if not isinstance(filters, dict) or not filters:
            raise RuleSetError(f"{where}: needs a non-empty mapping `filters: {{filter: {{threshold: value}}}}`")
        for fname, params in filters.items():
            if fname not in FILTERS:
                raise RuleSetError(f"{where}: unknown filter {fname!r}; known: {', '.join(sorted(FILTERS))}")
            allowed = {r.key for r in FILTERS[fname].rules} | FILTERS[fname].settings
            unknown = set(params or {}) - allowed
            if unknown:
                raise RuleSetError(
                    f"{where}: filters.{fname}: unknown key(s) {sorted(unknown)}; allowed: {', '.join(sorted(allowed))}"
                )
        return RuleSet(name or where, {k: dict(v or {}) for k, v in filters.items()})

    def compute(self, docs: Docs, batch: pa.Table) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for fname, params in self.filters.items():
            out.update(FILTERS[fname].compute(docs, params, batch))
        return out

    def evaluate(self, signals: dict[str, np.ndarray], n: int) -> tuple[list[str | None], list[str | None]]:
        """First failing rule per row: (reasons, details); None keeps the row."""
        reason: list[str | None] = [None] * n
        detail: list[str | None] = [None] * n
        open_rows = np.ones(n, dtype=bool)
        for fname, params in self.filters.items():
            for rule in FILTERS[fname].rules:
                threshold = params.get(rule.key)
                if threshold is None or not open_rows.any():
                    continue
                values = signals[rule.column]
                bad = rule.fails(values, threshold) & open_rows
                for i in np.flatnonzero(bad):
                    reason[i] = f"{fname}:{rule.name}"
                    detail[i] = describe(rule, values[i], threshold)
                open_rows &= ~bad
        return reason, detail

    def columns(self) -> dict[str, pa.DataType]:
        cols: dict[str, pa.DataType] = {}
        for fname in self.filters:
            cols.update(FILTERS[fname].signals)
        return cols


def describe(rule: Rule, value: Any, threshold: Any) -> str:
    if rule.op == "true":
        return f"{rule.column}=true"
    sign = "<" if rule.op == "min" else ">"
    v = f"{float(value):.4g}" if isinstance(value, (float, np.floating)) else str(value)
    return f"{rule.column}={v} {sign} {threshold}"
