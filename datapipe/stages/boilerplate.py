"""Cross-document boilerplate removal: lines (or paragraphs) repeated across many documents go.

Navigation, footers, cookie banners and SEO templates are the same line on every page of a
site; an article's sentences are not. So a normalised line seen in at least ``min_docs``
documents of the run is removed from every document that has it (with ``keep_first``, except
the earliest in run order). This is CCNet's and Dolma's line/paragraph dedup and the
"min-repetition-threshold" of BigScience's ROOTS line dedup, counted over the whole run.

Normalisation (``normalize_unit``) does not split on spaces, so Chinese lines work: NFKC,
case folding, every digit folded to 0, and whitespace, punctuation and symbols removed.
A unit whose normalised form is shorter than ``min_unit_chars`` or only digits is never counted
(blank and one-character lines, bullets, separators, "12." list counters).

Engine steps (a ``ShuffledGlobalStage``):

- map: per document, the 64-bit hashes of its distinct counted units, shuffled by hash into
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

import hashlib
import re
import unicodedata
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datapipe.dedup.minhash import partition_of
from datapipe.stages.base import (
    CheckContext,
    Decision,
    Problem,
    ReduceInputs,
    Resources,
    ShuffledGlobalStage,
    StageOptions,
    kinds_problems,
)
from datapipe.stages.columns import set_column

# Why 10: a template line is on every page of its site (hundreds in a crawl), an article sentence
# is rarely verbatim in more than a few documents (quotes, syndicated copies that minhash handles).
# BigScience ROOTS' line dedup used a minimum repetition of 10; CCNet removes any repeat but only
# within a ~5 GB shard, which over a whole run would eat quoted sentences and common headings.
DEFAULT_MIN_DOCS = 10
# The audit keeps at most this many removed lines per document, each cut to REMOVED_LINE_CHARS:
# enough to see (and GROUP BY) what went without copying a page's worth of text into stats.duckdb.
MAX_REMOVED_LISTED = 32
REMOVED_LINE_CHARS = 100

_NOT_WORD = re.compile(r"[\W_]+")  # whitespace, punctuation, symbols (Unicode-aware): CJK stays
_DIGIT = re.compile(r"\d")
_PARA_SEP = re.compile(r"(\n[ \t\r\f\v]*\n\s*)")
_LINE_SEP = re.compile(r"(\n)")
REMOVED_TYPE = pa.list_(pa.string())


class BoilerplateOptions(StageOptions):
    unit: Literal["line", "paragraph"] = Field("line", description="Count lines, or paragraphs (blank-line "
                                                                  "separated).")
    min_docs: int = Field(DEFAULT_MIN_DOCS, ge=2, description="Remove a unit seen in at least this many documents.")
    keep_first: bool = Field(False, description="Keep the unit in the earliest document (run order) that has it.")
    min_unit_chars: int = Field(2, ge=1, description="Units shorter than this once normalised are never counted.")
    min_chars_after: int = Field(50, ge=0, description="Drop a document left shorter than this (boilerplate_only); "
                                                       "only documents that lost a unit are judged.")
    kinds: list[str] = Field(["web", "text"], description="Source kinds it applies to (code keeps its "
                                                          "license headers and imports).")
    partitions: int = Field(16, ge=1, le=4096, description="Parallel tasks of the shuffle.")


def normalize_unit(unit: str) -> str:
    """NFKC, case folded, digits folded to 0, whitespace/punctuation/symbols removed (no word split)."""
    text = unicodedata.normalize("NFKC", unit).casefold()
    return _DIGIT.sub("0", _NOT_WORD.sub("", text))


def split_units(text: str, unit: str) -> list[str]:
    """Units and separators alternating: [u0, s0, u1, s1, ..., un]; ''.join gives the text back."""
    return (_LINE_SEP if unit == "line" else _PARA_SEP).split(text)


def unit_hash(normalized: str) -> int:
    # 64 bits: a collision needs ~4e9 distinct frequent lines; blake2b runs at memory speed.
    return int.from_bytes(hashlib.blake2b(normalized.encode(), digest_size=8).digest(), "little")


def unit_hashes(units: list[str], min_chars: int) -> list[int | None]:
    """The hash of each unit (even positions of ``split_units``), None where it is too short to count."""
    out: list[int | None] = []
    for u in units[::2]:
        n = normalize_unit(u)
        # A number alone ("12.", "2024") is a list or article counter, not a template: never counted.
        out.append(unit_hash(n) if len(n) >= min_chars and n.strip("0") else None)
    return out


def strip_units(text: str, unit: str, min_chars: int, remove: Any) -> tuple[str, list[str]]:
    """The text without the units that ``remove`` marks, and the removed units.

    ``remove`` gets the uint64 hashes of the counted units and returns a bool array for them.

    A removed unit goes with the separator after it (the one before it when it is last), so no
    blank lines pile up where a footer was."""
    parts = split_units(text, unit)
    hashes = unit_hashes(parts, min_chars)
    counted = [i for i, h in enumerate(hashes) if h is not None]
    if not counted:
        return text, []
    drop = [False] * len(hashes)
    for i, d in zip(counted, remove(np.array([hashes[i] for i in counted], dtype=np.uint64))):
        drop[i] = bool(d)
    if not any(drop):
        return text, []
    units, seps = parts[::2], parts[1::2]
    out: list[str] = []
    removed: list[str] = []
    for i, u in enumerate(units):
        if drop[i]:
            removed.append(u)
            continue
        if out:
            out.append(seps[i - 1] if i > 0 else "")
        out.append(u)
    return "".join(out), removed


class Boilerplate(ShuffledGlobalStage):
    name = "boilerplate"
    Options = BoilerplateOptions
    resources = Resources(num_cpus=1, memory_mb=1024)

    @classmethod
    def check(cls, options: Any, context: CheckContext) -> list[Problem]:
        return kinds_problems(options.kinds)

    @classmethod
    def output_columns(cls, options: Any, context: CheckContext) -> set[str] | None:
        return {"lines_removed", "chars_removed", "removed_lines"}

    def partitions(self) -> int:
        return self.options.partitions

    def applies_to(self, kind: str) -> bool:
        return kind in self.options.kinds

    def _applies(self, batch: pa.Table) -> np.ndarray:
        return pc.is_in(batch["kind"], value_set=pa.array(self.options.kinds or [""])).to_numpy(zero_copy_only=False)

    def shuffle(self, batch: pa.Table, first_row_key: int) -> pa.Table:
        o = self.options
        docs: list[int] = []
        keys: list[int] = []
        texts = batch["text"].to_pylist()
        for i in np.flatnonzero(self._applies(batch)):
            # Distinct units per document: the count is of documents, not of repeats inside one.
            hs = {h for h in unit_hashes(split_units(texts[i] or "", o.unit), o.min_unit_chars) if h is not None}
            keys.extend(hs)
            docs.extend([first_row_key + int(i)] * len(hs))
        key_arr = np.array(keys, dtype=np.uint64)
        return pa.table({"part": pa.array(partition_of(key_arr, o.partitions).astype(np.int32)),
                         "doc": pa.array(np.array(docs, dtype=np.int64)), "key": pa.array(key_arr)})

    def reduce_partition(self, rows: pa.Table) -> pa.Table:
        keys = rows["key"].to_numpy()
        docs = rows["doc"].to_numpy()
        order = np.lexsort((docs, keys))  # by key, then run order: the first row of a key is its earliest doc
        keys, docs = keys[order], docs[order]
        uniq, start, count = np.unique(keys, return_index=True, return_counts=True)
        frequent = count >= self.options.min_docs
        return pa.table({"key": pa.array(uniq[frequent]), "first": pa.array(docs[start[frequent]]),
                         "n_docs": pa.array(count[frequent].astype(np.int64))})

    def combine(self, partition_outputs: list[str], inputs: ReduceInputs) -> pa.Table:
        return pa.table({"id": pa.array([], pa.string()), "shard": pa.array([], pa.int32())})  # no whole-doc drops

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
        for i in range(n):
            if not applies[i] or texts[i] is None or len(keys) == 0:
                continue
            key = int(row_keys[i])

            def remove(hs: np.ndarray, key: int = key) -> np.ndarray:
                j = np.minimum(np.searchsorted(keys, hs), len(keys) - 1)
                hit = keys[j] == hs
                return hit & (first[j] != key) if o.keep_first else hit

            text, removed = strip_units(texts[i], o.unit, o.min_unit_chars, remove)
            if not removed:
                continue
            lines_removed[i] = len(removed)
            chars_removed[i] = len(texts[i]) - len(text)
            removed_lists[i] = [r[:REMOVED_LINE_CHARS] for r in removed[:MAX_REMOVED_LISTED]]
            if len(text.strip()) < o.min_chars_after:
                reason[i] = "boilerplate_only"
                detail[i] = (f"{len(removed)} {o.unit}s repeated in >= {o.min_docs} documents removed, "
                             f"{len(text.strip())} characters left < min_chars_after {o.min_chars_after}")
            else:
                new_texts[i] = text  # a dropped document keeps its original text in rejected/
        batch = set_column(batch, "text", pa.array(new_texts, pa.string()))
        if "n_chars" in batch.column_names:  # the length of what is kept, as every later stage sees it
            batch = set_column(batch, "n_chars", pa.array([len(t) if t is not None else 0 for t in new_texts],
                                                          pa.int64()))
        skipped = ~applies  # null, not 0, for documents of kinds the stage does not judge
        batch = set_column(batch, "lines_removed", pa.array(lines_removed, mask=skipped))
        batch = set_column(batch, "chars_removed", pa.array(chars_removed, mask=skipped))
        batch = set_column(batch, "removed_lines", pa.array(removed_lists, REMOVED_TYPE))
        return batch, Decision(pa.array(reason, pa.string()), pa.array(detail, pa.string()))

