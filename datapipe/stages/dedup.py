"""Exact deduplication across the whole run by a hash of the normalized text.

Normalization (NFKC, lower case, whitespace collapsed) makes full-width/half-width
and spacing variants count as copies. The survivor of each group is the earliest
document in the run's order (source order, then input file, then record), so the
outcome does not depend on how tasks were scheduled.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from datapipe.stages.base import CheckContext, GlobalStage, ReduceInputs, Resources, StageOptions
from datapipe.stages.columns import set_column

HASH_TYPE = pa.binary(16)


class DedupOptions(StageOptions):
    exact: bool = Field(True, description="Drop documents whose normalized text equals an earlier one's.")
    url: bool = Field(False, description="Also drop web pages whose normalized URL an earlier kept page has.")

    @model_validator(mode="after")
    def _some_method(self) -> DedupOptions:
        if not (self.exact or self.url):
            raise ValueError("set exact: true and/or url: true (near-duplicates: the minhash stage)")
        return self


def normalize_for_hash(text: pa.ChunkedArray | pa.Array) -> pa.Array:
    text = pc.utf8_normalize(pc.fill_null(text, ""), "NFKC")
    text = pc.utf8_lower(text)
    return pc.utf8_trim_whitespace(pc.replace_substring_regex(text, r"\s+", " "))


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
    normalized = normalize_for_hash(text)
    digests = [hashlib.blake2b(t.encode(), digest_size=16).digest() for t in normalized.to_pylist()]
    return pa.array(digests, HASH_TYPE)


class ExactDedup(GlobalStage):
    name = "dedup"
    Options = DedupOptions
    resources = Resources(num_cpus=1, memory_mb=1024)
    signal_columns = ("text_hash",)

    @classmethod
    def output_columns(cls, options: DedupOptions, context: CheckContext) -> set[str] | None:
        return {"text_hash", "url_key"} if options.url else {"text_hash"}

    def compute(self, batch: pa.Table) -> pa.Table:
        batch = set_column(batch, "text_hash", text_hashes(batch["text"]))
        if self.options.url:
            batch = set_column(batch, "url_key", url_keys(batch["url"]))
        return batch

    def reduce(self, inputs: ReduceInputs) -> pa.Table:
        import duckdb

        con = duckdb.connect()
        try:
            # DuckDB spills to disk beyond its memory limit: bounded memory at any corpus size.
            con.execute(f"SET memory_limit='{inputs.memory_limit_mb}MB'")
            con.execute("SET temp_directory=?", [inputs.scratch_dir])
            con.execute("SET preserve_insertion_order=false")
            files = pa.table({"filename": inputs.files, "shard": pa.array(inputs.shards, pa.int32())})
            con.register("shard_files", files)
            return con.sql(_reduce_query(self.options.exact, self.options.url),
                           params={"files": inputs.files}).to_arrow_table()
        finally:
            con.close()


def _reduce_query(exact: bool, url: bool) -> str:
    """Survivor = earliest in run order (shard, row). URL dedup runs among exact survivors,
    so a page is never dropped in favour of one that was itself dropped."""
    text_rank = "row_number() OVER (PARTITION BY text_hash ORDER BY shard, row)" if exact else "1"
    text_survivor = "first_value(id) OVER (PARTITION BY text_hash ORDER BY shard, row)" if exact else "id"
    url_column = "f.url_key" if url else "NULL::VARCHAR AS url_key"
    return f"""
        WITH docs AS (
            SELECT f.id, f.text_hash, {url_column}, s.shard, f.file_row_number AS row
            FROM read_parquet($files, filename=true, file_row_number=true, union_by_name=true) f
            JOIN shard_files s USING (filename)
        ), by_text AS (
            SELECT *, {text_rank} AS text_rank, {text_survivor} AS text_survivor FROM docs
        ), by_url AS (
            SELECT *,
                   CASE WHEN text_rank = 1 AND url_key IS NOT NULL THEN
                        row_number() OVER (PARTITION BY (text_rank = 1), url_key ORDER BY shard, row) END AS url_rank,
                   CASE WHEN text_rank = 1 AND url_key IS NOT NULL THEN
                        first_value(id) OVER (PARTITION BY (text_rank = 1), url_key ORDER BY shard, row) END
                        AS url_survivor
            FROM by_text
        )
        SELECT id, shard,
               CASE WHEN text_rank > 1 THEN 'exact_duplicate' ELSE 'duplicate_url' END AS reason,
               CASE WHEN text_rank > 1 THEN 'same normalized text as ' || text_survivor
                    ELSE 'same URL as ' || url_survivor END AS detail,
               CASE WHEN text_rank > 1 THEN text_survivor ELSE url_survivor END AS dup_of
        FROM by_url WHERE text_rank > 1 OR url_rank > 1
        ORDER BY shard, row
    """
