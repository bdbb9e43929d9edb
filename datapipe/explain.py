"""`datapipe explain RUN DOC_ID`: every recorded signal of one document and the rule that decided it.

It reads the ``documents`` row from ``stats.duckdb`` (the same as
``select * from documents where id = ?``) and, for documents the ``quality`` stage judged,
re-checks each rule of the named rule set against the recorded signals, so a kept document
shows how close it came to each threshold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

import numpy as np

from datapipe.audit import DB_NAME, AuditError, reading

DECISION = ("id", "source", "kind", "status", "stage", "reason", "detail")


def document_row(run_dir: Path, doc_id: str) -> dict[str, Any]:
    with reading(run_dir) as con:
        table = con.sql("select * from documents where id = $id", params={"id": doc_id}).to_arrow_table()
    if table.num_rows == 0:
        raise AuditError(f"no document {doc_id!r} in {Path(run_dir) / DB_NAME}")
    return table.to_pylist()[0]


def rule_lines(row: dict[str, Any]) -> list[str]:
    """One line per rule of the document's quality rule set: value, threshold, pass or FAIL."""
    from datapipe.stages.quality.rules import BUILTIN_DIR, FILTERS, RuleSet, RuleSetError, describe

    name = row.get("quality_rules")
    if not name:
        return []
    path = BUILTIN_DIR / f"{name}.yaml" if (BUILTIN_DIR / f"{name}.yaml").is_file() else Path(name)
    try:
        rules = RuleSet.load(path, name)
    except RuleSetError:
        return [f"(rule set {name} not found here; signals above are what it saw)"]
    out = []
    for fname, params in rules.filters.items():
        for rule in FILTERS[fname].rules:
            threshold, value = params.get(rule.key), row.get(rule.column)
            if threshold is None or value is None:
                continue
            failed = bool(rule.fails(np.array([value], dtype=float), threshold)[0])
            bound = "" if rule.op == "true" else f"  ({rule.op} {threshold})"
            shown = describe(rule, value, threshold).split(" ")[0] if rule.op != "true" else f"{rule.column}={value}"
            out.append(f"  {'FAIL' if failed else 'ok  '} {fname}:{rule.name:<22} {shown}{bound}")
    return out


def explain(run_dir: Path, doc_id: str, out: TextIO) -> None:
    row = document_row(run_dir, doc_id)
    for key in DECISION:
        out.write(f"{key:>8}: {row.get(key)}\n")
    verdict = ("kept: passed every stage" if row["status"] == "kept"
               else f"dropped by stage {row['stage']!r}, rule {row['reason']!r} ({row['detail']})")
    out.write(f"verdict: {verdict}\n\nsignals:\n")
    for key in sorted(k for k in row if k not in DECISION and row[k] is not None):
        value = row[key]
        out.write(f"  {key:<28} {value:.4g}\n" if isinstance(value, float) else f"  {key:<28} {value}\n")
    lines = rule_lines(row)
    if lines:
        out.write(f"\nquality rules ({row['quality_rules']}), in the order they are checked:\n" + "\n".join(lines) + "\n")
