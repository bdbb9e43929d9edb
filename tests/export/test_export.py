"""Exports of a real run (zh/en Wikipedia through a small pipeline), read back with each format's
own reader: Megatron-Core's IndexedDataset, Hugging Face datasets, MosaicML streaming (or its
documented layout when the library is not installed, see test_mds_streaming_reader) and json.
Every document's tokens and text, and the counts, must equal the run's."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from datapipe.export import ExportError, export
from datapipe.tokens.shard_format import file_sha256, open_shard, tokens_view
from tests.support.export_helpers import LINES, MIXTURE, build_real_run, expected_documents
from tests.support.shared_data import PROJECT_ROOT

STREAMS = [(s, split) for s in LINES for split in ("train", "val")]


@pytest.fixture(scope="module")
def run(ray_local, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_real_run(tmp_path_factory)


@pytest.fixture(scope="module")
def expected(run: Path) -> dict[tuple[str, str], list[dict[str, Any]]]:
    exp = expected_documents(run)
    assert all(len(exp.get(k, [])) > 0 for k in STREAMS), {k: len(v) for k, v in exp.items()}
    return exp


def _shard_stream(run: Path, source: str, split: str) -> np.ndarray:
    """All non-padding tokens of one source and split, as packed (concat packing keeps run order)."""
    rows = []
    m = pq.read_table(run / "shards" / "manifest.parquet").to_pylist()
    for rec in sorted((r for r in m if r["source"] == source and r["split"] == split), key=lambda r: r["path"]):
        table, _ = open_shard(run / rec["path"])
        n = table["n_tokens"].to_numpy()
        rows += [r[:k] for r, k in zip(tokens_view(table), n)]
    return np.concatenate(rows)


def test_expected_documents_are_the_packed_shards(run: Path, expected) -> None:
    # The reference itself is checked against the shards: laid end to end, the documents are the packed tokens.
    for source, split in STREAMS:
        docs = np.concatenate([d["input_ids"] for d in expected[(source, split)]])
        assert np.array_equal(docs, _shard_stream(run, source, split))


# --- megatron ----------------------------------------------------------------------------------


def _read_idx(prefix: Path) -> tuple[np.dtype, np.ndarray, np.ndarray, np.ndarray]:
    """The .idx layout of megatron.core.datasets.indexed_dataset (_IndexWriter), read from the spec."""
    raw = Path(str(prefix) + ".idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00" and struct.unpack("<Q", raw[9:17])[0] == 1
    dtype = {8: np.dtype(np.uint16), 4: np.dtype(np.int32)}[raw[17]]
    n, n_docs = struct.unpack("<QQ", raw[18:34])
    lengths = np.frombuffer(raw, np.int32, n, 34)
    pointers = np.frombuffer(raw, np.int64, n, 34 + 4 * n)
    doc_idx = np.frombuffer(raw, np.int64, n_docs, 34 + 12 * n)
    assert 34 + 12 * n + 8 * n_docs == len(raw)
    return dtype, lengths, pointers, doc_idx


def test_megatron_roundtrip_with_megatron_core(run: Path, expected, tmp_path: Path) -> None:
    out = tmp_path / "megatron"
    result = export(run, "megatron", out)
    for source, split in STREAMS:
        want = expected[(source, split)]
        prefix = out / source / f"{split}_text_document"
        # The spec, read here byte by byte: one sequence per document, document boundaries kept.
        dtype, lengths, pointers, doc_idx = _read_idx(prefix)
        assert dtype == np.uint16 and np.array_equal(doc_idx, np.arange(len(want) + 1))
        assert lengths.tolist() == [len(d["input_ids"]) for d in want]
        assert np.array_equal(pointers, np.concatenate([[0], np.cumsum(lengths[:-1])]) * 2)
        assert result.streams[f"{source}/{split}"] == {"docs": len(want), "tokens": int(lengths.sum()), "parts": 1}
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    for source, split in STREAMS:
        want = expected[(source, split)]
        ds = indexed.IndexedDataset(str(out / source / f"{split}_text_document"))
        assert len(ds) == len(want) and len(ds.document_indices) == len(want) + 1
        for i, doc in enumerate(want):
            assert ds[i].tolist() == doc["input_ids"], (source, split, doc["id"])
        assert ds.get(len(want) - 1, offset=1, length=2).tolist() == want[-1]["input_ids"][1:3]


def test_megatron_data_path_follows_the_mixture(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "m"
    result = export(run, "megatron", out)
    parts = (out / "data_path.train.txt").read_text().split()
    weights = {Path(p).parent.name: float(w) for w, p in zip(parts[::2], parts[1::2])}
    total = sum(MIXTURE.values())
    assert weights == pytest.approx({s: w / total for s, w in MIXTURE.items()})
    assert all(Path(p + ".bin").is_file() and Path(p + ".idx").is_file() for p in parts[1::2])
    assert result.extra["data_path"]["train"] == " ".join(parts)
    assert result.extra["weights_from"] == "mixture"


def test_megatron_from_packed_shards_when_token_lists_are_gone(run: Path, expected, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("exports"))
    shutil.rmtree(copy / "_work" / "tokens")  # only the packed shards hold the tokens now
    export(copy, "megatron", tmp_path / "from_shards")
    export(run, "megatron", tmp_path / "from_lists")
    for source, split in STREAMS:
        for ext in (".bin", ".idx"):
            rel = f"{source}/{split}_text_document{ext}"
            assert (tmp_path / "from_shards" / rel).read_bytes() == (tmp_path / "from_lists" / rel).read_bytes()
    # Text and metadata exports join the recovered tokens with docs/ in run order.
    export(copy, "jsonl", tmp_path / "j", columns=["id", "input_ids"])
    for source, split in STREAMS:
        got = [json.loads(line) for line in (tmp_path / "j" / source / f"{split}-00000.jsonl").open()]
        assert [(g["id"], g["input_ids"]) for g in got] == [(d["id"], d["input_ids"]) for d in expected[(source, split)]]


# --- hugging face ------------------------------------------------------------------------------


def test_hf_arrow_roundtrip_with_datasets(run: Path, expected, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "hf"
    export(run, "hf", out, columns=["id", "text", "n_chars", "url", "input_ids"], docs_per_file=25)
    for source, split in STREAMS:
        want = expected[(source, split)]
        files = sorted((out / source).glob(f"{split}-*.arrow"))
        assert len(files) == -(-len(want) // 25)
        ds = datasets.concatenate_datasets([datasets.Dataset.from_file(str(f)) for f in files])  # memory-mapped
        assert ds.num_rows == len(want)
        assert ds.column_names == ["id", "text", "n_chars", "url", "input_ids"]
        assert ds.features["input_ids"].feature.dtype == "uint16"
        for got, doc in zip(ds, want):
            assert (got["id"], got["text"], got["input_ids"]) == (doc["id"], doc["text"], doc["input_ids"])
            assert got["n_chars"] == len(doc["text"]) and got["url"] is None
        # load_dataset reads the same files (the "arrow" builder takes IPC stream files).
        loaded = datasets.load_dataset(
            "arrow", data_files=[str(f) for f in files], split="train", cache_dir=str(tmp_path / "cache")
        )
        assert loaded["id"] == [d["id"] for d in want]


def test_hf_parquet_roundtrip_with_load_dataset(run: Path, expected, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "hfp"
    export(run, "hf", out, hf_file_format="parquet", splits=["train"])
    assert not list(out.rglob("val-*"))
    for source in LINES:
        want = expected[(source, "train")]
        ds = datasets.load_dataset(
            "parquet",
            data_files={"train": sorted(str(f) for f in (out / source).glob("*.parquet"))},
            split="train",
            cache_dir=str(tmp_path / "cache"),
        )
        assert ds["id"] == [d["id"] for d in want] and ds["text"] == [d["text"] for d in want]
        assert ds["input_ids"] == [d["input_ids"] for d in want]


# --- mosaicml streaming ------------------------------------------------------------------------


def _mds_read_by_spec(folder: Path) -> list[dict[str, Any]]:
    """MDS as streaming's MDSWriter documents it: index.json, then per shard
    <u32 n><u32 offsets[n+1]><config><samples>, a sample = u32 sizes then columns in name order."""
    index = json.loads((folder / "index.json").read_text())
    assert index["version"] == 2
    rows = []
    for shard in index["shards"]:
        raw = (folder / shard["raw_data"]["basename"]).read_bytes()
        assert len(raw) == shard["raw_data"]["bytes"] and shard["format"] == "mds"
        n = int(np.frombuffer(raw, np.uint32, 1)[0])
        assert n == shard["samples"]
        offsets = np.frombuffer(raw, np.uint32, n + 1, 4)
        for a, b in zip(offsets[:-1], offsets[1:]):
            data = raw[a:b]
            names, encs = shard["column_names"], shard["column_encodings"]
            sizes = np.frombuffer(data, np.uint32, len(names))
            pos, row = 4 * len(names), {}
            for name, enc, size in zip(names, encs, sizes):
                value = data[pos : pos + size]
                pos += size
                if enc.startswith("ndarray:"):
                    code = value[0] & 3
                    width = 1 << code
                    length = int.from_bytes(value[1 : 1 + width], "little")
                    row[name] = np.frombuffer(value[1 + width :], enc.split(":")[1]).tolist()
                    assert len(row[name]) == length and value[0] >> 2 == 1
                else:
                    row[name] = value.decode() if enc == "str" else json.loads(value)
            rows.append(row)
    return rows


def test_mds_layout_roundtrip(run: Path, expected, tmp_path: Path) -> None:
    out = tmp_path / "mds"
    export(run, "mds", out, columns=["id", "text", "url", "input_ids"], mds_size_limit=1 << 16)
    for source, split in STREAMS:
        want = expected[(source, split)]
        got = _mds_read_by_spec(out / source / split)
        assert [(g["id"], g["text"], g["input_ids"], g["url"]) for g in got] == [
            (d["id"], d["text"], d["input_ids"], None) for d in want
        ]
    assert len(json.loads((out / "zh" / "train" / "index.json").read_text())["shards"]) > 1  # size_limit splits


STREAMING_READ = """
import json, sys
from streaming import StreamingDataset
out = {}
for folder in sys.argv[1:]:
    ds = StreamingDataset(local=folder, shuffle=False, batch_size=1)
    out[folder] = [{k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in ds[i].items()} for i in range(len(ds))]
print(json.dumps(out))
"""


def test_mds_streaming_reader(run: Path, expected, tmp_path: Path) -> None:
    """Read back with streaming's StreamingDataset: in this process when `streaming` imports, else with
    the interpreter named by DATAPIPE_STREAMING_PYTHON. streaming-community (0.14.2) is not a test
    dependency: it requires torchvision and cloud SDKs, and installing it upgrades torch."""
    out = tmp_path / "mds"
    export(run, "mds", out, columns=["id", "text", "n_chars", "url", "input_ids"], mds_size_limit=1 << 17)
    folders = [str(out / source / split) for source, split in STREAMS]
    python = os.environ.get("DATAPIPE_STREAMING_PYTHON")
    try:
        import streaming  # noqa: F401

        python = sys.executable
    except ImportError:
        if not python:
            pytest.skip("streaming is not installed; set DATAPIPE_STREAMING_PYTHON to a Python that has it")
    proc = subprocess.run([python, "-c", STREAMING_READ, *folders], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for (source, split), folder in zip(STREAMS, folders):
        want = expected[(source, split)]
        assert got[folder] == [
            {"id": d["id"], "text": d["text"], "n_chars": len(d["text"]), "url": None, "input_ids": d["input_ids"]} for d in want
        ]


# --- jsonl, records, resume --------------------------------------------------------------------


def test_jsonl_with_chosen_columns(run: Path, expected, tmp_path: Path) -> None:
    out = tmp_path / "jsonl"
    result = export(run, "jsonl", out, columns=["id", "text", "split", "n_tokens"], sources=["zh"])
    assert sorted(result.streams) == ["zh/train", "zh/val"]
    for split in ("train", "val"):
        got = [json.loads(line) for line in (out / "zh" / f"{split}-00000.jsonl").open(encoding="utf-8")]
        assert got == [
            {"id": d["id"], "text": d["text"], "split": split, "n_tokens": len(d["input_ids"])} for d in expected[("zh", split)]
        ]


def test_export_is_recorded_in_the_run(run: Path, expected, tmp_path: Path) -> None:
    out = tmp_path / "rec"
    export(run, "hf", out, docs_per_file=40)
    record = json.loads((run / "exports" / "hf.json").read_text())
    assert record["output"] == str(out.resolve()) and record["format"] == "hf"
    assert record["documents"] == sum(len(v) for v in expected.values())
    assert record["tokens"] == sum(len(d["input_ids"]) for v in expected.values() for d in v)
    written = {p.relative_to(out).as_posix() for p in out.rglob("*.arrow")}
    assert written == set(record["files"])
    for rel, info in record["files"].items():
        assert info["sha256"] == file_sha256(out / rel) and info["bytes"] == (out / rel).stat().st_size


def _kill_export(run: Path, out: Path, fault: str, fmt: str, **kw: Any) -> subprocess.CompletedProcess:
    code = f"from datapipe.export import export; export({str(run)!r}, {fmt!r}, {str(out)!r}, **{kw!r})"
    env = {
        **os.environ,
        "DATAPIPE_FAULT_KILL_AT": fault,
        "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("fault", ["export:3", "export-write:5"])
def test_export_resumes_after_a_kill(run: Path, tmp_path: Path, fault: str) -> None:
    kw = {"docs_per_file": 20, "columns": ["id", "text", "input_ids"]}
    whole = tmp_path / "whole"
    export(run, "hf", whole, **kw)
    out = tmp_path / "killed"
    proc = _kill_export(run, out, fault, "hf", **kw)
    assert proc.returncode == -9, proc.stderr[-2000:]  # SIGKILL: nothing cleaned up
    manifest = json.loads((out / "export-manifest.json").read_text())
    n_done = 3 if fault == "export:3" else 4
    assert len(manifest["parts"]) == n_done
    leftovers = [p for p in out.rglob("*") if ".tmp-" in p.name]
    assert bool(leftovers) == fault.startswith("export-write")  # killed half-way through a file
    result = export(run, "hf", out, **kw)
    assert result.parts_skipped == n_done and not [p for p in out.rglob("*") if ".tmp-" in p.name]
    files = sorted(p.relative_to(whole) for p in whole.rglob("*.arrow"))
    assert files == sorted(p.relative_to(out) for p in out.rglob("*.arrow"))
    assert all((whole / f).read_bytes() == (out / f).read_bytes() for f in files)


def test_refusals_name_the_option(run: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="--columns: nope"):
        export(run, "jsonl", tmp_path / "a", columns=["id", "nope"])
    with pytest.raises(ExportError, match="--format"):
        export(run, "tfrecord", tmp_path / "a")
    with pytest.raises(ExportError, match="inside the run folder"):
        export(run, "jsonl", run / "exports" / "x")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("user data")
    with pytest.raises(ExportError, match="not empty"):
        export(run, "jsonl", busy)
    export(run, "jsonl", tmp_path / "b", splits=["val"])
    with pytest.raises(ExportError, match="other settings"):
        export(run, "jsonl", tmp_path / "b", splits=["train"])
    assert export(run, "jsonl", tmp_path / "b", splits=["train"], fresh=True).streams


def test_cli_export(run: Path, expected, tmp_path: Path) -> None:
    from datapipe.cli import main

    res = CliRunner().invoke(main, ["export", str(run), "--format", "megatron", "--output", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    zh_train = expected[("zh", "train")]
    assert f"zh/train: {len(zh_train)} documents, {sum(len(d['input_ids']) for d in zh_train)} tokens, " in res.output
    data_path = next(line for line in lines if line.startswith("--data-path "))
    assert data_path.split(" ", 1)[1] == (tmp_path / "m" / "data_path.train.txt").read_text().strip()
    # Progress, off a terminal: one line per source and split, every documents file of the source read
    # (said so: they are the run's files read, not the files written).
    for source, split in STREAMS:
        n_files = len(list((run / "docs" / source).glob("*.parquet")))
        assert f"export {source}/{split}: {n_files}/{n_files} docs/{source} files read in " in res.output
    quiet = CliRunner().invoke(main, ["export", str(run), "--format", "jsonl", "-o", str(tmp_path / "j"), "--no-progress"])
    assert quiet.exit_code == 0 and "files read" not in quiet.output
    # JSONL of text holds no input_ids: no token count is claimed ("0 tokens" was printed), here or in the record.
    assert f"zh/train: {len(zh_train)} documents, 1 file(s)" in quiet.output and "tokens" not in quiet.output
    assert json.loads((run / "exports" / "jsonl.json").read_text())["tokens"] is None
    res = CliRunner().invoke(main, ["export", str(run), "--format", "hf", "-o", str(tmp_path / "h"), "--columns", "id,bad"])
    assert res.exit_code == 2 and "--columns: bad not among" in res.output
