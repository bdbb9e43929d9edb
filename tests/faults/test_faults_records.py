"""Hostile records (issue 12) mixed with real documents: one bad record never fails its task.

Each hostile input is built here and mixed with real lines of ../shared/data/corpus. The
map task runs in-process (no Ray) over the mixed file and over the good lines alone, and
the suite checks: the task completes, every bad record has exactly one reject row with the
expected stage and reason, every good record comes out exactly as in the clean run,
inputs = kept + rejected, and nothing is written outside the run folder. One small Ray
run over several hostile files checks the same end to end; a subprocess reading a gzip
holding one 1.5 GiB line checks that memory stays bounded.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from datapipe.engine.plan import _STAGE_CACHE, make_spec
from datapipe.engine.tasks import map as map_task
from datapipe.engine.tasks.isolate import StageBroken
from datapipe.engine.tasks.map import map_shard
from datapipe.pipeline.load import load_pipeline
from datapipe.stages import STAGES
from datapipe.stages.base import Decision, Stage
from tests.conftest import write_pipeline
from tests.support.shared_data import PROJECT_ROOT, shared_path

MAX_RECORD = 600_000  # limits.max_record_bytes in these pipelines: real lines used stay below it
STAGES_USED: list[dict[str, Any]] = [
    {"langid": {"keep": ["zh", "en"], "min_score": 0.3}},
    {"length": {"min_chars": 20}},
    {"quality": {"rules": "auto"}},
    {"pii": {}},
]


def good_lines() -> list[bytes]:
    """Real documents: zh and en Wikipedia, TiDB docs (Markdown with code), OI-wiki (LaTeX math)."""
    out: list[bytes] = []
    for name, n in (("zh_wikipedia.jsonl", 12), ("en_wikipedia.jsonl", 12), ("zh_pingcap_docs.jsonl", 6), ("zh_oiwiki.jsonl", 6)):
        with open(shared_path("corpus", name), "rb") as f:
            lines = [ln.rstrip(b"\n") for ln in f if 200 < len(ln) < MAX_RECORD // 3][:n]
        out.extend(lines)
    return out


def deep(n: int) -> bytes:
    return b'{"a":' * n


# (name, raw line, expected (stage, reason)): records that must be rejected, each exactly once.
BAD: list[tuple[str, bytes, tuple[str, str]]] = [
    ("lone high surrogate", b'{"text":"x \\ud800 y"}', ("read", "invalid_unicode")),
    ("lone low surrogate", b'{"text":"x \\udfff y and more words here"}', ("read", "invalid_unicode")),
    ("surrogates in the wrong order", b'{"text":"pair \\udc00\\ud800 reversed"}', ("read", "invalid_unicode")),
    ("surrogate in the url", b'{"text":"a perfectly ordinary text","url":"http://x/\\ud83d"}', ("read", "invalid_unicode")),
    ("100,000 nested objects", deep(100_000), ("read", "too_deeply_nested")),
    ("100,000 nested arrays", b"[" * 100_000, ("read", "too_deeply_nested")),
    ("65 levels, a valid record", b'{"text":"t","x":' + b'{"a":' * 64 + b"1" + b"}" * 65, ("read", "too_deeply_nested")),
    ("overlong UTF-8", b'{"text":"\xc0\xaf"}', ("read", "invalid_utf8")),
    ("UTF-8 encoded surrogate (CESU)", b'{"text":"\xed\xa0\x80"}', ("read", "invalid_utf8")),
    ("0xFF byte", b'{"text":"\xff text"}', ("read", "invalid_utf8")),
    ("truncated multibyte", b'{"text":"\xe4\xb8"}', ("read", "invalid_utf8")),
    ("line over max_record_bytes", b'{"text":"' + b"w " * (MAX_RECORD // 2 + 10) + b'"}', ("read", "record_too_large")),
    ("4,301-digit integer", b'{"text":"t","n":' + b"7" * 4301 + b"}", ("read", "malformed_json")),
    ("cut JSON", b'{"text":"unterminated', ("read", "malformed_json")),
    ("top-level array", b'["text"]', ("read", "malformed_record")),
    ("text is a number", b'{"text":12}', ("read", "malformed_record")),
    ("no text field", b'{"body":"x"}', ("read", "missing_text_field")),
]

# Valid text that has crashed text pipelines elsewhere: each must come out as one row (kept, or
# rejected by an ordinary rule), never as a record_error.
ODD_TEXTS = [
    "NUL \x00 in the middle of an otherwise ordinary English sentence about the weather today.",
    "Control characters \x01\x02\x07\x08\x0b\x0c\x1b[31m\x7f and C1 \x85\x9b in a sentence about rivers.",
    "\ufeffA byte order mark opens this ordinary English paragraph about mountains and lakes.",
    "Zero width\u200b\u200c\u200d joiners and \u2028 line \u2029 separators in an English sentence.",
    "中文句子里有空字符\x00和控制字符\x07，还有全角标点．这是一个关于历史的普通段落。",
    "\U0001f600\U0001f4a9 emoji \U000e0041 tags and private use \ue000\U000f0000 characters in text.",
    "\ufffd\ufffd replacement characters \ufffd in a sentence about the history of the river.",
    "",
    " \t\n ",
    "a" * 100_000,
]


def write_jsonl(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(ln + b"\n" for ln in lines))


def run_map(
    tmp_path: Path,
    name: str,
    files: dict[str, bytes],
    stages: list[dict[str, Any]] | None = None,
    limits: dict[str, int] | None = None,
) -> tuple[dict[str, Any], pa.Table, pa.Table]:
    """map_shard (no Ray) over each file of one source; returns the markers summed, kept docs, rejects."""
    project = tmp_path / name
    (project / "data").mkdir(parents=True)
    for fname, body in files.items():
        (project / "data" / fname).write_bytes(body)
    config: dict[str, Any] = {
        "name": name,
        "sources": [{"name": "s", "kind": "web", "paths": ["data/*"]}],
        "stages": STAGES_USED if stages is None else stages,
        "tokenize": {"tokenizer": str(PROJECT_ROOT / "tokenizer" / "demo.json"), "seq_len": 64},
        "limits": {"max_record_bytes": MAX_RECORD, **(limits or {})},
    }
    pipeline = load_pipeline(write_pipeline(project, config))
    out = project / "out"
    spec = make_spec(pipeline, out, tmp_path / "cache")
    before = _tree(project, exclude=out)
    markers = [map_shard(spec, shard, spec.segments[0]) for shard in spec.shards]
    assert _tree(project, exclude=out) == before, "a task wrote outside the run folder"
    kept = [pq.read_table(f) for f in sorted((out / "docs").glob("**/*.parquet"))]
    rejected = [
        pq.read_table(f, columns=["id", "text", "stage", "reason", "detail"])
        for f in sorted((out / "rejected").glob("**/*.parquet"))
    ]
    total = {"docs_in": sum(m["docs_in"] for m in markers), "kept": sum(m["kept"] for m in markers)}
    empty = pa.table({c: pa.array([], pa.string()) for c in ("id", "text", "stage", "reason", "detail")})
    return (
        total,
        pa.concat_tables(kept, promote_options="permissive") if kept else None,  # type: ignore[return-value]
        pa.concat_tables(rejected, promote_options="permissive") if rejected else empty,
    )


def _tree(root: Path, exclude: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file() and exclude not in p.parents}


def _comparable(kept: pa.Table) -> dict[str, dict[str, Any]]:
    """Kept documents keyed by text, without the columns that name their position (id, path)."""
    rows = kept.drop_columns([c for c in ("id", "path") if c in kept.column_names]).to_pylist()
    return {r["text"]: r for r in rows}


def test_hostile_jsonl_records_are_each_one_reject_and_good_records_unchanged(tmp_path: Path) -> None:
    good = good_lines()
    odd = [json.dumps({"text": t}).encode() for t in ODD_TEXTS]
    bom_good = b"\xef\xbb\xbf" + good[0]  # a BOM before a real record: read as that record
    mixed: list[bytes] = []
    for i, g in enumerate(good[1:]):
        mixed.append(g)
        if i < len(BAD):
            mixed.append(BAD[i][1])
        if i < len(odd):
            mixed.append(odd[i])
    mixed += [b[1] for b in BAD[len(good) - 1 :]] + odd[len(good) - 1 :]
    mixed.insert(0, bom_good)

    clean_counts, clean_kept, clean_rej = run_map(tmp_path, "clean", {"good.jsonl": b"\n".join(good) + b"\n"})
    counts, kept, rejected = run_map(tmp_path, "hostile", {"mixed.jsonl": b"\n".join(mixed) + b"\n"})

    # Conservation: every line is one row.
    assert counts["docs_in"] == len(mixed) == counts["kept"] + rejected.num_rows
    assert len(set(kept["id"].to_pylist()) | set(rejected["id"].to_pylist())) == len(mixed)
    # Every bad record: exactly one reject, with the expected stage and reason, on its own line.
    line_of = {raw: i + 1 for i, raw in enumerate(mixed)}
    by_id = {r["id"]: r for r in rejected.to_pylist()}
    for name, raw, (stage, reason) in BAD:
        row = by_id.get(f"s/data/mixed.jsonl#L{line_of[raw]}")
        assert row is not None, f"{name}: no reject row"
        assert (row["stage"], row["reason"]) == (stage, reason), f"{name}: {row['stage']}/{row['reason']} {row['detail']}"
        assert row["detail"], name
    # No stage crashed on any record (there is no record_error at all).
    assert "record_error" not in rejected["reason"].to_pylist()
    # Good records: kept exactly as in the clean run (all signals), and rejected alike.
    clean = _comparable(clean_kept)
    hostile = _comparable(kept)
    assert set(hostile) <= set(clean) | set(ODD_TEXTS)
    assert {t: hostile[t] for t in clean} == clean
    clean_drops = {(r["text"], r["stage"], r["reason"]) for r in clean_rej.to_pylist()}
    good_texts = {json.loads(g)["text"] for g in good}
    drops = {(r["text"], r["stage"], r["reason"]) for r in rejected.to_pylist() if r["text"] in good_texts}
    assert drops == clean_drops
    assert clean_counts["docs_in"] == len(good) == len(clean) + len(clean_drops)


class Explode(Stage):
    """A stage with a bug that only some records trigger (and, with ``always``, every record)."""

    name: ClassVar[str] = "explode"

    def compute(self, batch: pa.Table) -> pa.Table:
        if os.environ.get("EXPLODE_ALWAYS") or any("POISON" in (t or "") for t in batch["text"].to_pylist()):
            raise ValueError("cannot handle POISON")
        return batch.append_column("explode_ok", pa.array([True] * batch.num_rows))

    def decide(self, batch: pa.Table) -> Decision:
        return Decision.keep_all(batch.num_rows)


@pytest.fixture
def explode_stage():  # type: ignore[no-untyped-def]
    with STAGES.override(Explode):
        yield
    _STAGE_CACHE.clear()


def test_a_stage_raising_on_some_records_rejects_only_those(tmp_path: Path, explode_stage: None) -> None:
    good = good_lines()
    poison = [json.dumps({"text": f"POISON record number {i} with enough words to pass"}).encode() for i in range(3)]
    mixed = good[:5] + [poison[0]] + good[5:20] + poison[1:] + good[20:]
    stages = [{"length": {"min_chars": 20}}, {"explode": {}}]
    _, clean_kept, _ = run_map(tmp_path, "clean", {"good.jsonl": b"\n".join(good)}, stages)
    counts, kept, rejected = run_map(tmp_path, "poisoned", {"mixed.jsonl": b"\n".join(mixed)}, stages)
    assert counts["docs_in"] == len(mixed) == counts["kept"] + rejected.num_rows
    errors = rejected.filter(pc.equal(rejected["reason"], "record_error")).to_pylist()
    assert sorted(r["text"] for r in errors) == sorted(json.loads(p)["text"] for p in poison)
    assert all(r["stage"] == "explode" and "ValueError: cannot handle POISON" in r["detail"] for r in errors)
    assert _comparable(kept) == _comparable(clean_kept)


def test_a_broken_stage_fails_loudly_instead_of_rejecting_everything(
    tmp_path: Path, explode_stage: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXPLODE_ALWAYS", "1")
    with pytest.raises(ValueError, match="cannot handle POISON"):
        run_map(tmp_path, "broken", {"good.jsonl": b"\n".join(good_lines())}, [{"explode": {}}])


def test_many_failing_records_exceed_the_error_budget(tmp_path: Path, explode_stage: None) -> None:
    poison = [json.dumps({"text": f"POISON {i}"}).encode() for i in range(12)]
    with pytest.raises(StageBroken, match="max_record_errors=10"):
        run_map(tmp_path, "budget", {"p.jsonl": b"\n".join(good_lines()[:3] + poison)}, [{"explode": {}}])


def test_deep_records_are_checked_before_parsing_when_the_recursion_limit_is_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datapipe.pipeline.load import SourceConfig
    from datapipe.readers import InputFile, reader_spec

    monkeypatch.setattr(sys, "getrecursionlimit", lambda: 1_000_000)  # as if a library had raised it
    good = good_lines()[:2]
    path = tmp_path / "deep.jsonl"
    write_jsonl(
        path,
        [
            good[0],
            deep(100_000),
            b'{"text":"[[[[{{{{ in a string","x":' + b"[" * 65 + b"]" * 65 + b"}",
            b'{"text":"' + b"{[" * 200 + b'","x":[[1]]}',
            good[1],
        ],
    )
    src = SourceConfig.model_validate({"name": "s", "paths": ["x"]})
    batches = list(reader_spec("jsonl").read(InputFile(path, "deep.jsonl", src), 1024))
    kept = [i for b in batches for i in b.docs["id"].to_pylist()]
    rejected = {r["id"]: r["reason"] for b in batches if b.rejects for r in b.rejects.to_pylist()}
    assert kept == ["s/deep.jsonl#L1", "s/deep.jsonl#L4", "s/deep.jsonl#L5"]  # brackets in strings do not count
    assert rejected == {"s/deep.jsonl#L2": "too_deeply_nested", "s/deep.jsonl#L3": "too_deeply_nested"}


def test_decompression_bomb_stops_at_the_cap_as_one_reject(tmp_path: Path) -> None:
    good = good_lines()
    filler = [json.dumps({"text": "filler " * 2000}).encode()] * 400  # ~5.6 MB decompressed, ~30 KB gzipped
    body = gzip.compress(b"\n".join(good[:4] + filler + good[4:]) + b"\n")
    counts, kept, rejected = run_map(
        tmp_path, "bomb", {"bomb.jsonl.gz": body}, [], limits={"max_file_decompressed_bytes": 1 << 20}
    )
    assert counts["docs_in"] == counts["kept"] + rejected.num_rows
    stop = rejected.filter(pc.equal(rejected["reason"], "input_too_large")).to_pylist()
    assert len(stop) == 1 and "max_file_decompressed_bytes" in stop[0]["detail"]
    assert stop[0]["id"].endswith("-")  # the unread rest of the file
    assert {json.loads(g)["text"] for g in good[:4]} <= set(kept["text"].to_pylist())


def test_parquet_oversized_cell_and_corrupt_row_group(tmp_path: Path) -> None:
    texts = [json.loads(g)["text"] for g in good_lines()[:30]]
    texts[3] = "x" * (MAX_RECORD + 1)
    src = tmp_path / "src.parquet"
    pq.write_table(pa.table({"text": texts}), src, row_group_size=10, compression="zstd")
    meta = pq.ParquetFile(src).metadata.row_group(1).column(0)
    body = bytearray(src.read_bytes())
    start = meta.data_page_offset + 16
    body[start : start + 64] = b"\x5a" * 64  # garbage inside row group 1's first page
    counts, kept, rejected = run_map(tmp_path, "pq", {"docs.parquet": bytes(body)}, [])
    assert counts["docs_in"] == counts["kept"] + rejected.num_rows
    by_reason = {r["reason"]: r for r in rejected.to_pylist()}
    assert by_reason["record_too_large"]["id"] == "s/data/docs.parquet#3"
    assert by_reason["unreadable_input"]["id"] == "s/data/docs.parquet#10-19"
    assert set(kept["text"].to_pylist()) == {t for i, t in enumerate(texts) if i != 3 and not 10 <= i < 20}


@pytest.mark.slow
def test_a_gzipped_line_of_1_5_gib_is_rejected_in_bounded_memory(tmp_path: Path) -> None:
    good = good_lines()[:2]
    path = tmp_path / "huge.jsonl.gz"
    block = b"a" * (16 << 20)
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(good[0] + b"\n" + b'{"text":"')
        for _ in range(96):  # 1.5 GiB
            f.write(block)
        f.write(b'"}\n' + good[1] + b"\n")
    assert path.stat().st_size < 10 << 20
    script = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from datapipe.pipeline.load import SourceConfig\n"
        "from datapipe.readers import reader_spec, InputFile\n"
        "src = SourceConfig.model_validate({'name': 's', 'paths': ['x']})\n"
        "docs, rejects = [], []\n"
        "for b in reader_spec('jsonl').read(InputFile(Path(sys.argv[1]), 'huge.jsonl.gz', src), 1024):\n"
        "    docs += b.docs['id'].to_pylist()\n"
        "    rejects += b.rejects.select(['id', 'reason', 'detail']).to_pylist() if b.rejects else []\n"
        # VmHWM: this process's own peak since exec; ru_maxrss would carry the forking pytest's peak over.
        "hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
        "print(json.dumps({'docs': docs, 'rejects': rejects, 'maxrss_kb': hwm}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["docs"] == ["s/huge.jsonl.gz#L1", "s/huge.jsonl.gz#L3"]
    (reject,) = result["rejects"]
    assert reject["id"] == "s/huge.jsonl.gz#L2" and reject["reason"] == "record_too_large"
    assert f"{96 * (16 << 20) + 11:,} bytes" in reject["detail"]
    print(f"peak RSS reading a 1.5 GiB line: {result['maxrss_kb'] / 1024:.0f} MiB")
    assert result["maxrss_kb"] < 600 * 1024  # default cap 64 MiB: far under 1 GB (the line alone is 1.5 GiB)


def test_pipeline_run_over_hostile_files_completes_and_conserves(ray_local, tmp_path: Path) -> None:
    from datapipe.engine.runner import run_pipeline

    good = good_lines()
    project = tmp_path / "project"
    data = project / "data"
    data.mkdir(parents=True)
    write_jsonl(
        data / "mixed.jsonl", good[:12] + [b[1] for b in BAD[:8]] + [json.dumps({"text": t}).encode() for t in ODD_TEXTS[:5]]
    )
    (data / "long.jsonl.gz").write_bytes(
        gzip.compress(b"\n".join([good[12], b'{"text":"' + b"z" * (MAX_RECORD + 5) + b'"}', deep(50_000), good[13]]) + b"\n")
    )
    texts = [json.loads(g)["text"] for g in good[14:24]] + ["y" * (MAX_RECORD + 1)]
    pq.write_table(pa.table({"text": texts}), data / "table.parquet")
    write_jsonl(data / "clean.jsonl", good[24:])
    config = {
        "name": "hostile",
        "sources": [{"name": "web", "kind": "web", "paths": ["data/*"]}],
        "stages": [*STAGES_USED, {"dedup": {"exact": True}}],
        "tokenize": {"tokenizer": str(PROJECT_ROOT / "tokenizer" / "demo.json"), "seq_len": 64},
        "limits": {"max_record_bytes": MAX_RECORD},
    }
    pipeline = write_pipeline(project, config)
    before = _tree(project, exclude=project / "out")
    result = run_pipeline(load_pipeline(pipeline), output=project / "out", show_progress=False, log=lambda m: None)
    assert _tree(project, exclude=project / "out") == before
    n_inputs = 12 + 8 + 5 + 4 + 11 + len(good[24:])
    counts = result.run["counts"]
    assert counts["documents"] == n_inputs == counts["kept"] + counts["rejected"]
    read = {s["stage"]: s["rejected"] for s in counts["stages"]}["read"]
    assert read == {"invalid_unicode": 4, "too_deeply_nested": 4, "invalid_utf8": 1, "record_too_large": 2}
    assert not any("record_error" in s["rejected"] for s in counts["stages"])


def test_a_reader_that_raises_mid_file_leaves_one_reject_for_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from datapipe.readers import READER_SPECS, reader_spec

    real = reader_spec("jsonl").read

    def flaky(file, batch_size):  # type: ignore[no-untyped-def]
        yield from real(file, batch_size)
        raise RuntimeError("reader bug after the last batch")

    good = good_lines()[:5]
    with READER_SPECS.override(replace(reader_spec("jsonl"), read=flaky)):
        counts, kept, rejected = run_map(tmp_path, "flaky", {"a.jsonl": b"\n".join(good)}, [])
    assert counts["docs_in"] == 6 == counts["kept"] + rejected.num_rows
    (row,) = rejected.to_pylist()
    assert (row["id"], row["reason"]) == ("s/data/a.jsonl#after-5", "reader_error")
    assert "RuntimeError: reader bug" in row["detail"]

    def broken(file, batch_size):  # type: ignore[no-untyped-def]
        raise RuntimeError("reader cannot start")
        yield

    with (
        READER_SPECS.override(replace(reader_spec("jsonl"), read=broken)),
        pytest.raises(RuntimeError, match="reader cannot start"),
    ):
        run_map(tmp_path, "broken_reader", {"a.jsonl": b"\n".join(good)}, [])


def test_ids_do_not_depend_on_where_the_data_lies(tmp_path: Path) -> None:
    """Issue 16 item 4: inputs outside the pipeline folder, by absolute path, by glob and through a
    symlink, get ids without an absolute path or '//', the same when the data is reached another way."""
    corpus = shared_path("corpus")
    alias = tmp_path / "mnt" / "elsewhere"
    alias.parent.mkdir()
    alias.symlink_to(corpus.parent, target_is_directory=True)  # the same data at another absolute path
    ids = []
    for root in (corpus.parent.resolve(), alias):
        project = tmp_path / f"project-{len(ids)}"
        project.mkdir()
        (project / "link").symlink_to(root, target_is_directory=True)
        config = {
            "name": "ids",
            "sources": [
                {"name": "abs", "paths": [str(root / "corpus" / "zh_oiwiki.jsonl")]},
                {"name": "glob", "paths": [str(root / "corpus" / "zh_*.jsonl")]},
                {"name": "deep", "paths": [str(root / "**" / "gaokao-geography.jsonl")], "text_field": "question"},
                {"name": "linked", "paths": ["link/corpus/zh_wikipedia.jsonl"]},
            ],
        }
        spec = make_spec(load_pipeline(write_pipeline(project, config)), project / "out", tmp_path / "cache")
        names = {(s.source.name, r.input_name) for s in spec.shards for r in s.inputs}
        assert names == {
            ("abs", "zh_oiwiki.jsonl"),
            ("glob", "zh_oiwiki.jsonl"),
            ("glob", "zh_pingcap_docs.jsonl"),
            ("glob", "zh_wikipedia.jsonl"),
            ("deep", "benchmarks/agieval/gaokao-geography.jsonl"),
            ("linked", "link/corpus/zh_wikipedia.jsonl"),
        }
        # The ids themselves, as the reader writes them.
        shard = next(s for s in spec.shards if s.source.name == "abs")
        marker_ids = _first_ids(spec, shard)
        assert all("//" not in i and str(root) not in i and not i.split("/", 1)[1].startswith("/") for i in marker_ids)
        ids.append(marker_ids)
    assert ids[0] == ids[1] and ids[0][0] == "abs/zh_oiwiki.jsonl#L1"


def _first_ids(spec: Any, shard: Any) -> list[str]:
    from datapipe.readers import InputFile, reader_spec

    batch = next(reader_spec(shard.format).read(InputFile(Path(shard.path), shard.input_name, shard.source, spec.limits), 5))
    return batch.docs["id"].to_pylist()[:5]


def test_two_inputs_that_would_share_a_name_are_a_config_error(tmp_path: Path) -> None:
    from datapipe.pipeline.load import ConfigError

    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "x.jsonl").write_text('{"text": "t"}\n')
    project = tmp_path / "project"
    project.mkdir()
    config = {"name": "clash", "sources": [{"name": "s", "paths": [str(a / "x.jsonl"), str(b / "x.jsonl")]}]}
    with pytest.raises(ConfigError, match="would both be named 'x.jsonl'"):
        load_pipeline(write_pipeline(project, config))


def test_the_tokenizer_raising_on_one_document_rejects_only_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = map_task.encode_documents

    def encode(texts, info, arrow=None):  # type: ignore[no-untyped-def]
        if any("POISON" in t for t in texts):
            raise RuntimeError("tokenizer cannot encode POISON")
        return real(texts, info, arrow)

    monkeypatch.setattr(map_task, "encode_documents", encode)
    good = good_lines()[:20]
    mixed = good[:7] + [json.dumps({"text": "POISON for the tokenizer"}).encode()] + good[7:]
    _, clean_kept, _ = run_map(tmp_path, "clean", {"a.jsonl": b"\n".join(good)}, [])
    counts, kept, rejected = run_map(tmp_path, "tok", {"a.jsonl": b"\n".join(mixed)}, [])
    assert counts["docs_in"] == 21 == counts["kept"] + rejected.num_rows
    (row,) = rejected.to_pylist()
    assert (row["stage"], row["reason"], row["text"]) == ("tokenize", "record_error", "POISON for the tokenizer")
    assert _comparable(kept) == _comparable(clean_kept)  # n_tokens and split included


def test_the_common_reader_path_turns_unstorable_values_into_rejects() -> None:
    """Every reader goes through BatchBuilder/ColumnsBuilder: a value Arrow cannot store rejects
    its record only (invalid_unicode for lone surrogates, record_error for a mistyped column)."""
    from datapipe.pipeline.load import SourceConfig
    from datapipe.readers.base import InputFile
    from datapipe.readers.columns import ColumnsBuilder

    src = SourceConfig.model_validate({"name": "s", "paths": ["x"]})
    out = ColumnsBuilder.create(InputFile(Path("f.jsonl"), "f.jsonl", src), 100, {"n": "int32", "d": "string"})
    out.add_row(1, "kept", n=3, d="x")
    out.add_row(2, "mistyped", n="three", d="y")
    out.add_row(3, "surrogate \ud800", n=1, d="z")
    out.add_row(4, "surrogate in a provenance column", n=1, d="\udfff")
    out.add_row(5, "also kept", n=None, d=None)
    out.reject_row(6, "malformed_json", "cut", "raw \udc00 line")
    batch = out.flush()
    assert batch is not None and batch.rejects is not None
    assert batch.docs.select(["id", "n", "d"]).to_pylist() == [
        {"id": "s/f.jsonl#1", "n": 3, "d": "x"},
        {"id": "s/f.jsonl#5", "n": None, "d": None},
    ]
    rejects = {r["id"]: r for r in batch.rejects.to_pylist()}
    assert {i: r["reason"] for i, r in rejects.items()} == {
        "s/f.jsonl#2": "record_error",
        "s/f.jsonl#3": "invalid_unicode",
        "s/f.jsonl#4": "invalid_unicode",
        "s/f.jsonl#6": "malformed_json",
    }
    assert rejects["s/f.jsonl#3"]["text"] == "surrogate \\ud800"  # kept for debugging, escaped
    assert rejects["s/f.jsonl#4"]["detail"].startswith("d: surrogates not allowed")
    assert out.flush() is None  # nothing left behind for a later batch


def test_the_funnel_shows_tokenize_only_when_the_tokenizer_rejected_documents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datapipe.engine.finish import collect_counts
    from datapipe.run_folder.layout import RunFolder

    real = map_task.encode_documents
    for poison in (False, True):

        def encode(texts, info, arrow=None, poison=poison):  # type: ignore[no-untyped-def]
            if poison and any("POISON" in t for t in texts):
                raise RuntimeError("tokenizer cannot encode POISON")
            return real(texts, info, arrow)

        monkeypatch.setattr(map_task, "encode_documents", encode)
        project = tmp_path / f"funnel-{poison}"
        (project / "data").mkdir(parents=True)
        write_jsonl(project / "data" / "a.jsonl", good_lines()[:4] + [b'{"text":"POISON here"}'])
        config = {
            "name": "funnel",
            "sources": [{"name": "s", "paths": ["data/*"]}],
            "stages": [{"length": {}}],
            "tokenize": {"tokenizer": str(PROJECT_ROOT / "tokenizer" / "demo.json"), "seq_len": 64},
        }
        spec = make_spec(load_pipeline(write_pipeline(project, config)), project / "out", tmp_path / "cache")
        folder = RunFolder(project / "out")
        marker = map_shard(spec, spec.shards[0], spec.segments[0])
        folder.markers.write("map0", spec.shards[0].key, marker)
        counts = collect_counts(folder, spec)
        names = [s["stage"] for s in counts["stages"]]
        assert counts["documents"] == 5 == counts["kept"] + counts["rejected"]
        if poison:
            assert names == ["read", "length", "tokenize"]
            assert counts["stages"][2]["in"] == 5 and counts["stages"][2]["rejected"] == {"record_error": 1}
        else:
            assert names == ["read", "length"]


def test_parquet_binary_text_that_is_not_utf8_rejects_only_its_rows(tmp_path: Path) -> None:
    texts = [json.loads(g)["text"].encode() for g in good_lines()[:6]]
    cells = texts[:2] + [b"\xff\xfe not UTF-8", b"\xed\xa0\x80 surrogate bytes"] + texts[2:]
    src = tmp_path / "bin.parquet"
    pq.write_table(pa.table({"text": pa.array(cells, pa.binary())}), src)
    counts, kept, rejected = run_map(tmp_path, "pqbin", {"bin.parquet": src.read_bytes()}, [])
    assert counts["docs_in"] == 8 == counts["kept"] + rejected.num_rows
    assert {(r["id"], r["reason"]) for r in rejected.to_pylist()} == {
        ("s/data/bin.parquet#2", "invalid_utf8"),
        ("s/data/bin.parquet#3", "invalid_utf8"),
    }
    assert kept["text"].to_pylist() == [t.decode() for t in texts]


def test_bounded_lines_equals_splitting_whole_lines_for_any_chunking() -> None:
    import io
    import random

    from datapipe.readers.streams import LineTooLong, bounded_lines

    rng = random.Random(7)
    for _ in range(300):
        lines = [b"x" * rng.choice([0, 1, 5, 30, 31, 32, 33, 200]) for _ in range(rng.randint(0, 12))]
        data = b"\n".join(lines) + (b"\n" if rng.random() < 0.5 else b"")
        cap, chunk = rng.choice([8, 31, 32, 64]), rng.choice([1, 3, 16, 64, 1024])
        got = [
            (x.size, x.head) if isinstance(x, LineTooLong) else x
            for x in bounded_lines(io.BytesIO(data), cap, 1 << 30, head=4, chunk=chunk)
        ]
        want = [(len(ln), ln[:4]) if len(ln) > cap else ln for ln in data.split(b"\n")]
        if data.endswith(b"\n") or not data:
            want = want[:-1]
        assert got == want, (cap, chunk, lines)
