"""Exact deduplication across the whole run by a hash of the normalized text.

Normalization (NFKC, lower case, whitespace collapsed) makes full-width/half-width
and spacing variants count as copies. The survivor of each group is the earliest
document in the run's order (source order, then input file, then record), so the
outcome does not depend on how tasks were scheduled.

Partitioned by key, so no task holds the corpus: the map phase shuffles (row key, id,
text hash, URL key) by text hash; each partition task keeps the lowest row key of each
hash and drops the rest. URL dedup runs among the text survivors only (a page is never
dropped in favour of one that was itself dropped), so with ``url: true`` a second round
reshuffles the survivors that have a URL by URL key. Each partition writes its own
decisions; there is no combine step.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from datapipe.stages.base import CheckContext, Resources, StageOptions
from datapipe.stages.columns import set_column
from datapipe.stages.global_stage import (
    GlobalStage,
    GlobalStep,
    PartitionResult,
    PartitionStep,
    ReduceInputs,
    drop_rows,
)
from datapipe.stages.quality.text import utf8_buffers
from datapipe.stages.steps import Partitions, partitions_option
from datapipe.text.nfkc import nfkc

HASH_TYPE = pa.binary(16)


class DedupOptions(StageOptions):
    exact: bool = Field(True, description="Drop documents whose normalized text equals an earlier one's.")
    url: bool = Field(False, description="Also drop web pages whose normalized URL an earlier kept page has.")
    partitions: Partitions = partitions_option("Parallel tasks the keys are split across")

    @model_validator(mode="after")
    def _some_method(self) -> DedupOptions:
        if not (self.exact or self.url):
            raise ValueError("set exact: true and/or url: true (near-duplicates: the minhash stage)")
        return self


# RE2's \s is [\t\n\f\r ]: runs of it become one space. Matching only runs of two or more and single
# non-space characters gives the same text (a lone space stays itself) with far fewer replacements.
_WHITESPACE_TO_FOLD = r"[\t\n\f\r ][\t\n\f\r ]+|[\t\n\f\r]"


def normalize_for_hash(text: pa.ChunkedArray | pa.Array) -> pa.Array:
    """NFKC, lower case, whitespace runs folded to one space, trimmed: the text exact dedup compares."""
    text = pc.fill_null(text, "")
    if isinstance(text, pa.ChunkedArray):
        text = text.combine_chunks()
    text = pc.utf8_lower(_nfkc(text))
    return pc.utf8_trim_whitespace(pc.replace_substring_regex(text, _WHITESPACE_TO_FOLD, " "))


def _nfkc(text: pa.Array) -> pa.Array:
    # ASCII text is its own NFKC: only the other rows are normalized, by a per-character map where
    # that equals utf8proc's NFKC (datapipe/text/nfkc.py), else by utf8proc.
    other = pc.invert(pc.string_is_ascii(text))
    if not pc.any(other).as_py():
        return text
    return pc.replace_with_mask(text, other, nfkc(pc.filter(text, other)))


def url_keys(urls: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Lower-cased scheme and host, no fragment, no default port, no trailing slash: the same page."""
    u = pc.utf8_trim_whitespace(urls)
    u = pc.replace_substring_regex(u, r"#.*$", "")
    u = pc.replace_substring_regex(u, r"^[A-Za-z][A-Za-z0-9+.-]*://", "")  # http and https are one page
    parts = pc.extract_regex(u, r"^(?P<host>[^/?]*)(?P<rest>.*)$")
    host = pc.replace_substring_regex(pc.utf8_lower(pc.struct_field(parts, "host")), r":(80|443)$", "")
    rest = pc.struct_field(parts, "rest")
    rest = pc.replace_substring_regex(rest, r"/+$", "")
    key = pc.binary_join_element_wise(host, rest, "")
    return pc.if_else(pc.equal(pc.utf8_length(key), 0), pa.scalar(None, pa.string()), key)


def text_hashes(text: pa.ChunkedArray | pa.Array) -> pa.Array:
    # hashlib per document: no vectorized cryptographic hash exists in pyarrow, and blake2b
    # runs at memory speed; a 128-bit digest makes collisions negligible at any corpus size.
    # Each text's UTF-8 is hashed where Arrow holds it: no Python string made and encoded again.
    data, offsets = utf8_buffers(normalize_for_hash(text))
    view = data.data  # a memoryview of the buffer: slices copy nothing
    bounds = offsets.tolist()
    digests = [hashlib.blake2b(view[a:b], digest_size=16).digest() for a, b in zip(bounds, bounds[1:])]
    return pa.array(digests, HASH_TYPE)


class ExactDedup(GlobalStage):
    name = "dedup"
    summary = "exact duplicates by normalized text, optionally by URL; the earliest copy is kept"
    signals = "`text_hash` (NFKC, lower case, whitespace collapsed); `url_key` with `url: true`"
    reasons = ("exact_duplicate", "duplicate_url")
    Options = DedupOptions
    resources = Resources(num_cpus=1, memory_mb=1024)
    signal_columns = ("text_hash",)

    @classmethod
    def keeps_text(cls, options: DedupOptions) -> bool:
        return True  # decides which copies survive; the text is not touched

    @classmethod
    def output_columns(cls, options: DedupOptions, context: CheckContext) -> set[str] | None:
        return {"text_hash", "url_key"} if options.url else {"text_hash"}

    def compute(self, batch: pa.Table) -> pa.Table:
        batch = set_column(batch, "text_hash", text_hashes(batch["text"]))
        if self.options.url:
            batch = set_column(batch, "url_key", url_keys(batch["url"]))
        return batch

    def steps(self) -> tuple[GlobalStep, ...]:
        """One round per key (text hash, then URL key); each partition writes its own decisions."""
        return (
            PartitionStep(
                self.partitions,
                self.shuffle,
                self.reduce_partition,
                rounds=len(self._round_keys()),
                decides=True,
                round_names=tuple(f"exact copies by {key}" for key in self._round_keys()),
            ),
        )

    def _round_keys(self) -> list[str]:
        return (["text"] if self.options.exact else []) + (["url"] if self.options.url else [])

    def shuffle(self, batch: pa.Table, first_row_key: int) -> pa.Table:
        rows = pa.table(
            {
                "doc": pa.array(first_row_key + np.arange(batch.num_rows, dtype=np.int64)),
                "id": batch["id"].combine_chunks().cast(pa.string()),
            }
        )
        if self.options.exact:
            rows = rows.append_column("text_hash", batch["text_hash"].combine_chunks())
            if self.options.url:
                rows = rows.append_column("url_key", batch["url_key"].combine_chunks())
            return _with_part(rows, "text_hash", self.partitions)
        rows = rows.append_column("url_key", batch["url_key"].combine_chunks())
        rows = rows.filter(pc.is_valid(rows["url_key"]))  # pages without a URL are never URL duplicates
        return _with_part(rows, "url_key", self.partitions)

    def reduce_partition(self, rows: pa.Table, round: int = 0, inputs: ReduceInputs | None = None) -> PartitionResult:
        key = "url_key" if self._round_keys()[round] == "url" else "text_hash"
        # By key, then run order: the first row of each group is the earliest copy, the survivor.
        rows = rows.sort_by([(key, "ascending"), ("doc", "ascending")])
        first, head = _groups(rows[key])
        if key == "url_key":
            return PartitionResult(_dropped(rows, first, head, "duplicate_url", "same URL as "))
        decisions = _dropped(rows, first, head, "exact_duplicate", "same normalized text as ")
        forward = None
        if self.options.url:
            kept = rows.filter(pa.array(first))
            kept = kept.filter(pc.is_valid(kept["url_key"])).select(["doc", "id", "url_key"])
            forward = _with_part(kept, "url_key", self.partitions)
        return PartitionResult(decisions, forward)


def _with_part(rows: pa.Table, key: str, partitions: int) -> pa.Table:
    """Partition by a 64-bit digest of the key (text hashes are digests already)."""
    values = rows[key].combine_chunks()
    if pa.types.is_fixed_size_binary(values.type):
        raw = (
            np.frombuffer(
                values.buffers()[1], dtype=np.uint64, count=2 * len(values), offset=values.offset * values.type.byte_width
            )[0::2]
            if len(values)
            else np.empty(0, np.uint64)
        )
    else:
        raw = np.array(
            [int.from_bytes(hashlib.blake2b(v.encode(), digest_size=8).digest(), "little") for v in values.to_pylist()],
            dtype=np.uint64,
        )
    part = (raw % np.uint64(partitions)).astype(np.int32)
    return pa.table({"part": pa.array(part, pa.int32()), **{c: rows[c] for c in rows.column_names}})


def _groups(keys: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """For sorted keys: whether each row starts its group, and the position of its group's start."""
    n = len(keys)
    first = np.ones(n, dtype=bool)
    if n > 1:
        keys = keys.combine_chunks()
        first[1:] = pc.not_equal(keys.slice(1), keys.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    head = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    return first, head


def _dropped(rows: pa.Table, first: np.ndarray, head: np.ndarray, reason: str, prefix: str) -> pa.Table:
    """Decision rows (id, shard, reason, detail, dup_of) of the non-first rows, in run order."""
    dup = np.flatnonzero(~first)
    survivor = rows["id"].take(pa.array(head[dup])).combine_chunks().cast(pa.string())
    all_docs = rows["doc"].to_numpy()
    docs = all_docs[dup]
    order = np.argsort(docs, kind="stable")
    survivor = survivor.take(pa.array(order))
    return drop_rows(
        docs[order],
        rows["id"].take(pa.array(dup[order])),
        reason,
        pc.binary_join_element_wise(pa.scalar(prefix), survivor, ""),
        dup_of_keys=all_docs[head[dup]][order],
        dup_of=survivor,
    )
