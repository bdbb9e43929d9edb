"""`datapipe explain RUN DOC_ID`: every recorded signal of one document and the rule that decided it.

It reads the ``documents`` row from ``stats.duckdb`` (the same as
``select * from documents where id = ?``) and, for documents the ``quality`` stage judged,
re-checks each rule of the named rule set against the recorded signals, so a kept document
shows how close it came to each threshold. The thresholds are the ones the run recorded in
its run.json, not today's rule file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from datapipe.audit.sql import DB_NAME, AuditError, reading
from datapipe.config.mixture import DUP_COUNT, REPEAT_COLUMN, repeat_rules
from datapipe.run_folder.layout import RunFolder

DECISION = ("id", "source", "kind", "status", "stage", "reason", "detail")


def document_row(run_dir: Path, doc_id: str) -> dict[str, Any]:
    # Only the files whose recorded id range holds the id are read, not the whole corpus.
    with reading(run_dir, only_id=doc_id) as con:
        table = con.sql("select * from documents where id = $id", params={"id": doc_id}).to_arrow_table()
    if table.num_rows == 0:
        # A miss: the hint looks for near ids among all of them (the pruned view above holds only the
        # files whose id range holds the id as typed, where a near id is usually not).
        with reading(run_dir) as con:
            hint = near_ids_hint(con, doc_id)
        raise AuditError(f"no document {doc_id!r} in {Path(run_dir) / DB_NAME}", hint=hint)
    return table.to_pylist()[0]


def near_ids_hint(con: Any, doc_id: str) -> str | None:
    """'did you mean ...' for an id that is almost one of the run's; None when none is near.

    Ids are ``<source>/<input file>#<record>``. Tried in order, only after a miss, each a scan of
    the ids with cheap string tests (a second or so for millions of documents): the same id but
    for case or the record's form (``#201`` for ``#L201`` and back), or with leading folders left
    out (the source, ``data/``); else the nearest records of the same input file; else the ids
    of the same record a few edits away (a typo in the source or file name).
    """
    typed = doc_id.strip()
    forms = _id_forms(typed)
    a, b = forms[0], forms[-1]  # the id as typed and its other record form (the same when it has none)
    rows = con.execute(
        "SELECT id FROM documents WHERE id = $a OR id = $b OR lower(id) = lower($a) "
        "OR ends_with(id, '/' || $a) OR ends_with(id, '/' || $b) ORDER BY length(id), id LIMIT 4",
        {"a": a, "b": b},
    ).fetchall()
    if rows:
        return _did_you_mean([r[0] for r in rows])
    file, sep, record = typed.rpartition("#")
    number = re.fullmatch(r"L?(\d+)", record)
    if sep and file and number:  # the file is right, the record is not one of its documents
        found = con.execute(
            "SELECT id, count(*) OVER (PARTITION BY f), abs(coalesce(r, 0) - $n) AS d FROM "
            "(SELECT id, regexp_replace(id, '#[^#]*$', '') AS f, "
            "try_cast(regexp_extract(id, '#L?(\\d+)$', 1) AS BIGINT) AS r FROM documents "
            "WHERE starts_with(id, $head) OR contains(id, '/' || $head)) "
            "WHERE f = $file OR ends_with(f, '/' || $file) ORDER BY d, id LIMIT 3",
            {"file": file, "head": file + "#", "n": int(number.group(1))},
        ).fetchall()
        if found:
            nearest = [r[0] for r in found if r[2] == found[0][2]]
            name = nearest[0].rpartition("#")[0]
            return f"{name} has {found[0][1]} document(s) in this run; the nearest: " + ", ".join(map(repr, nearest))
    if not sep:
        return None
    far = max(2, len(typed) // 5)  # a few typos, not a different document
    rows = con.execute(
        "SELECT id, d FROM (SELECT id, levenshtein(id, $id) AS d FROM documents WHERE ends_with(id, $record)) "
        "WHERE d <= $far ORDER BY d, id LIMIT 3",
        {"id": typed, "record": "#" + record, "far": far},
    ).fetchall()
    return _did_you_mean([r[0] for r in rows if r[1] == rows[0][1]]) if rows else None


def _id_forms(doc_id: str) -> list[str]:
    """Spellings of ``doc_id`` a user may have meant: both record forms (#201, #L201)."""
    forms = [doc_id]
    head, sep, record = doc_id.rpartition("#")
    if sep and re.fullmatch(r"\d+", record):
        forms.append(f"{head}#L{record}")
    elif sep and re.fullmatch(r"[Ll]\d+", record):
        forms.append(f"{head}#{record[1:]}")
    return forms


def _did_you_mean(ids: list[str]) -> str:
    shown = " or ".join(repr(i) for i in ids[:3])
    return f"did you mean {shown}?" + (" (and more)" if len(ids) > 3 else "")


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
        from datapipe.stages.quality.rules import Rule, describe

        bound = "" if self.op == "true" else f"  ({self.op} {self.threshold})"
        rule = Rule(self.rule, self.column, self.op)
        shown = describe(rule, self.value, self.threshold).split(" ")[0] if self.op != "true" else f"{self.column}={self.value}"
        return f"  {'FAIL' if self.failed else 'ok  '} {self.filter}:{self.rule:<22} {shown}{bound}"


def rule_checks(row: dict[str, Any], run_dir: Path | None = None) -> tuple[list[RuleCheck], str | None]:
    """Each rule of the document's quality rule set with value, threshold and whether it failed, in the
    order they are checked, and a note (the rule file changed since, or no rule set to grade against).

    The thresholds are the run's own, recorded in its run.json, not today's rule file (which may
    have been edited since)."""
    from datapipe.stages.quality.rules import FILTERS

    name = row.get("quality_rules")
    if not name:
        return [], None
    rules, note = recorded_rule_set(run_dir, name)
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


def rule_lines(row: dict[str, Any], run_dir: Path | None = None) -> list[str]:
    """One line per rule of the document's quality rule set: value, threshold, pass or FAIL; a changed
    rule file is pointed out in one line before the rules."""
    checks, note = rule_checks(row, run_dir)
    return ([note] if note else []) + [c.line() for c in checks]


def recorded_rule_set(run_dir: Path | None, name: str) -> tuple[Any, str | None]:
    """(the rule set ``name`` as the run recorded it in run.json, or None; a note line or None)."""
    from datapipe.pipeline.identity import current_sha256
    from datapipe.stages.quality.rules import RuleSet, RuleSetError

    run = _run_json(run_dir) if run_dir is not None else {}
    entry = next((e for e in run.get("resources") or [] if e.get("role") == "rules" and e.get("key") == name), None)
    if entry is not None and entry.get("content") is not None:
        try:
            rules = RuleSet.from_text(entry["content"], f"{entry['path']} (as recorded in run.json)", name)
        except RuleSetError as exc:
            return None, f"  (rule set {name} as recorded cannot be read: {exc})"
        if current_sha256(entry) != entry.get("sha256"):
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


def _run_json(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads(RunFolder(run_dir).run_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _rule_file_today(run: dict[str, Any], name: str) -> Path:
    """The file the run's config names for rule-set key ``name`` (a user's own), else the built-in one."""
    from datapipe.stages.quality.rules import BUILTIN_DIR, rule_file

    for stage in (run.get("config") or {}).get("stages") or []:
        rules = (stage.get("quality") or {}).get("rules") if isinstance(stage, dict) else None
        if isinstance(rules, dict) and name in rules:
            return rule_file(str(rules[name]), Path(run.get("pipeline_file") or "pipeline.yaml").parent)
    return BUILTIN_DIR / f"{name}.yaml"


def classify_lines(row: dict[str, Any], run_dir: Path) -> list[str]:
    """Each keep rule of the run's classify stages against the document's score: value, bound, ok or FAIL.

    A percentile rule's cut-off is per group and recorded in the detail of the documents it
    dropped, so it is read from one of them (the same text for the whole group).
    """
    out: list[str] = []
    for stage in (_run_json(run_dir).get("config") or {}).get("stages") or []:
        options = stage.get("classify") if isinstance(stage, dict) else None
        for rule in (options or {}).get("keep") or []:
            if rule.get("bucket") is not None:
                out += _bucket_rule_lines(row, rule, options or {})
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
                group = " ".join(f"{c}={row.get(c)}" for c in rule.get("per") or [])
                tag = f"(p{rule['min_percentile']:g} of {group or 'the run'},"
                with reading(run_dir) as con:
                    hit = con.execute(
                        "SELECT detail FROM documents WHERE reason = $r AND contains(detail, $t) LIMIT 1",
                        {"r": f"classifier:{col}", "t": tag},
                    ).fetchone()
                cut = hit[0].split(" < ", 1)[1].split(" ", 1)[0] if hit else None
                verdict = ("FAIL" if value < float(cut) else "ok  ") if cut else "?   "
                where = (
                    f">= {cut}, the p{rule['min_percentile']:g} cut-off of {group}"
                    if cut
                    else (
                        f"p{rule['min_percentile']:g} of {group}: no document of the group was dropped by this rule, "
                        f"so its cut-off is not recorded"
                    )
                )
                out.append(f"  {verdict} {col}={value:.4f}  ({where})")
    return out


def _bucket_rule_lines(row: dict[str, Any], rule: dict[str, Any], options: dict[str, Any]) -> list[str]:
    """A classify bucket rule against the document's bucket, with the models' buckets it came from
    (the buckets are recorded columns, so a kept document is graded as exactly as a dropped one)."""
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


def copies_lines(row: dict[str, Any], run_dir: Path, limit: int = 5) -> list[str]:
    """For a kept document: the documents dropped as copies of it (``dup_of``: dedup, minhash,
    semantic), how many by each rule, and the first few with their detail (semantic: the cosine).
    Read from the copies index (``copies_of``), not from every reject file of the run."""
    if row.get("status") != "kept":
        return []
    rows = copies_of(run_dir, row["id"])
    if not rows:
        return []
    counts: dict[str, int] = {}
    for _, reason, _ in rows:
        counts[reason] = counts.get(reason, 0) + 1
    out = ["  " + ", ".join(f"{n} dropped as {reason}" for reason, n in sorted(counts.items()))]
    out += [f"  {i}: {detail}" for i, _, detail in rows[:limit]]
    if len(rows) > limit:
        out.append(f"  ... and {len(rows) - limit} more (select id, detail from documents where dup_of = '{row['id']}')")
    return out


def copies_of(run_dir: Path, doc_id: str) -> list[tuple[str, str, str | None]]:
    """(id, reason, detail) of every document dropped as a copy of ``doc_id`` (``dup_of``), by id:
    from the copies index files of the survivor's own task (``copies_files``), a few whatever the
    size of the run; in a run without the index, from every file with a ``dup_of`` column."""
    from datapipe.audit.documents import COPIES_VIEW, has_copies_index

    with reading(run_dir, only_id=doc_id, copies_of=doc_id) as con:
        if has_copies_index(con):
            return con.execute(
                f'SELECT id, reason, detail FROM "{COPIES_VIEW}" WHERE dup_of = $id ORDER BY id', {"id": doc_id}
            ).fetchall()
    return scanned_copies_of(run_dir, doc_id)


def scanned_copies_of(run_dir: Path, doc_id: str) -> list[tuple[str, str, str | None]]:
    """``copies_of`` by a scan of ``documents``: every file with a ``dup_of`` column is opened."""
    with reading(run_dir) as con:
        if "dup_of" not in {r[0] for r in con.execute("DESCRIBE documents").fetchall()}:
            return []
        return con.execute("SELECT id, reason, detail FROM documents WHERE dup_of = $id ORDER BY id", {"id": doc_id}).fetchall()


def explain(run_dir: Path, doc_id: str, out: TextIO) -> None:
    row = document_row(run_dir, doc_id)
    for key in DECISION:
        out.write(f"{key:>8}: {row.get(key)}\n")
    verdict = (
        "kept: passed every stage"
        if row["status"] == "kept"
        else f"dropped by stage {row['stage']!r}, rule {row['reason']!r} ({row['detail']})"
    )
    out.write(f"verdict: {verdict}\n\nsignals:\n")
    for key in sorted(k for k in row if k not in DECISION and row[k] is not None):
        value = row[key]
        out.write(f"  {key:<28} {value:.4g}\n" if isinstance(value, float) else f"  {key:<28} {value}\n")
    lines = rule_lines(row, run_dir)
    if lines:
        out.write(f"\nquality rules ({row['quality_rules']}), in the order they are checked:\n" + "\n".join(lines) + "\n")
    classify = classify_lines(row, run_dir)
    if classify:
        out.write("\nclassify keep rules, in the order they are checked:\n" + "\n".join(classify) + "\n")
    repeat = repeat_line(row, _run_json(run_dir))
    if repeat:
        out.write(f"\nmixture repeat:\n  {repeat}\n")
    copies = copies_lines(row, run_dir)
    if copies:
        out.write("\nkept as the survivor of these copies:\n" + "\n".join(copies) + "\n")


def repeat_line(row: dict[str, Any], run: dict[str, Any]) -> str | None:
    """How many times a kept document of a source with mixture repeats is in the shards and exports,
    and why: the range of ``mixture.<source>.repeat`` its bucket falls in, times dup_count if asked."""
    count = row.get(REPEAT_COLUMN)
    if count is None:
        return None
    source = row["source"]
    rule = repeat_rules((run.get("config") or {}).get("mixture")).get(source)
    if rule is None:
        return f"{REPEAT_COLUMN}={count}"
    bucket = row.get(rule.column)
    named = next(
        (f"{lo}-{hi}" if lo != hi else str(lo) for lo, hi, _ in rule.ranges if bucket is not None and lo <= bucket <= hi), None
    )
    why = (
        f"{rule.column}={bucket} is in mixture.{source}.repeat.{named}: {rule.repeat_of(bucket)}"
        if named is not None
        else f"{rule.column}={bucket}, in no range of mixture.{source}.repeat: 1"
    )
    if rule.rehydrate:
        why += f", x dup_count={row.get(DUP_COUNT) or 1} (rehydrate)"
    where = "left out of the shards and exports" if count == 0 else f"read {count} time{'s' if count != 1 else ''} an epoch"
    return f"{REPEAT_COLUMN}={count}: {where} ({why})"
