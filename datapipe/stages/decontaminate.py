"""Benchmark decontamination: find documents that contain evaluation items, by n-gram overlap.

Signals (columns), null/0 where a document holds no benchmark n-gram:

  ``contam_hits``        distinct benchmark n-grams in the document (any item, any benchmark)
  ``contam_benchmark``   benchmark of the best-matching item (the one with the most matched n-grams)
  ``contam_item``        that item's id (``id_field``, else ``<file>#<row>``)
  ``contam_item_hits``   that item's distinct n-grams found in the document
  ``contam_frac``        ``contam_item_hits`` / the item's distinct n-grams
  ``contam_ngram``       the first matched n-gram of that item, normalized (what to grep for)

The decision is separate: a document is contaminated when its best item has at least
``min_hits`` matched n-grams and a matched share of at least ``min_frac``; ``action: drop``
rejects it with reason ``contaminated`` (detail: benchmark, item, hits, share, n-gram),
``action: flag`` keeps it with the signals recorded. N-grams: ``datapipe.decontaminate.ngrams``;
the index of every benchmark n-gram is built once per worker process (``datapipe.decontaminate.index``).
"""

from __future__ import annotations

import glob
import hashlib
import logging
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from datapipe.config.sections import SOURCE_KINDS
from datapipe.decontaminate.benchmarks import file_format, has_field, items, records
from datapipe.decontaminate.index import BenchmarkIndex
from datapipe.runtime.process_cache import process_cache
from datapipe.stages.base import CheckContext, Decision, Problem, Stage, StageOptions, kinds_problems
from datapipe.stages.columns import set_column
from datapipe.stages.report_section import Aggregate, ReportSection, column

log = logging.getLogger(__name__)

_INDEXES: dict[tuple[Any, ...], BenchmarkIndex] = process_cache({})  # one index per worker process and configuration
CHECK_RECORDS = 20  # records per file that validation reads to find the fields
INDEX_VERSION = 1  # bump when n-gram hashing changes: cached indexes of older versions are not used

COLUMNS: dict[str, pa.DataType] = {
    "contam_hits": pa.int32(),
    "contam_benchmark": pa.string(),
    "contam_item": pa.string(),
    "contam_item_hits": pa.int32(),
    "contam_frac": pa.float64(),
    "contam_ngram": pa.string(),
}


class BenchmarkFiles(StageOptions):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="Benchmark name in signals, details and the view.")
    paths: list[str] = Field(
        min_length=1, description="Files or globs (JSONL, JSONL.gz, Parquet, CSV), relative to the pipeline file."
    )
    fields: list[str] = Field(
        min_length=1, description="Fields holding text; dotted paths reach nested objects; lists and objects are flattened."
    )
    id_field: str | None = Field(None, description="Field with the item id; default <file name>#<row>.")


class DecontaminateOptions(StageOptions):
    benchmarks: list[BenchmarkFiles] = Field(
        min_length=1, description="Benchmarks to match, each with its own files and text fields."
    )
    # 13 words: GPT-3, datatrove and OLMo's English decontamination. 13 characters for Chinese: on
    # the shared corpora 13 gives 2 matched documents among 1,730 zh pages that are not CMRC
    # paragraphs (8: 31, 10: 10) while leaving 30 of 1,766 Gaokao items too short to index (20: 111).
    n_word: int = Field(13, ge=1, description="Words per n-gram in Latin-script text.")
    n_char: int = Field(13, ge=1, description="Characters per n-gram in Han/kana text.")
    fold_script: bool = Field(True, description="Fold Traditional to Simplified before matching.")
    action: Literal["drop", "flag"] = Field(
        "drop", description="drop: reject matching documents as contaminated; flag: keep them with the contam_* signals."
    )
    min_hits: int = Field(1, ge=1, description="Matched n-grams of one item that make a document contaminated.")
    min_frac: float = Field(0.0, ge=0.0, le=1.0, description="And the share of that item's n-grams matched.")
    kinds: list[str] = Field(list(SOURCE_KINDS), description="Source kinds the stage applies to.")

    @model_validator(mode="after")
    def _unique_names(self) -> DecontaminateOptions:
        names = [b.name for b in self.benchmarks]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"benchmark names must be unique; repeated: {', '.join(dup)}")
        return self


def resolve_paths(spec: BenchmarkFiles, base: Path) -> list[Path]:
    out: list[Path] = []
    for p in spec.paths:
        pattern = Path(p).expanduser()
        pattern = pattern if pattern.is_absolute() else base / pattern
        out.extend(sorted(Path(m) for m in glob.glob(str(pattern), recursive=True) if Path(m).is_file()))
    return list(dict.fromkeys(out))


class Decontaminate(Stage):
    name = "decontaminate"
    summary = "benchmark n-gram matching"
    signals = "`contam_hits`, `contam_benchmark`, `contam_item`, `contam_item_hits`, `contam_frac`, `contam_ngram`"
    reasons = ("contaminated",)
    Options = DecontaminateOptions
    decision_options = frozenset({"action", "min_hits", "min_frac"})  # judged over the recorded matches

    @classmethod
    def keeps_text(cls, options: Any) -> bool:
        return True  # it only adds its match columns: recorded ones stand for matching again (run --from)

    @classmethod
    def check(cls, options: DecontaminateOptions, context: CheckContext) -> list[Problem]:
        problems = kinds_problems(options.kinds)
        for i, b in enumerate(options.benchmarks):
            key = f"benchmarks[{i}]"
            files: list[Path] = []
            for j, p in enumerate(b.paths):
                found = resolve_paths(b.model_copy(update={"paths": [p]}), context.pipeline_dir)
                if not found:
                    problems.append((f"{key}.paths[{j}]", f"no file matches {p!r} (relative to {context.pipeline_dir})"))
                for f in found:
                    if file_format(f) is None:
                        problems.append(
                            (
                                f"{key}.paths[{j}]",
                                f"{f.name}: not a benchmark format; allowed: "
                                ".jsonl, .jsonl.gz, .json.gz, .ndjson, .parquet, .csv, .csv.gz",
                            )
                        )
                    else:
                        files.append(f)
            # A field counts as present when the first records of any file have it (AGIEval's sat-*
            # files lack ``answer``, the other files of the same benchmark have it).
            heads: list[dict[str, Any]] = []
            for f in files:
                try:
                    heads.extend(records(f, CHECK_RECORDS))
                except Exception as exc:  # noqa: BLE001 - any read error is a config problem here
                    problems.append((f"{key}.paths", f"cannot read {f}: {exc}"))
            if not heads:
                continue
            seen = sorted({k for r in heads for k in r})[:30]
            wanted = [(f"{key}.fields[{j}]", f) for j, f in enumerate(b.fields)]
            if b.id_field:
                wanted.append((f"{key}.id_field", b.id_field))
            for where, field in wanted:
                if not any(has_field(r, field) for r in heads):
                    problems.append(
                        (
                            where,
                            f"field {field!r} is in none of the first {CHECK_RECORDS} records of "
                            f"{', '.join(x.name for x in files)}; fields there: {seen}",
                        )
                    )
        return problems

    @classmethod
    def aggregates(cls, columns: set[str]) -> list[Aggregate]:
        return contamination_aggregates(columns)

    @classmethod
    def report_sections(cls, columns: set[str]) -> list[ReportSection]:
        return contamination_sections(columns)

    @classmethod
    def output_columns(cls, options: Any, context: CheckContext) -> set[str] | None:
        return set(COLUMNS)

    def applies_to(self, kind: str) -> bool:
        return kind in self.options.kinds

    def _key(self) -> tuple[Any, ...]:
        o: DecontaminateOptions = self.options
        base = Path(self.context.pipeline_dir)
        files = tuple(
            (
                b.name,
                tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in resolve_paths(b, base)),
                tuple(b.fields),
                b.id_field,
            )
            for b in o.benchmarks
        )
        return INDEX_VERSION, files, o.n_word, o.n_char, o.fold_script

    def setup(self) -> None:
        """The index, once per process: from the cache folder when an earlier process (the driver's
        ``prepare``) built it for the same files, options and code, else built and cached."""
        key = self._key()
        if key not in _INDEXES:
            cached = (
                Path(self.context.cache_dir) / "decontaminate" / (hashlib.sha256(repr(key).encode()).hexdigest()[:24] + ".npz")
            )
            index = None
            if cached.is_file():
                try:
                    index = BenchmarkIndex.load(cached)
                except Exception as exc:  # noqa: BLE001 - a damaged cache file (bad zip, missing array) is rebuilt
                    log.warning("decontaminate: ignoring cached index %s: %s", cached, exc)
            if index is None:
                index = self._build()
                try:
                    index.save(cached)
                except OSError as exc:  # a read-only cache only costs time
                    log.warning("decontaminate: cannot cache the index in %s: %s", cached, exc)
            _INDEXES[key] = index
        self.index = _INDEXES[key]

    def _build(self) -> BenchmarkIndex:
        base = Path(self.context.pipeline_dir)
        its = (it for b in self.options.benchmarks for it in items(b.name, resolve_paths(b, base), b.fields, b.id_field))
        index = BenchmarkIndex.build(its, self.options.n_word, self.options.n_char, self.options.fold_script)
        log.info(
            "decontaminate: %d n-gram entries from %d items of %s, %.1f MiB; items too short for an n-gram: %s",
            len(index.keys),
            len(index.item_ids),
            ", ".join(index.benchmarks),
            index.nbytes / 2**20,
            index.too_short,
        )
        return index

    def prepare(self) -> None:
        self.setup()  # fail on the driver, before any task, if a benchmark file cannot be read

    def compute(self, batch: pa.Table) -> pa.Table:
        texts = pc.fill_null(batch["text"], "").to_pylist()
        matches = self.index.match(texts)
        cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
        for text, m in zip(texts, matches):
            cols["contam_hits"].append(m.hits if m else 0)
            cols["contam_benchmark"].append(m.benchmark if m else None)
            cols["contam_item"].append(m.item_id if m else None)
            cols["contam_item_hits"].append(m.item_hits if m else 0)
            cols["contam_frac"].append(round(m.frac, 4) if m else 0.0)
            cols["contam_ngram"].append(self.index.ngram_text(text, m.window) if m else None)
        for c, t in COLUMNS.items():
            batch = set_column(batch, c, pa.array(cols[c], t))
        return batch

    def decide(self, batch: pa.Table) -> Decision:
        o: DecontaminateOptions = self.options
        n = batch.num_rows
        if o.action == "flag":
            return Decision.keep_all(n)
        hits = batch["contam_item_hits"].to_pylist()
        frac = batch["contam_frac"].to_pylist()
        reason: list[str | None] = [None] * n
        detail: list[str | None] = [None] * n
        bench, item, ngram = (batch[c].to_pylist() for c in ("contam_benchmark", "contam_item", "contam_ngram"))
        for i in range(n):
            if hits[i] and hits[i] >= o.min_hits and frac[i] >= o.min_frac:
                reason[i] = "contaminated"
                detail[i] = f"benchmark={bench[i]} item={item[i]} hits={hits[i]} frac={frac[i]:.3f} ngram={ngram[i]!r}"
        return Decision(pa.array(reason, pa.string()), pa.array(detail, pa.string()))


# --- the audit: documents holding benchmark n-grams, per benchmark and source -------------------------


def contamination_aggregates(columns: set[str]) -> list[Aggregate]:
    """Per benchmark, source and benchmark item: documents with n-gram hits, dropped or kept, their
    hits and largest share (an item per row, so the report counts distinct items exactly)."""
    if "contam_hits" not in columns:
        sql = ""
    else:
        sql = f"""SELECT {column(columns, "contam_benchmark")} AS benchmark, {column(columns, "source")} AS source,
                   {column(columns, "contam_item")} AS item, count(*) AS documents,
                   count(*) FILTER ({column(columns, "reason")} = 'contaminated') AS dropped,
                   count(*) FILTER (status = 'kept') AS kept,
                   coalesce(sum(contam_hits), 0)::BIGINT AS ngram_hits,
                   max({column(columns, "contam_frac", "DOUBLE")}) AS max_frac
            FROM documents WHERE contam_hits > 0 GROUP BY ALL"""
    values = ("documents", "dropped", "kept", "ngram_hits")
    return [
        Aggregate(
            "contamination",
            sql,
            (
                ("benchmark", "VARCHAR"),
                ("source", "VARCHAR"),
                ("item", "VARCHAR"),
                *((v, "BIGINT") for v in values),
                ("max_frac", "DOUBLE"),
            ),
            merge={**dict.fromkeys(values, "sum"), "max_frac": "max"},
            order="benchmark, source, item",
        )
    ]


def contamination_sections(columns: set[str]) -> list[ReportSection]:
    if "contam_hits" not in columns:
        return []
    return [
        ReportSection(
            "Benchmark contamination",
            """SELECT benchmark, source, sum(documents)::BIGINT AS n, sum(dropped)::BIGINT, sum(kept)::BIGINT,
                      count(DISTINCT item), sum(ngram_hits)::BIGINT, round(max(max_frac), 4)
               FROM agg_contamination GROUP BY ALL ORDER BY n DESC, benchmark, source""",
            columns=("benchmark", "source", "documents", "dropped", "kept", "items", "n-gram hits", "max share"),
        )
    ]
