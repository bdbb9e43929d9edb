"""The map task on its own (no Ray): rejects with different column sets land in separate files."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from datapipe.engine.plan import make_spec
from datapipe.engine.tasks.map import _bounded, map_shard
from datapipe.pipeline.load import load_pipeline
from datapipe.readers import READER_SPECS, ReadBatch, reader_spec
from datapipe.schema import BASE_SCHEMA
from tests.conftest import write_pipeline


def test_reader_rejects_and_missing_text_rejects_with_other_columns_are_all_kept(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "x"}) + "\n")
    pipeline = load_pipeline(write_pipeline(tmp_path, {"name": "t", "sources": [{"name": "s", "paths": ["a.jsonl"]}]}))
    spec = make_spec(pipeline, tmp_path / "out", tmp_path / "cache")

    def reader(file, batch_size):  # docs carry a provenance column; a bad record has only the base ones
        docs = pa.table(
            {
                "id": ["s/a#1", "s/a#2"],
                "source": ["s", "s"],
                "kind": ["text", "text"],
                "text": ["kept text", None],
                "url": [None, None],
                "path": ["a", "a"],
                "domain": ["example.org", "example.org"],
            }
        )
        bad = pa.Table.from_pylist(
            [
                {
                    "id": "s/a#3",
                    "source": "s",
                    "kind": "text",
                    "text": "{bro",
                    "url": None,
                    "path": "a",
                    "reason": "malformed_json",
                    "detail": "cut",
                }
            ],
            schema=BASE_SCHEMA.append(pa.field("reason", pa.string())).append(pa.field("detail", pa.string())),
        )
        yield ReadBatch(docs, bad)

    with READER_SPECS.override(replace(reader_spec("jsonl"), read=reader)):
        marker = map_shard(spec, spec.shards[0], spec.segments[0])
    assert marker["docs_in"] == 3 and marker["kept"] == 1
    assert marker["rejected"] == {"0": {"malformed_json": 1, "missing_text": 1}}
    files = sorted((tmp_path / "out" / "rejected").glob("**/*.parquet"))
    assert len(files) == 2  # one per column set, none dropped or truncated
    rows = {r["id"]: r for f in files for r in pq.read_table(f).to_pylist()}
    assert rows["s/a#3"]["reason"] == "malformed_json" and rows["s/a#2"]["reason"] == "missing_text"
    assert rows["s/a#2"]["domain"] == "example.org"


def test_long_batches_are_cut_by_text_size_keeping_every_document_in_order() -> None:
    texts = ["aaaa", "bb", None, "cccccc", "d", "e" * 11]
    table = pa.table({"text": texts, "n": list(range(len(texts)))})
    parts = list(_bounded(iter([table]), 6))
    assert [p["n"].to_pylist() for p in parts] == [[0, 1, 2], [3], [4], [5]]  # a too-long document stays whole
    assert pa.concat_tables(parts).equals(table)
    assert list(_bounded(iter([table]), 1000)) == [table]  # small batches pass as they are


def test_tokenizing_batches_cut_smaller_give_the_same_documents_and_tokens(tmp_path: Path, monkeypatch) -> None:
    """A tokenizing segment cuts its batches at MAX_TOKENIZE_BATCH_TEXT_BYTES (smaller than other
    segments', for worker memory): where batches are cut must not change any kept document, any
    token, or the order, on real zh and en pages."""
    import pyarrow.ipc as ipc

    from datapipe.engine.tasks import map as map_task
    from tests.support.shared_data import PROJECT_ROOT, shared_path

    lines = []
    for name in ("zh_pingcap_docs.jsonl", "en_wikipedia.jsonl"):
        with shared_path("corpus", name).open(encoding="utf-8") as f:
            lines += [line for _, line in zip(range(40), f)]
    (tmp_path / "in.jsonl").write_text("".join(lines), encoding="utf-8")
    config = {
        "name": "t",
        "sources": [{"name": "web", "kind": "web", "paths": ["in.jsonl"]}],
        "tokenize": {"tokenizer": str(PROJECT_ROOT / "tokenizer" / "demo.json"), "seq_len": 256},
    }
    pipeline = load_pipeline(write_pipeline(tmp_path, config))

    def run(out: str) -> tuple[pa.Table, pa.Table, int]:
        spec = make_spec(pipeline, tmp_path / out, tmp_path / "cache")
        (segment,) = spec.segments
        assert map_shard(spec, spec.shards[0], segment)["kept"] > 0
        docs = [pq.ParquetFile(f) for f in sorted((tmp_path / out / "docs").glob("**/*.parquet"))]
        tokens = [ipc.open_file(str(f)).read_all() for f in sorted((tmp_path / out).glob("_work/**/*.arrow"))]
        return (pa.concat_tables([d.read() for d in docs]), pa.concat_tables(tokens), sum(d.num_row_groups for d in docs))

    docs, tokens, groups = run("default")
    monkeypatch.setattr(map_task, "MAX_TOKENIZE_BATCH_TEXT_BYTES", 8 << 10)
    small_docs, small_tokens, small_groups = run("small")
    assert small_groups > groups >= 1  # the small bound really cut the documents into more batches
    assert small_docs.equals(docs) and small_tokens.equals(tokens) and tokens.num_rows == docs.num_rows
