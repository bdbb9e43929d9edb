"""The classify stage's part of ``datapipe explain``: each keep rule of the run's classify stages
against a document's score or bucket (recorded columns, so a kept document is graded as exactly as a
dropped one)."""

from __future__ import annotations

from typing import Any

from datapipe.stages.explain_section import ExplainSection, RecordedRun


def explain(row: dict[str, Any], run: RecordedRun) -> list[ExplainSection]:
    lines = classify_lines(row, run)
    return [ExplainSection("classify keep rules, in the order they are checked", lines)] if lines else []


def classify_lines(row: dict[str, Any], run: RecordedRun) -> list[str]:
    """Each keep rule of the run's classify stages against the document's score: value, bound, ok or FAIL.

    A percentile rule's cut-off is per group and recorded in the detail of the documents it
    dropped, so it is read from one of them (the same text for the whole group).
    """
    out: list[str] = []
    for options in run.stage_options("classify"):
        for rule in options.get("keep") or []:
            if rule.get("bucket") is not None:
                out += _bucket_rule_lines(row, rule, options)
                continue
            col, value = rule.get("score"), row.get(rule.get("score"))
            if value is None:
                continue
            for key, op, fails in (
                ("min", ">=", value < (rule.get("min") or 0)),
                ("max", "<=", value > (rule.get("max") if rule.get("max") is not None else 1)),
            ):
                if rule.get(key) is not None:
                    out.append(f"  {'FAIL' if fails else 'ok  '} {col}={value:.4f}  ({op} {rule[key]:g})")
            if rule.get("min_percentile") is not None:
                out.append(_percentile_line(row, rule, col, value, run))
    return out


def _percentile_line(row: dict[str, Any], rule: dict[str, Any], col: str, value: float, run: RecordedRun) -> str:
    group = " ".join(f"{c}={row.get(c)}" for c in rule.get("per") or [])
    tag = f"(p{rule['min_percentile']:g} of {group or 'the run'},"
    hit = run.query(
        "SELECT detail FROM documents WHERE reason = $r AND contains(detail, $t) LIMIT 1",
        {"r": f"classifier:{col}", "t": tag},
    )
    cut = hit[0][0].split(" < ", 1)[1].split(" ", 1)[0] if hit else None
    verdict = ("FAIL" if value < float(cut) else "ok  ") if cut else "?   "
    where = (
        f">= {cut}, the p{rule['min_percentile']:g} cut-off of {group}"
        if cut
        else (
            f"p{rule['min_percentile']:g} of {group}: no document of the group was dropped by this rule, "
            f"so its cut-off is not recorded"
        )
    )
    return f"  {verdict} {col}={value:.4f}  ({where})"


def _bucket_rule_lines(row: dict[str, Any], rule: dict[str, Any], options: dict[str, Any]) -> list[str]:
    """A classify bucket rule against the document's bucket, with the models' buckets it came from."""
    name = rule["bucket"]
    value = row.get(f"bucket_{name}")
    if value is None:
        return []
    buckets = options.get("buckets") or {}
    models = ", ".join(f"bucket_{m}={row.get(f'bucket_{m}')}" for m in options.get("models") or {})
    ranked = "ranked " if buckets.get("rank_ensemble") else ""
    how = f"{ranked}{buckets.get('ensemble', 'max')} of {models}" if name == buckets.get("name", "ensemble") else models
    out = []
    for key, op, fails in (("min", ">=", lambda b: value < b), ("max", "<=", lambda b: value > b)):
        if rule.get(key) is not None:
            bound = rule[key]
            out.append(
                f"  {'FAIL' if fails(bound) else 'ok  '} bucket_{name}={value}  ({op} {bound:g} of "
                f"{buckets.get('count', 20)} buckets; {how})"
            )
    return out
