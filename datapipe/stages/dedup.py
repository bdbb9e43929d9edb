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

from datapipe.stages.base import GlobalStage, ReduceInputs, Resources, StageOptions
from datapipe.stages.columns import set_column

HASH_TYPE = pa.binary(16)


class DedupOptions(StageOptions):
    exact: bool = Field(True, description="Drop documents whose normalized text equals an earlier one's.")

    @model_validator(mode="after")
    def _some_method(self) -> DedupOptions:
        if not self.exact:
            raise ValueError("exact is the only dedup method so far; set exact: true or remove the stage")
        return self


def normalize_for_hash(text: pa.ChunkedArray | pa.Array) -> pa.Array:
    text = pc.utf8_normalize(pc.fill_null(text, ""), "NFKC")
    text = pc.utf8_lower(text)
    return pc.utf8_trim_whitespace(pc.replace_substring_regex(text, r"\s+", " "))


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

    def compute(self, batch: pa.Table) -> pa.Table:
        return set_column(batch, "text_hash", text_hashes(batch["text"]))

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
            return con.sql(
                """
                WITH docs AS (
                    SELECT f.id, f.text_hash, s.shard, f.file_row_number AS row
                    FROM read_parquet($files, filename=true, file_row_number=true) f
                    JOIN shard_files s USING (filename)
                ), ranked AS (
                    SELECT id, shard, row,
                           first_value(id) OVER w AS survivor,
                           row_number() OVER w AS rank
                    FROM docs
                    WINDOW w AS (PARTITION BY text_hash ORDER BY shard, row)
                )
                SELECT id, shard, 'exact_duplicate' AS reason,
                       'same normalized text as ' || survivor AS detail, survivor AS dup_of
                FROM ranked WHERE rank > 1 ORDER BY shard, row
                """,
                params={"files": inputs.files},
            ).to_arrow_table()
        finally:
            con.close()
