"""One document: its row (text and every signal), found through the files whose id range holds it,
and everything that explains it: the stage and rule that decided it with value and threshold (what
``datapipe explain`` says), its edits against the text as read, its duplicates both ways (from the
copies index), its license evidence, classifier scores and buckets, and annotation answers with
their provenance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc

from datapipe.audit.explain import DECISION, recorded_run, repeat_line
from datapipe.stages.classify.explain import classify_lines
from datapipe.stages.quality.explain import RuleCheck, rule_checks
from datapipe.view.originals import DiffLine, Original, diff_lines, original_text
from datapipe.view.runs import DocFile, RunView
from datapipe.view.thresholds import stage_decision

EDIT_COLUMNS = {
    "pii": ("pii_email", "pii_phone", "pii_id_card", "pii_ip"),
    "boilerplate": ("lines_removed", "chars_removed", "removed_lines"),
    "substrings": ("substr_spans_removed", "substr_chars_removed", "substr_removed"),
    "langid": ("to_simplified",),
}
LICENSE_COLUMNS = ("license", "license_class", "license_evidence")
DUP_COLUMNS = ("dup_of", "dup_count", "dup_cluster", "semantic_similarity")
SHOWN_TEXT_CHARS = 300_000  # more is served whole at /documents/<id>/text (text/plain)


@dataclass
class Group:
    title: str
    items: list[tuple[str, Any]]
    note: str = ""


@dataclass
class DocumentPage:
    row: dict[str, Any]
    file: DocFile
    text: str
    verdict: str
    stage_options: dict[str, Any]
    checks: list[RuleCheck]
    checks_note: str | None
    classify: list[str]
    repeat: str | None
    copies: list[tuple[str, str, str | None]] | None  # None: the run has no copies index
    groups: list[Group] = field(default_factory=list)
    original: Original | None = None
    diff: list[DiffLine] = field(default_factory=list)
    edited: bool = False


def find_row(run: RunView, doc_id: str) -> tuple[DocFile, dict[str, Any]] | None:
    """The document's row with every column, from the files whose id range holds it (row groups
    whose id statistics rule it out are not read)."""
    for f in run.files_holding(doc_id):
        with run.parquet(f) as pf:
            meta = pf.metadata
            col = run.leaves(f, meta)["id"]
            for g in range(meta.num_row_groups):
                stats = meta.row_group(g).column(col).statistics
                if stats is not None and stats.has_min_max and not (stats.min <= doc_id <= stats.max):
                    continue
                table = pf.read_row_group(g)
                hit = table.filter(pc.equal(table["id"], doc_id))
                if hit.num_rows:
                    row = hit.slice(0, 1).to_pylist()[0]
                    row["status"] = f.status
                    return f, row
    return None


def copies_of(run: RunView, doc_id: str) -> list[tuple[str, str, str | None]] | None:
    """(id, reason, detail) of the documents dropped as copies of ``doc_id``, from the copies index
    files whose dup_of range holds it; None for a run without the index."""
    files = run.copies_files_holding(doc_id)
    if files is None:
        return None
    out = []
    for c in files:
        with run.parquet(c.path) as pf:
            table = pf.read(columns=["dup_of", "id", "reason", "detail"])
        hit = table.filter(pc.equal(table["dup_of"], doc_id))
        out += list(zip(hit["id"].to_pylist(), hit["reason"].to_pylist(), hit["detail"].to_pylist()))
    return sorted(out)


def _groups(row: dict[str, Any], run: dict[str, Any]) -> list[Group]:
    """The signals in groups a reader looks for: license, duplicates, classifiers, annotations, edits, the rest."""
    taken = set(DECISION) | {"text", "status"}
    groups: list[Group] = []

    def group(title: str, names: list[str], note: str = "") -> None:
        items = [(n, row[n]) for n in names if n in row and n not in taken and row[n] is not None]
        taken.update(names)
        if items:
            groups.append(Group(title, items, note))

    group("License", list(LICENSE_COLUMNS))
    group("Duplicates", list(DUP_COLUMNS))
    group("Classifier scores and buckets", sorted(k for k in row if k.startswith(("cls_", "bucket_", "mixture_repeat"))))
    for i, entry in enumerate((run.get("config") or {}).get("stages") or [], start=1):
        options = entry.get("annotate") if isinstance(entry, dict) else None
        if isinstance(options, dict):
            prefix = str(options.get("prefix") or "llm") + "_"
            names = sorted(k for k in row if k.startswith(prefix))
            provenance = ("model", "endpoint", "prompt_sha256", "schema_sha256", "params", "prompt_tokens", "completion_tokens")
            first = [prefix + p for p in provenance]
            group(
                f"Annotation (stage {i}, {prefix}*)",
                [n for n in names if n not in first] + [n for n in first if n in names],
                f"asked of {options.get('model')}; the answer's fields first, then where it came from",
            )
    for stage, edits in EDIT_COLUMNS.items():
        group(f"Edits ({stage})", list(edits))
    group("Signals", sorted(k for k in row if k not in taken))
    return groups


def _edited(row: dict[str, Any]) -> bool:
    """Whether a stage changed the text (the stages record what they replaced or removed)."""
    for names in EDIT_COLUMNS.values():
        for n in names:
            v = row.get(n)
            if isinstance(v, bool):
                if v:
                    return True
            elif isinstance(v, (int, float)) and v > 0:
                return True
            elif isinstance(v, list) and v:
                return True
    return False


def document_page(view: RunView, doc_id: str, with_original: bool = True) -> DocumentPage | None:
    found = find_row(view, doc_id)
    if found is None:
        return None
    file, row = found
    run = view.run_json()
    text = row.get("text") or ""
    if row["status"] == "kept":
        verdict = "kept: passed every stage"
    else:
        verdict = f"dropped by stage {row.get('stage')!r}, rule {row.get('reason')!r}"
    recorded = recorded_run(view.root)
    checks, note = rule_checks(row, recorded)
    page = DocumentPage(
        row=row,
        file=file,
        text=text,
        verdict=verdict,
        stage_options=stage_decision(run, file.position, row.get("stage")) if row["status"] == "rejected" else {},
        checks=checks,
        checks_note=note,
        classify=classify_lines(row, recorded) if any(k.startswith(("cls_", "bucket_")) for k in row) else [],
        repeat=repeat_line(row, run),
        copies=copies_of(view, doc_id) if row["status"] == "kept" else [],
        groups=_groups(row, run),
        edited=_edited(row),
    )
    if with_original and page.edited:
        page.original = original_text(run, doc_id, str(row.get("source")))
        if page.original.text is not None:
            page.diff = diff_lines(page.original.text, text)
    return page
