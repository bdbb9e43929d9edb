"""Split inputs (engine/splits.py): a large file read as ranges, or tiny files read as a group, gives
exactly the documents and rejects of the whole-file read. In-process (no Ray), on real data."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datapipe.audit.sql import connect as connect_stats
from datapipe.engine.plan import make_spec
from datapipe.engine.splits import effective_target, even_cuts, plan_file
from datapipe.engine.tasks.map import map_shard
from datapipe.pipeline.load import SourceConfig, SplitConfig, load_pipeline
from datapipe.readers import InputFile, reader_spec
from datapipe.readers.streams import LineRange, count_newlines
from tests.conftest import write_pipeline
from tests.support.shared_data import shared_path


def _read_all(fmt: str, path: Path, source: SourceConfig, ranges=None) -> tuple[list[tuple], list[tuple]]:
    """(docs, rejects) rows the reader gives for the whole file, or for each range in turn."""
    docs: list[tuple] = []
    rejects: list[tuple] = []
    pieces = ranges or [None]
    for r in pieces:
        first = 0
        if r is not None and fmt == "jsonl":
            first = count_newlines(str(path), 0, r.start)
        file = InputFile(
            path, path.name, source, start=r.start if r else 0, end=r.end if r else None, first_record=first, ranged=r is not None
        )
        for batch in reader_spec(fmt).read(file, 100):
            docs += [tuple(row.values()) for row in batch.docs.to_pylist()]
            if batch.rejects is not None:
                rejects += [(row["id"], row["reason"]) for row in batch.rejects.to_pylist()]
    return docs, rejects


def _real_jsonl(tmp_path: Path) -> Path:
    """Real corpus lines with the awkward cases a cut can land on: blank lines, a malformed line,
    CRLF endings, a long line, and no newline at the end."""
    lines = shared_path("corpus", "zh_oiwiki.jsonl").read_bytes().splitlines()[:120]
    lines += shared_path("corpus", "en_wikipedia.jsonl").read_bytes().splitlines()[:120]
    random.Random(7).shuffle(lines)
    lines[10:10] = [b"", b"   ", b'{"text": "cut off']
    lines[50] = lines[50] + b"\r"
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"\n".join(lines))  # no final newline
    return path


def test_line_ranges_cover_every_line_once_whatever_the_cuts() -> None:
    text = b"a\n\nbb\nccc\r\n\nd\neeeee\nf"
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
        f.write(text)
        f.flush()
        whole = text.split(b"\n")
        for step in range(1, len(text) + 1):
            got: list[bytes] = []
            first_numbers: list[int] = []
            for start in range(0, len(text), step):
                end = start + step if start + step < len(text) else None
                with LineRange(f.name, start, end) as r:
                    data = b"".join(iter(lambda: r.read(3), b""))
                    skipped = r.skipped
                if data:
                    first_numbers.append(count_newlines(f.name, 0, start) + skipped)
                    got += data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n")
            assert got == whole, step
            # Each range's first line number is the line's index in the whole file.
            starts = [i for i, line in enumerate(whole)]
            assert all(n in starts for n in first_numbers)


def test_jsonl_ranges_give_the_whole_files_records_with_global_line_numbers(tmp_path: Path) -> None:
    path = _real_jsonl(tmp_path)
    src = SourceConfig(name="s", paths=["x"])
    ranges = plan_file(str(path), path.name, "jsonl", 0, 64 << 10)
    assert len(ranges) >= 4 and ranges[0].start == 0 and ranges[-1].end is None
    whole = _read_all("jsonl", path, src)
    split = _read_all("jsonl", path, src, ranges)
    assert split == whole
    assert len(whole[0]) > 200 and ("s/big.jsonl#L13", "malformed_json") in whole[1]


def test_compressed_jsonl_is_one_task(tmp_path: Path) -> None:
    import gzip

    path = tmp_path / "big.jsonl.gz"
    path.write_bytes(gzip.compress(_real_jsonl(tmp_path).read_bytes(), 1))
    assert len(plan_file(str(path), path.name, "jsonl", 0, 4096)) == 1


def test_parquet_row_group_ranges_give_the_whole_files_rows(tmp_path: Path) -> None:
    texts = [json.loads(line)["text"] for line in shared_path("corpus", "zh_wikipedia.jsonl").read_text().splitlines()[:300]]
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": texts, "url": [f"https://x/{i}" for i in range(len(texts))]}), path, row_group_size=25)
    ranges = plan_file(str(path), path.name, "parquet", 0, 64 << 10)
    assert len(ranges) >= 3
    assert {(r.start, r.end) for r in ranges} >= {(0, ranges[1].start)}
    src = SourceConfig(name="p", paths=["x"])
    assert _read_all("parquet", path, src, ranges) == _read_all("parquet", path, src)


@pytest.mark.parametrize(
    "name,fmt",
    [
        ("whirlwind_whirlwind.warc.gz", "warc"),
        ("whirlwind_whirlwind.warc.wet.gz", "wet"),
        ("warcio_example.warc.gz", "warc"),
        ("warcio_example-iana.org-chunked.warc", "warc"),
    ],
)
def test_warc_ranges_at_record_boundaries_give_the_whole_files_records(tmp_path: Path, name: str, fmt: str) -> None:
    # Real Common Crawl / warcio files, repeated so there are several ranges of 4 KiB
    # (per-record gzip concatenates into a valid file; the copies get other offsets, so other ids).
    data = shared_path("web", "warc", name).read_bytes()
    path = tmp_path / name
    path.write_bytes(data * 6)
    ranges = plan_file(str(path), path.name, fmt, 0, 4096)
    assert len(ranges) >= 3
    src = SourceConfig(name="w", kind="web", paths=["x"])
    whole = _read_all(fmt, path, src)
    assert _read_all(fmt, path, src, ranges) == whole
    assert len(whole[0]) + len(whole[1]) >= 6


def test_single_member_gzip_warc_is_not_split(tmp_path: Path) -> None:
    import gzip

    plain = shared_path("web", "warc", "warcio_example-iana.org-chunked.warc").read_bytes()
    path = tmp_path / "one.warc.gz"
    path.write_bytes(gzip.compress(plain * 4))
    assert len(plan_file(str(path), path.name, "warc", 0, 4096)) == 1


def _map_outputs(out: Path) -> dict[str, list[dict]]:
    docs = sorted(
        (r for f in sorted((out / "docs").glob("**/*.parquet")) for r in pq.read_table(f).to_pylist()), key=lambda r: r["id"]
    )
    rejected = sorted(
        (r["id"], r["stage"], r["reason"])
        for f in sorted((out / "rejected").glob("**/*.parquet"))
        for r in pq.read_table(f).to_pylist()
    )
    return {"docs": docs, "rejected": rejected}  # type: ignore[dict-item]


def test_map_tasks_over_ranges_and_groups_equal_whole_files(tmp_path: Path) -> None:
    """Through map_shard: one large JSONL split, many tiny files grouped, a Parquet file split."""
    big = _real_jsonl(tmp_path)
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    lines = shared_path("corpus", "zh_pingcap_docs.jsonl").read_text().splitlines()[:40]
    for i in range(20):
        (tiny / f"t{i:02d}.jsonl").write_text("\n".join(lines[2 * i : 2 * i + 2]) + "\n")
    config = {
        "name": "t",
        "sources": [{"name": "big", "paths": [big.name]}, {"name": "tiny", "paths": ["tiny/*.jsonl"]}],
        "stages": [{"length": {"min_chars": 200}}],
    }

    def run(split: dict, out: Path) -> tuple[dict, dict]:
        pipeline = load_pipeline(write_pipeline(tmp_path, {**config, "split": split}))
        spec = make_spec(pipeline, out, tmp_path / "cache")
        docs_in = 0
        for shard in spec.shards:
            marker = map_shard(spec, shard, spec.segments[0])
            docs_in += marker["docs_in"]
            for read in marker["reads"]:  # what it read of its inputs, hashed as it read it
                assert read["sha256"] and read["extents"] and read["change"]
        per_source = {name: len(spec.shards_of(name)) for name in spec.sources}
        return per_source, {**_map_outputs(out), "docs_in": docs_in}

    n_whole, whole = run({"target_bytes": 1 << 30, "group_small_files": False}, tmp_path / "whole")
    n_split, split = run({"target_bytes": 64 << 10}, tmp_path / "split")
    assert n_whole == {"big": 1, "tiny": 20}  # one task per file
    tiny_bytes = sum(f.stat().st_size for f in tiny.iterdir())
    assert 1 < n_split["tiny"] <= tiny_bytes // (64 << 10) + 1 < 10  # 20 tiny files in a few tasks
    assert n_split["big"] >= 4  # the big one split
    assert split == whole and whole["docs"] and whole["rejected"]


def test_effective_target_keeps_small_clusters_busy() -> None:
    cfg = SplitConfig()
    assert effective_target(cfg, 2 << 30, 2) == 256 << 20  # 2 GiB on 2 CPUs: 8 ranges of the target
    assert effective_target(cfg, 600 << 20, 2) == (600 << 20) // 6  # 600 MiB on 2 CPUs: 3 tasks per CPU
    assert effective_target(cfg, 10 << 40, 1000) == 256 << 20  # 10 TB on 1,000 CPUs: the target
    assert effective_target(cfg, 1 << 20, 2) == 8 << 20  # a tiny corpus: not below min_bytes
    assert effective_target(cfg, 2 << 30, None) == 256 << 20


def test_a_large_file_splits_into_equal_ranges_no_short_tail(tmp_path: Path) -> None:
    # 2 GB in 256 MiB pieces: 8 equal ranges, not 7 full ones and a 0.45 one (an idle core at the end).
    assert [
        b - a for a, b in zip(even_cuts(2_000_000_000, 256 << 20), [*even_cuts(2_000_000_000, 256 << 20)[1:], 2_000_000_000])
    ] == [250_000_000] * 8
    path = _real_jsonl(tmp_path)
    size, target = path.stat().st_size, 64 << 10
    ranges = plan_file(str(path), path.name, "jsonl", 0, target)
    lengths = [(r.end if r.end is not None else size) - r.start for r in ranges]
    assert len(ranges) >= size // target and max(lengths) - min(lengths) <= 1 and max(lengths) <= target * 1.1
    # A target that does not divide the corpus evenly gives min_tasks_per_cpu ranges, not one more tiny one.
    cfg = SplitConfig(min_bytes=4096)
    assert len(plan_file(str(path), path.name, "jsonl", 0, effective_target(cfg, size, 2))) == 6


def test_two_near_equal_files_make_equal_tasks(tmp_path: Path) -> None:
    # Two halves of a corpus, one 2% larger, on 2 CPUs: the target is a sixth of the whole. Rounding
    # each half up gave the larger one 4 ranges and the other 3 (ranges of 0.76 and 1.0 target: the
    # last wave leaves a core idle); a range may exceed the target by 10% instead, so both make 3.
    path = _real_jsonl(tmp_path)
    small = tmp_path / "small.jsonl"
    small.write_bytes(path.read_bytes()[: int(path.stat().st_size / 1.02)])
    sizes = [path.stat().st_size, small.stat().st_size]
    target = effective_target(SplitConfig(min_bytes=4096), sum(sizes), 2)
    assert sizes[0] > 3 * target  # without the slack: 4 ranges
    plans = [plan_file(str(p), p.name, "jsonl", 0, target) for p in (path, small)]
    assert [len(r) for r in plans] == [3, 3]
    lengths = [(r.end if r.end is not None else size) - r.start for rs, size in zip(plans, sizes) for r in rs]
    assert max(lengths) <= target * 1.1 and max(lengths) / min(lengths) < 1.03


def test_split_run_equals_unsplit_run_through_the_engine(ray_local, tmp_path: Path) -> None:
    """One file per task on Ray vs 64 KiB ranges and grouped tiny files in process: the same
    documents table, kept rows and byte-identical token shards (dedup's earliest survivor and
    packing order follow the run order, which splitting keeps, whatever runs the tasks). The split
    run's ~30 tasks run in process: on Ray they cost CI ~1.5 min, and Ray's scheduling of many
    tasks is compared with the in-process run elsewhere (tests/e2e/test_executors.py,
    test_object_storage.py, test_substrings_runs.py)."""
    from datapipe.engine.runner import PipelineError, run_pipeline
    from tests.support.shared_data import PROJECT_ROOT

    big = _real_jsonl(tmp_path)
    with big.open("ab") as f:  # planted exact duplicates across range boundaries
        f.write(b"\n" + b"\n".join(big.read_bytes().splitlines()[:30]) + b"\n")
    texts = [json.loads(line)["text"] for line in shared_path("corpus", "zh_wikipedia.jsonl").read_text().splitlines()[:200]]
    pq.write_table(pa.table({"text": texts}), tmp_path / "wiki.parquet", row_group_size=20)
    (tmp_path / "web.warc.gz").write_bytes(shared_path("web", "warc", "whirlwind_whirlwind.warc.gz").read_bytes() * 4)
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    for i, line in enumerate(shared_path("corpus", "zh_pingcap_docs.jsonl").read_text().splitlines()[:12]):
        (tiny / f"t{i:02d}.jsonl").write_text(line + "\n")
    config = {
        "name": "t",
        "sources": [
            {"name": "big", "paths": [big.name]},
            {"name": "pq", "paths": ["wiki.parquet"]},
            {"name": "web", "kind": "web", "paths": ["web.warc.gz"]},
            {"name": "tiny", "paths": ["tiny/*.jsonl"]},
        ],
        "stages": [{"length": {"min_chars": 100}}, {"dedup": {"exact": True}}, {"minhash": {"threshold": 0.7}}],
        "tokenize": {
            "tokenizer": str(PROJECT_ROOT / "tokenizer" / "demo.json"),
            "seq_len": 128,
            "val_fraction": 0.1,
            "rows_per_shard": 32,
        },
    }

    def run(split: dict, out: Path, in_process: bool = True) -> dict:
        pipeline = load_pipeline(write_pipeline(tmp_path, {**config, "split": split}))
        result = run_pipeline(pipeline, output=out, show_progress=False, log=lambda m: None, in_process=in_process)

        with connect_stats(out) as con:
            table = con.execute("SELECT id, status, stage, reason, detail FROM documents ORDER BY id").fetchall()
        kept = [r for f in sorted((out / "docs").glob("**/*.parquet")) for r in pq.read_table(f).to_pylist()]
        manifest = pq.read_table(out / "shards" / "manifest.parquet").to_pylist()
        return {
            "tasks": result.run["split"]["map_tasks"],
            "table": table,
            "kept": sorted(kept, key=lambda r: r["id"]),
            "shards": sorted((m["path"], m["sha256"]) for m in manifest),
            "sha256": sorted((i["path"], i.get("sha256")) for i in result.run["inputs"]),
        }

    whole = run({"target_bytes": 1 << 30, "group_small_files": False}, tmp_path / "whole", in_process=False)
    split = run({"target_bytes": 64 << 10}, tmp_path / "split", in_process=True)
    assert whole["tasks"] == 15 and split["tasks"] > whole["tasks"]
    assert any(r[3] == "exact_duplicate" for r in whole["table"])
    for key in ("table", "kept", "shards"):
        assert split[key] == whole[key], key
    # An input's sha256 where one task read it whole (hashed as it was read, no second read): every
    # file of the unsplit run but the Parquet one (read by row groups); in the split run at least the
    # small files (a range's reads may happen to cover a small file: the 240 KB WARC in one buffer).
    files = {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p, _ in whole["sha256"]}
    assert {p: sha for p, sha in whole["sha256"] if sha} == {p: h for p, h in files.items() if not p.endswith(".parquet")}
    split_sha = {p: sha for p, sha in split["sha256"] if sha}
    assert split_sha.items() <= files.items() and {p for p in files if "/tiny/" in p} <= split_sha.keys()
    markers = tmp_path / "split" / "_work" / "markers"
    per_source = {d.name: len(list(d.glob("*.json"))) for d in (markers / "map0").iterdir()}
    assert per_source["big"] >= 4 and per_source["pq"] >= 2 and per_source["web"] >= 2 and per_source["tiny"] < 12
    assert len(list((markers / "lines" / "big").glob("*.json"))) == per_source["big"] - 1

    # Resume: the recorded layout finds every marker; lost markers rerun only their tasks.
    pipeline = load_pipeline(write_pipeline(tmp_path, {**config, "split": {"target_bytes": 64 << 10}}))
    again = run_pipeline(pipeline, output=tmp_path / "split", show_progress=False, log=lambda m: None)
    assert again.executed_tasks == 0
    (markers / "lines" / "big" / "00000.part0000.json").unlink()
    (markers / "map0" / "big" / "00000.part0002.json").unlink()
    again = run_pipeline(pipeline, output=tmp_path / "split", show_progress=False, log=lambda m: None)
    assert again.executed_tasks == 2
    assert run({"target_bytes": 64 << 10}, tmp_path / "split")["table"] == whole["table"]
    # A different split setting is a different task layout: refused, not mixed.
    with pytest.raises(PipelineError, match="split"):
        run({"target_bytes": 128 << 10}, tmp_path / "split")
    # A folder planned by a datapipe that cut the same inputs into other ranges (run.json records how
    # many map tasks it planned): refused, not resumed over markers of other byte ranges.
    run_json = tmp_path / "split" / "run.json"
    recorded = json.loads(run_json.read_text())
    recorded["split"]["map_tasks"] += 1
    run_json.write_text(json.dumps(recorded))
    with pytest.raises(PipelineError, match="cannot be reused"):
        run_pipeline(pipeline, output=tmp_path / "split", show_progress=False, log=lambda m: None)


def test_split_settings_are_validated_with_their_yaml_key(tmp_path: Path) -> None:
    from datapipe.pipeline.load import ConfigError

    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    config = {"name": "t", "sources": [{"name": "s", "paths": ["a.jsonl"]}], "split": {"target_bytes": 10, "chunk": 3}}
    with pytest.raises(ConfigError) as err:
        load_pipeline(write_pipeline(tmp_path, config))
    assert "split.target_bytes" in str(err.value) and "split.chunk: unknown key" in str(err.value)


def test_a_later_range_without_pre_pass_markers_numbers_its_lines_from_the_file(tmp_path: Path) -> None:
    """A range run without the ``lines`` markers (a task on its own) counts the newlines before it.
    Even cuts of 30,002 bytes in 3 are 0, 10,000 and 20,001, and byte 20,000 ends a line: a count
    that guessed the starts as multiples of the first (0, 10,000, 20,000) missed that newline."""

    def line(n: int) -> bytes:
        return b'{"text": "' + b"a" * (n - 13) + b'"}\n'

    data = line(100) * 199 + line(101) + line(100) * 99 + line(101)  # 20,001 + 10,001 bytes
    assert len(data) == 30_002 and data[20_000:20_001] == b"\n"
    (tmp_path / "big.jsonl").write_bytes(data)
    pipeline = load_pipeline(
        write_pipeline(
            tmp_path, {"name": "t", "sources": [{"name": "s", "paths": ["big.jsonl"]}], "split": {"target_bytes": 10_001}}
        )
    )
    spec = make_spec(pipeline, tmp_path / "out", tmp_path / "cache")
    assert [s.inputs[0].start for s in spec.shards] == [0, 10_000, 20_001]
    for shard in spec.shards:
        map_shard(spec, shard, spec.segments[0])
    ids = [r["id"] for r in _map_outputs(tmp_path / "out")["docs"]]
    assert sorted(ids) == sorted(f"s/big.jsonl#L{n}" for n in range(1, 301))
