"""Cross-document boilerplate removal: lines (or paragraphs) repeated across many documents go.

Navigation, footers, cookie banners and SEO templates are the same line on every page of a
site; an article's sentences are not. So a normalised line seen in at least ``min_docs``
documents of the run is removed from every document that has it (with ``keep_first``, except
the earliest in run order). This is CCNet's and Dolma's line/paragraph dedup and the
"min-repetition-threshold" of BigScience's ROOTS line dedup, counted over the whole run.

Normalisation (``normalize_units``, Arrow kernels) does not split on spaces, so Chinese lines
work: NFKC, lower case, every digit folded to 0, and whitespace, punctuation and symbols removed.
A unit whose normalised form is shorter than ``min_unit_chars`` or only digits is never counted
(blank and one-character lines, bullets, separators, "12." list counters). Markup is never counted
(``markup_units``, ``datapipe/text/markup.py``): code fences and the lines inside code blocks,
display math and its lines, table rows, HTML tag lines; normalised, an opening "```sql" is the
frequent line "sql" while its bare closing fence never counts, so removing it broke the page.

Engine steps (``steps()``):

- map: per document, the 64-bit hashes (FNV-1a, numba) of its distinct counted units, shuffled by hash into
  ``partitions`` (20 bytes per distinct unit per document, written per shard);
- partition task: counts documents per hash, keeps only the hashes reaching ``min_docs``
  (with the earliest document's row key for ``keep_first``);
- combine: the frequent hashes of all partitions = the state every map task of the next
  segment loads whole. **Memory bound**: 24 bytes per distinct frequent unit (not per
  document): at most (unit occurrences in the run) / min_docs entries, in practice the
  templates of the sites crawled. A partition task holds its share of (hash, document) pairs,
  like minhash's band keys.
- next map segment (``apply``): units whose hash is frequent are removed; ``lines_removed``,
  ``chars_removed`` and ``removed_lines`` are recorded; a document left with fewer than
  ``min_chars_after`` characters is dropped as ``boilerplate_only`` with its original text.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datapipe.dedup.minhash import partition_of
from datapipe.stages.base import CheckContext, Decision, Problem, Resources, StageOptions, kinds_problems
from datapipe.stages.columns import set_column
from datapipe.stages.global_stage import CombineStep, GlobalStage, GlobalStep, PartitionStep, ReduceInputs, no_drops
from datapipe.stages.report_section import Aggregate, ReportSection, column
from datapipe.stages.steps import Partitions, partitions_option
from datapipe.text.markup import structure_lines

# Why 10: a template line is on every page of its site (hundreds in a crawl), an article sentence
# is rarely verbatim in more than a few documents (quotes, syndicated copies that minhash handles).
# BigScience ROOTS' line dedup used a minimum repetition of 10; CCNet removes any repeat but only
# within a ~5 GB shard, which over a whole run would eat quoted sentences and common headings.
DEFAULT_MIN_DOCS = 10
# The audit keeps at most this many removed lines per document, each cut to REMOVED_LINE_CHARS:
# enough to see (and GROUP BY) what went without copying a page's worth of text into stats.duckdb.
MAX_REMOVED_LISTED = 32
REMOVED_LINE_CHARS = 100

# Separators: ASCII classes only, so Python's re and Arrow's RE2 split a text identically.
_LINE_SEP = "\n"
_PARA_SEP = "\n[ \t\r\f\v]*\n[ \t\n\r\f\v]*"
_PARA_SPLIT = re.compile(f"({_PARA_SEP})")
_FNV_OFFSET, _FNV_PRIME = 14695981039346656037, 1099511628211
REMOVED_TYPE = pa.list_(pa.string())


class BoilerplateOptions(StageOptions):
    unit: Literal["line", "paragraph"] = Field("line", description="Count lines, or paragraphs (blank-line separated).")
    min_docs: int = Field(DEFAULT_MIN_DOCS, ge=2, description="Remove a unit seen in at least this many documents.")
    keep_first: bool = Field(False, description="Keep the unit in the earliest document (run order) that has it.")
    min_unit_chars: int = Field(2, ge=1, description="Units shorter than this once normalised are never counted.")
    min_chars_after: int = Field(
        50,
        ge=0,
        description="Drop a document left shorter than this (boilerplate_only); only documents that lost a unit are judged.",
    )
    keep_headings: bool = Field(
        False,
        description="Never remove headings: Markdown headings and short title-like lines "
        "('References.', 'Early life', '第五条'), which repeat across the articles of one wiki.",
    )
    kinds: list[str] = Field(
        ["web", "text"], description="Source kinds it applies to (code keeps its license headers and imports)."
    )
    partitions: Partitions = partitions_option("Parallel tasks of the shuffle")


def normalize_units(units: pa.Array) -> pa.Array:
    """NFKC, lower case, every decimal digit -> 0, all but letters, marks and numbers removed.

    No word splitting (Chinese lines have no spaces); Arrow kernels, so a batch costs no Python
    per line."""
    text = pc.utf8_lower(pc.utf8_normalize(units, "NFKC"))
    text = pc.replace_substring_regex(text, r"[^\p{L}\p{M}\p{N}]+", "")
    return pc.replace_substring_regex(text, r"\p{Nd}", "0")


def normalize_unit(unit: str) -> str:
    return normalize_units(pa.array([unit], pa.string()))[0].as_py()


def split_units(text: str, unit: str) -> list[str]:
    """Units and separators alternating: [u0, s0, u1, s1, ..., un]; ''.join gives the text back."""
    if unit == "line":
        parts = text.split(_LINE_SEP)
        out = [_LINE_SEP] * (2 * len(parts) - 1)
        out[::2] = parts
        return out
    return _PARA_SPLIT.split(text)


def _fnv1a(data: np.ndarray, offsets: np.ndarray, out: np.ndarray) -> None:
    # FNV-1a over each unit's UTF-8 bytes: 64 bits (a collision needs ~4e9 distinct frequent units).
    for i in range(len(out)):
        h = np.uint64(_FNV_OFFSET)
        for j in range(offsets[i], offsets[i + 1]):
            h = (h ^ np.uint64(data[j])) * np.uint64(_FNV_PRIME)
        out[i] = h


try:
    from datapipe.runtime.jit import arr, lazy_numba

    numba = lazy_numba()
    _fnv1a_kernel = numba.njit(cache=True, nogil=True, warm=[(arr("uint8"), arr("int64"), arr("uint64"))])(_fnv1a)
except ImportError:  # pragma: no cover - numba is a dependency; the slow path keeps the module importable
    _fnv1a_kernel = _fnv1a


def hash_strings(values: pa.Array) -> np.ndarray:
    """uint64 FNV-1a of each (non-null) string."""
    arr = (
        pc.cast(values, pa.large_string()).combine_chunks()
        if isinstance(values, pa.ChunkedArray)
        else pc.cast(values, pa.large_string())
    )
    out = np.empty(len(arr), np.uint64)
    if len(arr) == 0:
        return out
    offsets = np.frombuffer(arr.buffers()[1], np.int64, len(arr) + 1, arr.offset * 8)
    data = np.frombuffer(arr.buffers()[2], np.uint8) if arr.buffers()[2] is not None else np.empty(0, np.uint8)
    _fnv1a_kernel(data, offsets, out)
    return out


# A heading line (``keep_headings``): a Markdown ATX heading, or a short title-like line: it starts
# with a capital letter, a digit or a CJK character, holds only letters, digits, spaces and the
# punctuation of titles, ends with at most a period or colon, and has at most 6 words (one space
# between words: a menu's items are set apart by runs of spaces or separators). Wikipedia's plain
# text ends its section titles with a period ("References.", "Early life.").
_MD_HEADING = r"^ {0,3}#{1,6}[ \t]+\S"
_TITLE_LINE = r"^[ \t]*[\p{Lu}\p{Lt}\p{Lo}\p{N}][\p{L}\p{M}\p{N}'’&/,() -]*[.:：]?[ \t\r]*$"
_HEADING_MAX_CHARS = 60
_HEADING_MAX_WORDS = 6


def heading_units(units: pa.Array) -> np.ndarray:
    """Which units are a heading (see ``_TITLE_LINE``); a paragraph unit is one only when it is one line."""
    short = pc.less_equal(pc.utf8_length(units), _HEADING_MAX_CHARS)
    title = pc.and_(
        pc.and_(short, pc.match_substring_regex(units, _TITLE_LINE)),
        pc.and_(
            pc.invert(pc.match_substring(units, "  ")),
            pc.less(pc.count_substring(pc.utf8_trim_whitespace(units), " "), _HEADING_MAX_WORDS),
        ),
    )
    markdown = pc.and_(pc.match_substring_regex(units, _MD_HEADING), pc.invert(pc.match_substring(units, "\n")))
    return pc.fill_null(pc.or_(title, markdown), False).to_numpy(zero_copy_only=False)


def batch_unit_hashes(
    texts: pa.Array | pa.ChunkedArray, unit: str, min_chars: int, keep_headings: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every unit of every text: (document index, position of the unit in its text, hash).

    Only counted units are returned: normalised at least ``min_chars`` long and not only digits
    (a number alone, "12." or "2024", is a list or article counter, not a template), not markup,
    and with ``keep_headings`` not a heading."""
    texts = pc.fill_null(texts, "")
    parts = pc.split_pattern(texts, _LINE_SEP) if unit == "line" else pc.split_pattern_regex(texts, _PARA_SEP)
    if isinstance(parts, pa.ChunkedArray):
        parts = parts.combine_chunks()
    units = parts.flatten()
    doc = pc.list_parent_indices(parts).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = parts.offsets.to_numpy()
    pos = np.arange(len(units), dtype=np.int64) - (offsets[doc] - offsets[0])
    norm = normalize_units(units)
    counted = pc.and_(
        pc.greater_equal(pc.utf8_length(norm), min_chars), pc.greater(pc.utf8_length(pc.replace_substring(norm, "0", "")), 0)
    )
    keep = counted.to_numpy(zero_copy_only=False) & ~markup_units(units, doc, unit)
    if keep_headings:
        keep &= ~heading_units(units)
    return doc[keep], pos[keep], hash_strings(norm.filter(pa.array(keep)))


def markup_units(units: pa.Array, doc: np.ndarray, unit: str) -> np.ndarray:
    """Units that are (or hold a line of) Markdown or LaTeX structure: never counted, so never removed.

    Normalised, an opening fence "```sql" is "sql", among the most frequent lines of any
    documentation site, while its bare closing "```" never counts; the same for
    ``\\begin{aligned}``. Removing such lines unbalances the markup of the documents kept
    (``datapipe/text/markup.py`` says which lines are structure)."""
    if unit == "line":
        return structure_lines(units, doc)
    lines = pc.split_pattern(units, _LINE_SEP)  # a paragraph's lines; the blank lines are its separators
    line_unit = pc.list_parent_indices(lines).to_numpy(zero_copy_only=False).astype(np.int64)
    first = np.ones(len(line_unit), bool)
    first[1:] = line_unit[1:] != line_unit[:-1]
    marked = structure_lines(lines.flatten(), doc[line_unit], block_start=first)
    return np.bincount(line_unit[marked], minlength=len(units)) > 0


def strip_units(text: str, unit: str, drop: set[int]) -> tuple[str, list[str]]:
    """The text without the units at positions ``drop``, and the removed units.

    A removed unit goes with the separator after it (the one before it when it is last), so no
    blank lines pile up where a footer was."""
    parts = split_units(text, unit)
    units, seps = parts[::2], parts[1::2]
    out: list[str] = []
    removed: list[str] = []
    for i, u in enumerate(units):
        if i in drop:
            removed.append(u)
            continue
        if out:
            out.append(seps[i - 1])
        out.append(u)
    return "".join(out), removed


class Boilerplate(GlobalStage):
    name = "boilerplate"
    summary = "removes lines or paragraphs repeated across many documents"
    signals = "`lines_removed`, `chars_removed`, `removed_lines` (the lines it took out of the text)"
    reasons = ("boilerplate_only",)
    Options = BoilerplateOptions
    resources = Resources(num_cpus=1, memory_mb=1024)

    def edits(self) -> dict[str, str]:
        return {"lines_removed": f"{self.options.unit}s removed", "chars_removed": "chars removed"}

    @classmethod
    def check(cls, options: Any, context: CheckContext) -> list[Problem]:
        return kinds_problems(options.kinds)

    @classmethod
    def aggregates(cls, columns: set[str]) -> list[Aggregate]:
        return boilerplate_aggregates(columns)

    @classmethod
    def report_sections(cls, columns: set[str]) -> list[ReportSection]:
        return boilerplate_sections(columns)

    @classmethod
    def output_columns(cls, options: Any, context: CheckContext) -> set[str] | None:
        return {"lines_removed", "chars_removed", "removed_lines"}

    def steps(self) -> tuple[GlobalStep, ...]:
        """Partitions count documents per unit hash; the combine step drops no document, it gathers the
        frequent hashes as the state every next map task loads whole (``apply`` removes the units)."""
        return (
            PartitionStep(
                self.partitions, self.shuffle, self.reduce_partition, round_names=(f"counting repeated {self.options.unit}s",)
            ),
            CombineStep(no_drops, self.combine_state, name=f"gathering the repeated {self.options.unit}s"),
        )

    def applies_to(self, kind: str) -> bool:
        return kind in self.options.kinds

    def _applies(self, batch: pa.Table) -> np.ndarray:
        return pc.is_in(batch["kind"], value_set=pa.array(self.options.kinds or [""])).to_numpy(zero_copy_only=False)

    def shuffle(self, batch: pa.Table, first_row_key: int) -> pa.Table:
        o = self.options
        rows = np.flatnonzero(self._applies(batch))
        doc, _, keys = batch_unit_hashes(batch["text"].take(pa.array(rows)), o.unit, o.min_unit_chars, o.keep_headings)
        # Distinct units per document: the count is of documents, not of repeats inside one.
        pairs = (
            np.unique(np.stack([rows[doc] + first_row_key, keys.view(np.int64)], axis=1), axis=0)
            if len(keys)
            else np.empty((0, 2), np.int64)
        )
        key_arr = pairs[:, 1].view(np.uint64)
        return pa.table(
            {
                "part": pa.array(partition_of(key_arr, self.partitions).astype(np.int32)),
                "doc": pa.array(pairs[:, 0]),
                "key": pa.array(key_arr),
            }
        )

    def reduce_partition(self, rows: pa.Table, round: int = 0, inputs: ReduceInputs | None = None) -> pa.Table:
        keys = rows["key"].to_numpy()
        docs = rows["doc"].to_numpy()
        order = np.lexsort((docs, keys))  # by key, then run order: the first row of a key is its earliest doc
        keys, docs = keys[order], docs[order]
        uniq, start, count = np.unique(keys, return_index=True, return_counts=True)
        frequent = count >= self.options.min_docs
        return pa.table(
            {
                "key": pa.array(uniq[frequent]),
                "first": pa.array(docs[start[frequent]]),
                "n_docs": pa.array(count[frequent].astype(np.int64)),
            }
        )

    def combine_state(self, partition_outputs: list[str], inputs: ReduceInputs) -> pa.Table:
        import pyarrow.parquet as pq

        schema = pa.schema([("key", pa.uint64()), ("first", pa.int64()), ("n_docs", pa.int64())])
        if not partition_outputs:
            return schema.empty_table()
        state = pa.concat_tables([pq.read_table(p).cast(schema) for p in partition_outputs])
        return state.sort_by([("key", "ascending")])

    def apply(self, batch: pa.Table, row_keys: np.ndarray, state: pa.Table | None) -> tuple[pa.Table, Decision]:
        o = self.options
        n = batch.num_rows
        keys = state["key"].to_numpy() if state is not None and state.num_rows else np.empty(0, np.uint64)
        first = state["first"].to_numpy() if state is not None and state.num_rows else np.empty(0, np.int64)
        texts = batch["text"].to_pylist()
        applies = self._applies(batch)
        new_texts: list[str | None] = list(texts)
        lines_removed = np.zeros(n, np.int64)
        chars_removed = np.zeros(n, np.int64)
        removed_lists: list[list[str] | None] = [None] * n
        reason: list[str | None] = [None] * n
        detail: list[str | None] = [None] * n
        rows = np.flatnonzero(applies)
        if len(keys) and len(rows):
            doc, pos, hs = batch_unit_hashes(batch["text"].take(pa.array(rows)), o.unit, o.min_unit_chars, o.keep_headings)
            j = np.minimum(np.searchsorted(keys, hs), len(keys) - 1)
            hit = keys[j] == hs
            doc = rows[doc]
            if o.keep_first:  # the earliest document with the unit keeps it
                hit &= first[j] != np.asarray(row_keys, np.int64)[doc]
            doc, pos = doc[hit], pos[hit]
        else:
            doc = pos = np.empty(0, np.int64)
        # Python only for the documents that lose something: rebuild their text.
        bounds = np.flatnonzero(np.diff(doc)) + 1
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(doc)]):
            if hi <= lo:
                continue
            i = int(doc[lo])
            text, removed = strip_units(texts[i], o.unit, set(pos[lo:hi].tolist()))
            lines_removed[i] = len(removed)
            chars_removed[i] = len(texts[i]) - len(text)
            removed_lists[i] = [r[:REMOVED_LINE_CHARS] for r in removed[:MAX_REMOVED_LISTED]]
            if len(text.strip()) < o.min_chars_after:
                reason[i] = "boilerplate_only"
                detail[i] = (
                    f"{len(removed)} {o.unit}s repeated in >= {o.min_docs} documents removed, "
                    f"{len(text.strip())} characters left < min_chars_after {o.min_chars_after}"
                )
            else:
                new_texts[i] = text  # a dropped document keeps its original text in rejected/
        batch = set_column(batch, "text", pa.array(new_texts, pa.string()))
        if "n_chars" in batch.column_names:  # the length of what is kept, as every later stage sees it
            batch = set_column(batch, "n_chars", pa.array([len(t) if t is not None else 0 for t in new_texts], pa.int64()))
        skipped = ~applies  # null, not 0, for documents of kinds the stage does not judge
        batch = set_column(batch, "lines_removed", pa.array(lines_removed, mask=skipped))
        batch = set_column(batch, "chars_removed", pa.array(chars_removed, mask=skipped))
        batch = set_column(batch, "removed_lines", pa.array(removed_lists, REMOVED_TYPE))
        return batch, Decision(pa.array(reason, pa.string()), pa.array(detail, pa.string()))


# --- the audit: what the stage removed, per source, and the lines removed most often -------------------


def boilerplate_aggregates(columns: set[str]) -> list[Aggregate]:
    if "lines_removed" not in columns:
        per_source = ""
        lines = ""
    else:
        # n_chars is the length after removal, except on a boilerplate_only reject, which kept what came in.
        reason = column(columns, "reason")  # a task that rejected nothing has no such column
        per_source = f"""SELECT {column(columns, "source")} AS source,
                   count(*) FILTER (lines_removed IS NOT NULL) AS documents, count(*) FILTER (lines_removed > 0) AS changed,
                   coalesce(sum(lines_removed), 0)::BIGINT AS lines_removed,
                   coalesce(sum(chars_removed), 0)::BIGINT AS chars_removed,
                   coalesce(sum(n_chars + CASE WHEN {reason} = 'boilerplate_only' THEN 0 ELSE coalesce(chars_removed, 0) END)
                            FILTER (lines_removed IS NOT NULL), 0)::BIGINT AS chars_before,
                   count(*) FILTER ({reason} = 'boilerplate_only') AS only_boilerplate
            FROM documents GROUP BY ALL"""
        lines = """SELECT trim(line) AS line, count(*) AS documents
                   FROM (SELECT unnest(removed_lines) AS line FROM documents) GROUP BY 1"""
    values = ("documents", "changed", "lines_removed", "chars_removed", "chars_before", "only_boilerplate")
    return [
        Aggregate(
            "boilerplate",
            per_source,
            (("source", "VARCHAR"), *((v, "BIGINT") for v in values)),
            merge=dict.fromkeys(values, "sum"),
            order="source",
        ),
        # Every line removed from some document: the report shows the most frequent; the table keeps 1,000.
        Aggregate(
            "boilerplate_lines",
            lines,
            (("line", "VARCHAR"), ("documents", "BIGINT")),
            merge={"documents": "sum"},
            order="documents DESC, line",
            limit=1000,
        ),
    ]


def boilerplate_sections(columns: set[str]) -> list[ReportSection]:
    if "lines_removed" not in columns:
        return []
    return [
        ReportSection(
            "Boilerplate removed",
            """SELECT source, documents, changed, lines_removed, chars_removed, round(chars_removed / nullif(chars_before, 0), 4),
                      only_boilerplate FROM agg_boilerplate WHERE documents > 0 ORDER BY source""",
            columns=(
                "source",
                "documents",
                "that lost lines",
                "lines removed",
                "characters removed",
                "share of characters",
                "dropped as boilerplate only",
            ),
        ),
        ReportSection(
            "",
            "SELECT left(line, 100), documents FROM agg_boilerplate_lines ORDER BY documents DESC, line LIMIT 15",
            columns=("most removed line (first 100 characters)", "documents"),
        ),
    ]
