"""`datapipe explain RUN DOC_ID`: every recorded signal of one document and the rule that decided it.

It reads the ``documents`` row from ``stats.duckdb`` (the same as
``select * from documents where id = ?``), then what each of the run's stages says of it
(``Stage.explain``: quality re-checks each rule of the document's rule set against the recorded
signals, classify each keep rule, so a kept document shows how close it came to each threshold;
the thresholds are the ones the run recorded in its run.json, not today's files), the mixture
repeat and the copies a survivor stands for.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, TextIO

from datapipe.audit.aggregates import stage_types
from datapipe.audit.sql import DB_NAME, AuditError, reading
from datapipe.config.mixture import DUP_COUNT, REPEAT_COLUMN, repeat_rules
from datapipe.run_folder.layout import RunFolder
from datapipe.stages.explain_section import ExplainSection, RecordedRun

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


def recorded_run(run_dir: Path) -> RecordedRun:
    """What the stages' explanations read of the run in ``run_dir``: run.json, SQL over its audit
    database (a connection per query: most explanations ask none), and whether a recorded rule or
    model file changed since."""
    from datapipe.pipeline.identity import current_sha256

    def query(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with reading(run_dir) as con:
            return con.execute(sql, params).fetchall()

    return RecordedRun(_run_json(run_dir), query, lambda entry: current_sha256(entry) != entry.get("sha256"))


def stage_sections(row: dict[str, Any], run: RecordedRun) -> list[ExplainSection]:
    """Each of the run's stages' parts of the explanation (``Stage.explain``), in pipeline order."""
    return [section for cls in dict.fromkeys(stage_types(run.run)) for section in cls.explain(row, run)]


def _run_json(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads(RunFolder(run_dir).run_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


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
    run = recorded_run(run_dir)
    for section in stage_sections(row, run):
        out.write(f"\n{section.title}:\n" + "\n".join(section.lines) + "\n")
    repeat = repeat_line(row, run.run)
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
