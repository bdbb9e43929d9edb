"""The ``quality`` stage: per document, the rule set for its language and source kind.

``rules: auto`` picks ``filters/quality/<lang>_<kind>.yaml``, else ``<kind>.yaml``
(``en_web``, ``zh_web``, ``code``, ``paper``); a mapping ``{zh_web: my/zh.yaml, ...}`` replaces
or adds rule sets by key (paths relative to the pipeline file, or the name of a preset in
``filters/quality/presets/``, e.g. ``{en_web: fineweb_datatrove}``). Documents with no rule set pass.
Signals of every configured rule set are columns of every batch (null where another rule set
applied), so all shards share one schema; ``quality_rules`` names the rule set used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from datapipe.config.sections import SOURCE_KINDS
from datapipe.stages.base import (
    CheckContext,
    Decision,
    Problem,
    ResourceFile,
    Stage,
    StageContext,
    StageOptions,
    kinds_problems,
)
from datapipe.stages.columns import set_column
from datapipe.stages.explain_section import ExplainSection, RecordedRun, Threshold, threshold_if_set
from datapipe.stages.quality import blocklist, c4, code_rules, dt_filters, fineweb, gopher, paper, zh  # noqa: F401 (register)
from datapipe.stages.quality.explain import explain as explain_document
from datapipe.stages.quality.explain import recorded_rule_set
from datapipe.stages.quality.rules import BUILTIN_DIR, FILTERS, RuleSet, RuleSetError, preset_names, rule_file
from datapipe.stages.quality.text import Docs
from datapipe.text.langcodes import language_problems


class QualityOptions(StageOptions):
    rules: Literal["auto"] | dict[str, str] = Field(
        "auto",
        description="auto: built-in rule sets; or {<lang>_<kind> | <kind>: rule-set path or preset name "
        "(fineweb_datatrove: datatrove's FineWeb filters)}, added to them.",
    )
    builtin: bool = Field(True, description="With a rules mapping: also use the built-in rule sets.")
    kinds: list[str] = Field(["web", "code", "paper", "text"], description="Source kinds the stage applies to.")
    aliases: dict[str, str] = Field({"yue": "zh"}, description="Languages judged by another's rule sets.")


def rule_set_files(rules: Literal["auto"] | dict[str, str], builtin: bool, base: Path) -> dict[str, tuple[Path, str]]:
    """Rule-set key -> (its file, its name) for the rule sets the stage uses; a given key replaces a built-in one."""
    files: dict[str, tuple[Path, str]] = {}
    if rules == "auto" or builtin:
        files = {p.stem: (p, p.stem) for p in sorted(BUILTIN_DIR.glob("*.yaml"))}
    if isinstance(rules, dict):
        for key, path in rules.items():
            files[key] = (rule_file(str(path), base), str(path))
    return files


def load_rule_sets(rules: Literal["auto"] | dict[str, str], builtin: bool, base: Path) -> dict[str, RuleSet]:
    return {key: RuleSet.load(path, name) for key, (path, name) in rule_set_files(rules, builtin, base).items()}


class Quality(Stage):
    name = "quality"
    summary = (
        "heuristic quality rules per language and kind (Gopher, C4, FineWeb, Chinese, StarCoder, paper "
        "rules), word lists, domain blocklist"
    )
    signals = (
        "one typed column per signal of the rule set (`gopher_*`, `c4_*`, `fineweb_*`, `zh_*`, `zh_rep_*`, "
        "`code_*`, `paper_*`, `spam_words`, `url_blocked`, ...), `quality_rules`"
    )
    reasons = ("<filter>:<rule>",)
    Options = QualityOptions

    @classmethod
    def keeps_text(cls, options: QualityOptions) -> bool:
        return True  # thresholds live in the rule files: a changed one recomputes the stage

    @classmethod
    def explain(cls, row: dict[str, Any], run: RecordedRun) -> list[ExplainSection]:
        return explain_document(row, run)

    @classmethod
    def thresholds(cls, options: dict[str, Any], run: RecordedRun) -> list[Threshold]:
        # Every rule of every rule set the run recorded: the run's own thresholds, not today's files.
        out: list[Threshold] = []
        keys = [e.get("key") for e in run.run.get("resources") or [] if e.get("role") == "rules" and e.get("key")]
        for key in dict.fromkeys(keys):
            rules, _ = recorded_rule_set(run, key)
            for fname, params in rules.filters.items() if rules is not None else ():
                for rule in FILTERS[fname].rules:
                    if rule.op in ("min", "max"):
                        out += threshold_if_set(rule.column, params.get(rule.key), rule.op, f"{key} {fname}:{rule.name}")
        return out

    def __init__(self, options: QualityOptions, context: StageContext) -> None:
        super().__init__(options, context)
        self.sets = load_rule_sets(options.rules, options.builtin, Path(context.pipeline_dir))
        self.columns: dict[str, pa.DataType] = {}
        for rs in self.sets.values():
            self.columns.update(rs.columns())

    @classmethod
    def check(cls, options: Any, context: CheckContext) -> list[Problem]:
        o: QualityOptions = options
        problems = kinds_problems(o.kinds)
        for lang, to in o.aliases.items():
            problems += [(f"aliases.{lang}", m) for _, m in language_problems([lang])]
            problems += [(f"aliases.{lang}", m) for _, m in language_problems([to])]
        sets: dict[str, tuple[str, RuleSet]] = {}  # key -> (its key path, rule set)
        if o.rules == "auto" or o.builtin:
            try:
                sets = {k: ("rules", rs) for k, rs in load_rule_sets("auto", True, context.pipeline_dir).items()}
            except RuleSetError as exc:
                problems.append(("rules", f"built-in rule sets: {exc}"))
        has_langid = any(kind == "langid" for kind, _ in context.before)
        for key, path in o.rules.items() if isinstance(o.rules, dict) else []:
            where = f"rules.{key}"
            problems += [(where, m) for m in _key_problems(key, o.kinds, has_langid)]
            file = rule_file(str(path), context.pipeline_dir)
            if not file.is_file():
                presets = ", ".join(preset_names())
                problems.append((where, f"file not found: {file} (a preset name is one of: {presets})"))
                continue
            try:  # the loader the stage itself runs, one key at a time so each error names its key
                sets[key] = (where, load_rule_sets({key: path}, False, context.pipeline_dir)[key])
            except RuleSetError as exc:
                problems.append((where, str(exc)))
        if not sets and not problems:
            problems.append(("rules", "no rule sets: give a mapping of rule-set files, or builtin: true"))
        for where, rs in sets.values():
            problems += [(where, m) for m in _value_problems(rs)]
        return problems

    @classmethod
    def output_columns(cls, options: Any, context: CheckContext) -> set[str] | None:
        try:
            sets = load_rule_sets(options.rules, options.builtin, context.pipeline_dir)
        except RuleSetError:
            return None
        return {c for rs in sets.values() for c in rs.columns()} | {"quality_rules"}

    @classmethod
    def resource_files(cls, options: Any, pipeline_dir: Path) -> list[ResourceFile]:
        """Each rule set in use (by key) and the word and domain lists its blocklist filter reads."""
        out: list[ResourceFile] = []
        for key, (path, name) in rule_set_files(options.rules, options.builtin, pipeline_dir).items():
            out.append(ResourceFile(path, "rules", key))
            try:
                rs = RuleSet.load(path, name)
            except RuleSetError:
                continue  # validation reports it; the file itself is still recorded (as missing or unparsable)
            if "blocklist" in rs.filters:
                for setting, list_path in blocklist.list_paths(rs.filters["blocklist"]).items():
                    out.append(ResourceFile(list_path, "domain_list" if setting == "domain_list" else "word_list"))
        return out

    def prepare(self) -> None:
        if not self.sets:
            raise RuleSetError("quality: no rule sets configured")

    def applies_to(self, kind: str) -> bool:
        return kind in self.options.kinds

    def rows_by_rule_set(self, batch: pa.Table) -> dict[str, np.ndarray]:
        """Row indices per rule-set key (rows no rule set applies to are in none)."""
        kinds = batch["kind"].to_pylist()
        langs = batch["lang"].to_pylist() if "lang" in batch.column_names else [None] * len(kinds)
        keys: list[str | None] = []
        for kind, lang in zip(kinds, langs):
            lang = self.options.aliases.get(lang, lang)
            key = f"{lang}_{kind}" if f"{lang}_{kind}" in self.sets else kind if kind in self.sets else None
            keys.append(key)
        arr = np.array(keys, dtype=object)
        return {k: np.flatnonzero(arr == k) for k in sorted({k for k in keys if k is not None})}

    def compute(self, batch: pa.Table) -> pa.Table:
        n = batch.num_rows
        values = {c: np.full(n, None, dtype=object) for c in self.columns}
        used = np.full(n, None, dtype=object)
        text = batch["text"].combine_chunks()
        for key, idx in self.rows_by_rule_set(batch).items():
            sub = batch.take(pa.array(idx))
            signals = self.sets[key].compute(Docs(text.take(pa.array(idx))), sub)
            for col, v in signals.items():
                values[col][idx] = v.tolist()
            used[idx] = key
        for col, typ in self.columns.items():
            batch = set_column(batch, col, pa.array(values[col], typ))
        return set_column(batch, "quality_rules", pa.array(used, pa.string()))

    def decide(self, batch: pa.Table) -> Decision:
        n = batch.num_rows
        reason: list[str | None] = [None] * n
        detail: list[str | None] = [None] * n
        keys = np.array(batch["quality_rules"].to_pylist(), dtype=object)
        for key in sorted({k for k in keys if k is not None}):
            idx = np.flatnonzero(keys == key)
            rs = self.sets[key]
            sub = batch.take(pa.array(idx))
            signals = {c: _numpy(sub[c]) for c in rs.columns()}
            r, d = rs.evaluate(signals, len(idx))
            for j, i in enumerate(idx):
                reason[i], detail[i] = r[j], d[j]
        return Decision(pa.array(reason, pa.string()), pa.array(detail, pa.string()))


def _key_problems(key: str, kinds: list[str], has_langid: bool) -> list[str]:
    """A rule-set key that no document can select would silently judge nothing."""
    lang, _, kind = key.rpartition("_")
    if kind not in SOURCE_KINDS:
        return [
            f"the key must be <kind> or <lang>_<kind> with kind one of {', '.join(SOURCE_KINDS)} (e.g. zh_web, code); got {key!r}"
        ]
    out = [m for _, m in language_problems([lang])] if lang else []
    if kind not in kinds:
        out.append(f"{kind} is not in this stage's kinds {list(kinds)}, so this rule set would never apply")
    if lang and not has_langid:
        out.append(
            f"no langid stage runs before quality, so no document has lang {lang!r} and this rule set "
            f"would never apply; add langid before quality or use the key {kind!r}"
        )
    return out


def _value_problems(rs: RuleSet) -> list[str]:
    """Thresholds and settings a batch would only trip over: wrong types, missing list files."""
    out = []
    for fname, params in rs.filters.items():
        spec = FILTERS[fname]
        ops = {r.key: r.op for r in spec.rules}
        for key, value in params.items():
            where = f"{rs.name}: filters.{fname}.{key}"
            if value is None:
                continue  # null switches the rule off
            if (ops.get(key) == "true" or key in spec.flags) and not isinstance(value, bool):
                out.append(f"{where}: {value!r} is not allowed: use true or false")
            elif (ops.get(key) in ("min", "max") or key in spec.settings - spec.flags and not key.endswith("_list")) and (
                isinstance(value, bool) or not isinstance(value, (int, float))
            ):
                out.append(f"{where}: {value!r} is not allowed: a number is needed")
            elif key.endswith("_list") and not isinstance(value, str):
                out.append(f"{where}: {value!r} is not allowed: a file path is needed")
        if fname == "blocklist":
            paths = blocklist.list_paths({k: v for k, v in params.items() if isinstance(v, str)})
            for key, path in paths.items():
                if not path.is_file():
                    out.append(f"{rs.name}: filters.blocklist.{key}: file not found: {path}")
    return out


def _numpy(col: pa.ChunkedArray) -> np.ndarray:
    if pa.types.is_boolean(col.type):
        return np.array(col.fill_null(False).to_pylist(), dtype=bool)
    return col.cast(pa.float64()).to_numpy()


__all__ = ["FILTERS", "Quality", "QualityOptions", "RuleSet", "load_rule_sets"]
