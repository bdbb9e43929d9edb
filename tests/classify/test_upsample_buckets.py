"""Upsampling by classifier bucket (``mixture.<source>.repeat``): one small real run (two tiny fastText
models trained here, their ensemble bucket, minhash's dup_count), then each document's occurrences
counted where a trainer reads them: the loader's epoch, the packed shards, the Megatron, HF, JSONL
and MDS exports; ``stats`` and the report per bucket; the config errors."""

from __future__ import annotations

import json
import struct
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from datapipe.audit.mixture import mixture_report
from datapipe.audit.report import build_report
from datapipe.audit.sql import run_query
from datapipe.cli import main
from datapipe.engine.runner import run_pipeline
from datapipe.export import export
from datapipe.export.documents import _cut_documents
from datapipe.loader import PackedDataset
from datapipe.pipeline.load import ConfigError, load_pipeline
from tests.support.shared_data import PROJECT_ROOT, shared_path
from tests.support.zh_classifiers import train_zh_pair

REPEAT = {"4": 3, "2-3": 2, "0": 0}  # of 5 buckets; bucket 1 (and no bucket) once


def _configured(bucket: int | None) -> int:
    """The test's own reading of REPEAT (not datapipe's)."""
    return {4: 3, 3: 2, 2: 2, 0: 0}.get(bucket, 1) if bucket is not None else 1


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two small zh models with different negatives: TiDB docs and OI-wiki pages against Wikipedia."""
    return train_zh_pair(tmp_path_factory.mktemp("models"))


def _pipeline(folder: Path, models: Path, mixture: dict[str, Any], data: dict[str, str] | None = None) -> Path:
    config = {
        "name": "upsample",
        "sources": [
            {"name": "web_zh", "kind": "web", "paths": [data["web_zh"] if data else "zh.jsonl"]},
            {"name": "wiki_en", "kind": "text", "paths": [data["wiki_en"] if data else "en.jsonl"]},
        ],
        "stages": [
            {"langid": {"keep": ["zh", "en"]}},
            {"minhash": {"threshold": 0.8, "partitions": 2}},
            {
                "classify": {
                    "models": {"qa": {"path": str(models / "qa.bin")}, "qb": {"path": str(models / "qb.bin")}},
                    "kinds": ["web"],
                    "max_chars": 2000,
                    "buckets": {"count": 5},
                }
            },
        ],
        "tokenize": {
            "tokenizer": str(PROJECT_ROOT / "tokenizer" / "demo.json"),
            "seq_len": 128,
            "labels": True,
            "val_fraction": 0.1,
            "rows_per_shard": 16,
        },
        "mixture": mixture,
    }
    path = folder / "upsample.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def run(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("upsample")
    corpus = shared_path("corpus")
    zh = []
    for name in ("zh_oiwiki.jsonl", "zh_pingcap_docs.jsonl"):
        lines = corpus.joinpath(name).read_text(encoding="utf-8").splitlines()[-40:]  # not the models' training head
        zh += [json.loads(x)["text"][:1200] for x in lines]
    zh += zh[:6]  # six exact copies: minhash keeps one of each pair with dup_count 2
    en = [
        json.loads(x)["text"][:800] for x in corpus.joinpath("en_wikipedia.jsonl").read_text(encoding="utf-8").splitlines()[:30]
    ]
    for name, texts in (("zh.jsonl", zh), ("en.jsonl", en)):
        (root / name).write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    mixture = {"web_zh": {"weight": 0.6, "repeat": REPEAT, "rehydrate": True}, "wiki_en": 0.4}
    out = root / "out"
    run_pipeline(
        load_pipeline(_pipeline(root, models, mixture)), output=out, in_process=True, show_progress=False, log=lambda m: None
    )
    return out


@pytest.fixture(scope="module")
def expected(run: Path) -> dict[str, Any]:
    """Each kept document's configured multiplicity (bucket repeat x dup_count for web_zh) and tokens."""
    rows = run_query(
        run, "select id, source, split, bucket_ensemble, dup_count, mixture_repeat from documents where status = 'kept'"
    ).to_pylist()
    tokens = {}
    for f in sorted((run / "_work" / "tokens").rglob("*.arrow")):
        t = pa.ipc.open_file(pa.memory_map(str(f))).read_all()
        tokens.update(zip(t["id"].to_pylist(), (tuple(x) for x in t["tokens"].to_pylist())))
    want: dict[str, int] = {}
    for r in rows:
        want[r["id"]] = _configured(r["bucket_ensemble"]) * (r["dup_count"] or 1) if r["source"] == "web_zh" else 1
        if r["split"] == "val":  # validation keeps the natural distribution: once, or not at all
            want[r["id"]] = min(want[r["id"]], 1)
        assert r["mixture_repeat"] == (want[r["id"]] if r["source"] == "web_zh" else None), r
    by_stream: dict[tuple[str, str], Counter] = {}
    for r in rows:
        by_stream.setdefault((r["source"], r["split"]), Counter())[tokens[r["id"]]] += want[r["id"]]
    return {"rows": rows, "want": want, "tokens": tokens, "streams": by_stream}


def test_the_run_has_every_multiplicity(expected: dict[str, Any]) -> None:
    zh = [expected["want"][r["id"]] for r in expected["rows"] if r["source"] == "web_zh"]
    assert {0, 1, 2, 3, 4} <= set(zh), Counter(zh)  # 4 = bucket 2-3 (2) x dup_count 2, when minhash merged one
    assert any(r["dup_count"] == 2 for r in expected["rows"])


def _shard_documents(run: Path, source: str, split: str) -> list[tuple[int, ...]]:
    m = pq.read_table(run / "shards" / "manifest.parquet").to_pylist()
    paths = sorted(run / r["path"] for r in m if r["source"] == source and r["split"] == split)
    return [tuple(d.tolist()) for d in _cut_documents(iter(paths))]


def test_shards_hold_each_document_its_multiplicity_and_copies_apart(run: Path, expected: dict[str, Any]) -> None:
    for (source, split), want in expected["streams"].items():
        docs = _shard_documents(run, source, split)
        assert Counter(docs) == +want, (source, split)
        where: dict[tuple[int, ...], list[int]] = {}
        for i, d in enumerate(docs):
            where.setdefault(d, []).append(i)
        assert all(min(np.diff(p)) > 1 for p in where.values() if len(p) > 1)  # copies never side by side


def _epoch_rows(run: Path) -> list[bytes]:
    # batch_size 1: an epoch is every row (a larger global batch leaves the last partial one out)
    ds = PackedDataset(run, split="train", batch_size=1, backend="numpy", fields=("input_ids", "labels"))
    rows = []
    for batch in ds:
        full = np.concatenate([batch["input_ids"], batch["labels"][:, -1:]], axis=1)  # labels: the row shifted by one
        rows += [r.tobytes() for r in full]
    assert len(rows) == ds.samples_per_epoch
    return rows


def test_the_loaders_epoch_reads_each_document_its_multiplicity(
    run: Path, expected: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from datapipe.loader import fused

    monkeypatch.setenv("DATAPIPE_LOADER_NUMBA", "0")  # numpy only: compiling the kernels costs seconds here
    # and a cache of the kernels of its own, so that the numpy-only choice ends with this test (the
    # loader's tests that run next in this process still get the compiled kernels)
    monkeypatch.setattr(fused, "_built", {})
    rows = _epoch_rows(run)
    m = pq.read_table(run / "shards" / "manifest.parquet").to_pylist()
    shard_rows: Counter = Counter()
    for r in m:
        if r["split"] == "train":
            table = pa.ipc.open_file(pa.memory_map(str(run / r["path"]))).read_all()
            shard_rows.update(x.tobytes() for x in np.asarray(table["input_ids"].to_pylist(), dtype=np.uint16))
    assert Counter(rows) == shard_rows  # every packed row once an epoch: each document as often as the shards hold it
    assert _epoch_rows(run) == rows  # the same order again


def _megatron_documents(prefix: Path) -> list[tuple[int, ...]]:
    raw = Path(str(prefix) + ".idx").read_bytes()
    n = struct.unpack("<Q", raw[18:26])[0]
    lengths = np.frombuffer(raw, np.int32, n, 34)
    tokens = np.fromfile(str(prefix) + ".bin", np.uint16)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [tuple(tokens[a:b].tolist()) for a, b in zip(bounds[:-1], bounds[1:])]


def test_megatron_hf_jsonl_and_mds_exports_hold_each_document_its_multiplicity(
    run: Path, expected: dict[str, Any], tmp_path: Path
) -> None:
    export(run, "megatron", tmp_path / "megatron")
    hf = export(run, "hf", tmp_path / "hf", columns=["id", "input_ids"])
    export(run, "jsonl", tmp_path / "jsonl", columns=["id"])
    mds = export(run, "mds", tmp_path / "mds", columns=["id", "input_ids"])
    for (source, split), want in expected["streams"].items():
        assert Counter(_megatron_documents(tmp_path / "megatron" / source / f"{split}_text_document")) == +want
        ids: Counter = Counter()
        for f in sorted((tmp_path / "hf" / source).glob(f"{split}-*.arrow")):
            t = pa.ipc.open_stream(pa.memory_map(str(f))).read_all()
            assert all(tuple(x) == expected["tokens"][i] for i, x in zip(t["id"].to_pylist(), t["input_ids"].to_pylist()))
            ids.update(t["id"].to_pylist())
        in_stream = {r["id"]: expected["want"][r["id"]] for r in expected["rows"] if (r["source"], r["split"]) == (source, split)}
        assert ids == +Counter(in_stream)
        lines = [
            json.loads(x)["id"]
            for f in sorted((tmp_path / "jsonl").rglob(f"{source}/{split}*"))
            for x in f.read_text().splitlines()
        ]
        assert Counter(lines) == +Counter(in_stream)
        assert mds.streams[f"{source}/{split}"]["docs"] == sum(in_stream.values()) == hf.streams[f"{source}/{split}"]["docs"]


def test_stats_and_the_report_show_tokens_per_bucket_before_and_after(run: Path, expected: dict[str, Any]) -> None:
    n_tokens = {i: len(t) for i, t in expected["tokens"].items()}
    report = mixture_report(run, budget=1_000_000)
    per_bucket: dict[Any, list[int]] = {}
    for r in expected["rows"]:
        if r["source"] == "web_zh":
            acc = per_bucket.setdefault(r["bucket_ensemble"], [0, 0, 0])
            acc[0] += 1
            acc[1] += n_tokens[r["id"]]
            acc[2] += n_tokens[r["id"]] * expected["want"][r["id"]]
    got = {b: [d, t, after] for source, _, b, d, t, _, after in report.buckets if source == "web_zh"}
    assert got == per_bucket
    assert {b: k for source, _, b, _, _, k, _ in report.buckets} == {b: _configured(b) for b in per_bucket}
    train = {r.source: r.train_tokens for r in report.sources}
    for source in ("web_zh", "wiki_en"):  # what the loader samples: the shards, repeats included
        assert train[source] == sum(
            n_tokens[r["id"]] * expected["want"][r["id"]]
            for r in expected["rows"]
            if (r["source"], r["split"]) == (source, "train")
        )
    assert [r.target for r in report.sources] == pytest.approx([0.6, 0.4])
    stats = CliRunner().invoke(main, ["stats", str(run), "--budget", "1M"])
    assert stats.exit_code == 0 and "Repeats by classifier bucket" in stats.output and "bucket_ensemble=4" in stats.output
    html = build_report(run)
    assert "Repeats by classifier bucket" in html and "<th>tokens before</th>" in html and "<th>tokens after</th>" in html
    doc = next(r for r in expected["rows"] if expected["want"][r["id"]] == 0)
    explained = CliRunner().invoke(main, ["explain", str(run), doc["id"]]).output
    assert (
        f"mixture_repeat=0: left out of the shards and exports (bucket_ensemble={doc['bucket_ensemble']} is in "
        f"mixture.web_zh.repeat.0: 0, x dup_count={doc['dup_count']} (rehydrate))"
    ) in explained, explained
    doc = next(r for r in expected["rows"] if expected["want"][r["id"]] == 4)
    explained = CliRunner().invoke(main, ["explain", str(run), doc["id"]]).output
    assert (
        f"mixture_repeat=4: read 4 times an epoch (bucket_ensemble={doc['bucket_ensemble']} is in "
        "mixture.web_zh.repeat.2-3: 2, x dup_count=2 (rehydrate))"
    ) in explained, explained


@pytest.mark.parametrize(
    ("repeat", "key", "message"),
    [
        ({"3-5": 2}, "mixture.web_zh.repeat.3-5", "bucket 5 is past the last bucket, 4"),
        ({"1-3": 2, "3-4": 3}, "mixture.web_zh.repeat.3-4", "overlaps mixture.web_zh.repeat.1-3"),
        ({"4-2": 2}, "mixture.web_zh.repeat.4-2", "runs backwards"),
        ({"2": -1}, "mixture.web_zh.repeat.2", "a repeat is an integer >= 0"),
        ({"top": 2}, "mixture.web_zh.repeat.top", "not a bucket range"),
        ({"2": 1.5}, "mixture.web_zh.repeat.2", "fractional part"),
    ],
)
def test_repeat_errors_name_the_key(models: Path, tmp_path: Path, repeat: dict, key: str, message: str) -> None:
    data = {"web_zh": str(shared_path("corpus", "zh_oiwiki.jsonl")), "wiki_en": str(shared_path("corpus", "en_wikipedia.jsonl"))}
    path = _pipeline(tmp_path, models, {"web_zh": {"weight": 1, "repeat": repeat}}, data)
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    assert any(p.startswith(key) and message in p for p in info.value.problems), info.value.problems


def test_repeat_needs_a_bucket_that_a_classify_stage_makes(models: Path, tmp_path: Path) -> None:
    data = {"web_zh": str(shared_path("corpus", "zh_oiwiki.jsonl")), "wiki_en": str(shared_path("corpus", "en_wikipedia.jsonl"))}
    path = _pipeline(tmp_path, models, {"web_zh": {"weight": 1, "bucket": "qc", "repeat": {"1": 2}}}, data)
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    assert any(
        p.startswith("mixture.web_zh.bucket: 'qc' is not a classify bucket; allowed: qa, qb, ensemble")
        for p in info.value.problems
    )
    path = _pipeline(tmp_path, models, {"wiki_en": {"weight": 1, "repeat": {"1": 2}}}, data)  # text: classify skips it
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    assert any(
        p.startswith(
            "mixture.wiki_en.repeat: source wiki_en is of kind 'text', which the classify stage making bucket_ensemble skips"
        )
        for p in info.value.problems
    ), info.value.problems
