"""License tagging and the allow/deny policy, for web pages, code files and papers.

Signals: ``license`` (SPDX id or expression, or ``unknown``), ``license_class`` (the most
restrictive class: permissive, weak_copyleft, strong_copyleft, restricted,
non_commercial, no_derivatives, unknown) and ``license_evidence`` (where it was found and
a short pointer: URL, phrase, file name). A licence the pipeline file declares comes first: a
record's ``sources[i].license_field`` (evidence ``record field``), then ``sources[i].license``
(``declared by source``); detection runs only where neither gives one. Evidence comes from what
the readers keep:
``license_hints`` of web pages, ``repo_license_files`` of code, ``license_url`` and
``license_files`` (LICENSE/COPYING beside the LaTeX sources) of papers; without those, from
the document text itself (its head and tail, where notices live).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from pydantic import Field, field_validator

from datapipe.assets.filters_dir import filter_file
from datapipe.license import (
    Detection,
    Policy,
    detect_arxiv,
    detect_code_file,
    detect_hints,
    detect_repository,
    detect_web,
)
from datapipe.license.arxiv import ARXIV_NONEXCLUSIVE
from datapipe.license.expression import ExpressionError, combine, declared_expression
from datapipe.license.spdx import CLASSES, UNKNOWN
from datapipe.schema import RECORD_LICENSE, SOURCE_LICENSE
from datapipe.stages.base import CheckContext, Decision, ResourceFile, Stage, StageOptions
from datapipe.stages.columns import set_column

HEAD_CHARS, TAIL_CHARS = 2000, 4000  # license notices sit in headers and footers

ClassName = Literal["permissive", "weak_copyleft", "strong_copyleft", "restricted", "non_commercial", "no_derivatives", "unknown"]
assert set(ClassName.__args__) == set(CLASSES)  # type: ignore[attr-defined]


class KindPolicy(StageOptions):
    allow: list[ClassName] | None = Field(None, description="Only these classes are kept.")
    deny: list[ClassName] = Field(default_factory=list, description="These classes are dropped.")


class LicenseOptions(StageOptions):
    policy: dict[str, KindPolicy] = Field(default_factory=dict, description="Per source kind (web, code, paper, text, default).")

    @field_validator("policy")
    @classmethod
    def _kinds(cls, value: dict[str, KindPolicy]) -> dict[str, KindPolicy]:
        unknown = set(value) - {"web", "code", "paper", "text", "default"}
        if unknown:
            raise ValueError(f"policy keys must be source kinds (web, code, paper, text) or default; got {sorted(unknown)}")
        return value


class LicenseTagger(Stage):
    name = "license"
    summary = "SPDX license and license class per document; drops by policy per source kind"
    signals = "`license` (SPDX), `license_class`, `license_evidence`"
    reasons = ("license_<class>",)
    Options = LicenseOptions
    decision_options = frozenset({"policy"})  # what is dropped; the tags are the same under any policy

    @classmethod
    def keeps_text(cls, options: LicenseOptions) -> bool:
        return True  # it only tags: recorded tags stand for detecting again (run --from)

    @classmethod
    def output_columns(cls, options: LicenseOptions, context: CheckContext) -> set[str] | None:
        return {"license", "license_class", "license_evidence"}

    @classmethod
    def resource_files(cls, options: LicenseOptions, pipeline_dir: Path) -> list[ResourceFile]:
        """The SPDX id -> class table: it decides ``license_class`` and so what the policy drops."""
        return [ResourceFile(filter_file("licenses", "classes.yaml"), "license_classes")]  # what spdx.py reads

    @functools.cached_property
    def _policy(self) -> Policy:
        # Built on first use, not in setup(): a re-decide (run --from) calls decide() over recorded tags
        # without setting the stage up (setup loads models; the policy is only options).
        return Policy.from_config({k: v.model_dump(exclude_none=True) for k, v in self.options.policy.items()})

    def compute(self, batch: pa.Table) -> pa.Table:
        kind = batch["kind"][0].as_py() if batch.num_rows else "text"
        rows = batch.select(
            [
                c
                for c in (
                    "text",
                    "license_hints",
                    "repo_license_files",
                    "license_url",
                    "license_files",
                    SOURCE_LICENSE,
                    RECORD_LICENSE,
                )
                if c in batch.column_names
            ]
        ).to_pylist()
        detections = _with_declared(kind, rows)
        fields = [d.as_fields() for d in detections]
        for name in ("license", "license_class", "license_evidence"):
            batch = set_column(batch, name, pa.array([f[name] for f in fields], pa.string()))
        return batch

    def decide(self, batch: pa.Table) -> Decision:
        kind = batch["kind"][0].as_py() if batch.num_rows else "text"  # a batch is one source: one kind
        rule = self._policy.rules.get(kind) or self._policy.rules.get("default")
        if rule is None:
            return Decision.keep_all(batch.num_rows)
        # Few distinct licenses per batch: ask the policy once per license, not once per document.
        licenses = batch["license"].to_pylist()
        refusals = {lic: rule.refusal(Detection(lic).classes) for lic in set(licenses)}
        reasons = [f"license_{cls}" if refusals[lic] else None for lic, cls in zip(licenses, batch["license_class"].to_pylist())]
        details = [
            f"{lic}: {refusals[lic]} (evidence {ev or 'none'})" if refusals[lic] else None
            for lic, ev in zip(licenses, batch["license_evidence"].to_pylist())
        ]
        return Decision(pa.array(reasons, pa.string()), pa.array(details, pa.string()))


# What detection looked for, per kind: an `unknown` verdict says so in its evidence.
LOOKED_FOR = {
    "code": "none found in the file header (SPDX line, notice) or the repository's LICENSE/COPYING, LICENSES/, "
    "package metadata, README licence section",
    "paper": "none found in licence files beside the LaTeX sources, the arXiv licence URL or notices in the text",
    "web": "none found in rel=license links, Creative Commons URLs or badges, or notices in the text's head and tail",
    "text": "none found in notices in the text's head and tail",
}
NOTHING_DECLARED = "; no sources[].license or license_field declared"


def _with_declared(kind: str, rows: list[dict[str, Any]]) -> list[Detection]:
    """Declared licences where the pipeline file gives one, detection for the other rows."""
    declared: dict[tuple[str | None, str | None], Detection | str] = {}
    out: list[Detection | None] = []
    has_field = bool(rows) and RECORD_LICENSE in rows[0]  # the source names a license_field
    for row in rows:
        key = (row.get(RECORD_LICENSE), row.get(SOURCE_LICENSE))
        if key not in declared:
            declared[key] = _declared(*key, has_field)
        out.append(found if isinstance(found := declared[key], Detection) else None)
    todo = [i for i, d in enumerate(out) if d is None]
    if todo:
        notes = [str(declared[(rows[i].get(RECORD_LICENSE), rows[i].get(SOURCE_LICENSE))]) for i in todo]
        for i, note, found in zip(todo, notes, _detect(kind, [rows[i] for i in todo])):
            if not found.known and not found.evidence:
                found = Detection(UNKNOWN, LOOKED_FOR.get(kind, LOOKED_FOR["text"]) + note)
            out[i] = found
    return [d for d in out if d is not None]


def _declared(record: str | None, source: str | None, has_field: bool) -> Detection | str:
    """The record's licence, else the source's; or, when neither is a usable one, a note for the evidence."""
    note = "; the record's license_field is empty" if has_field else NOTHING_DECLARED
    if record is not None:
        try:
            return Detection(declared_expression(record), record, "record field")
        except ExpressionError:
            note = f"; record field {record[:60]!r} is not an SPDX expression"
    if source is not None:  # checked when the pipeline was loaded
        return Detection(declared_expression(source), source, "declared by source")
    return note


def _detect(kind: str, rows: list[dict[str, Any]]) -> list[Detection]:
    if kind == "code":
        repos: dict[str, Detection] = {}
        out = []
        for row in rows:
            files = row.get("repo_license_files") or "{}"
            if files not in repos:  # one repository's files repeat on every row of it
                repos[files] = detect_repository(_json_object(files))
            out.append(detect_code_file(row.get("text") or "", repos[files]))
        return out
    if kind == "paper":
        return [_paper(r) for r in rows]
    out = []
    for row in rows:
        hints = _json_list(row.get("license_hints"))
        found = detect_hints(hints) if hints else Detection(UNKNOWN)
        out.append(found if found.known else _from_text(row.get("text")))
    return out


def _paper(row: dict[str, Any]) -> Detection:
    """A paper's licence files (the author's grant to everyone) and its arXiv licence URL.

    Both known: both apply (AND, as for disagreeing code sources), except arXiv's
    non-exclusive licence, which grants arXiv alone and so takes nothing from the file's
    grant.  Neither known: notices in the text."""
    # Keyed by name, the file nearest the main .tex last (it wins): they are the paper's root files.
    files = {
        p.rsplit("/", 1)[-1]: t
        for p, t in sorted(_json_object(row.get("license_files") or "{}").items(), key=lambda kv: kv[0].count("/"))
    }
    own = detect_repository(files) if files else Detection(UNKNOWN)
    meta = detect_arxiv(row["license_url"]) if row.get("license_url") else Detection(UNKNOWN)
    if own.known and meta.known and meta.license != ARXIV_NONEXCLUSIVE:
        return Detection(
            combine([own.license, meta.license]), f"{own.evidence[:80]}; {meta.evidence[:80]}", f"{own.where},{meta.where}"
        )
    if own.known or meta.known:
        return own if own.known else meta
    found = _from_text(row.get("text"))
    return found if found.known or not meta.evidence else meta  # keep the unread URL as evidence


def _from_text(text: str | None) -> Detection:
    if not text:
        return Detection(UNKNOWN)
    sample = text if len(text) <= HEAD_CHARS + TAIL_CHARS else text[:HEAD_CHARS] + "\n" + text[-TAIL_CHARS:]
    return detect_web(sample)


def _json_object(raw: str) -> dict[str, str]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _json_list(raw: str | None) -> list[str]:
    if not raw:
        return []
    try:
        value = json.loads(raw)
    except ValueError:
        return [raw]
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]
