"""End-to-end runs in this process (one shared embedded Ray): outputs, conservation, determinism, bad inputs."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from datapipe.audit.sql import connect as connect_stats
from datapipe.cli import main
from datapipe.engine.runner import PipelineError, run_pipeline
from datapipe.pipeline.load import load_pipeline
from datapipe.run_folder.layout import RunFolderError
from datapipe.tokens.shard_format import open_shard, tokens_view
from tests.conftest import DemoRun, write_pipeline
from tests.support.shared_data import PROJECT_ROOT

TOKENIZER = str(PROJECT_ROOT / "tokenizer" / "demo.json")


def run(pipeline_file: Path, output: Path, **kw):
    return run_pipeline(load_pipeline(pipeline_file), output=output, show_progress=False, log=lambda m: None, **kw)


def query(root: Path, sql: str) -> list[tuple]:
    with connect_stats(root) as con:
        return con.execute(sql).fetchall()


def input_records(files: list[Path]) -> int:
    return sum(1 for f in files for line in f.read_text(encoding="utf-8").splitlines() if line.strip())


def test_demo_run_outputs_and_conservation(demo_run: DemoRun) -> None:
    out, result = demo_run.out, demo_run.result
    files = sorted((demo_run.project / "pipelines" / "demo" / "data").glob("*.jsonl"))
    n_inputs = input_records(files)  # counted independently of the pipeline

    # Every input record is one row of `documents`, kept or rejected, exactly once.
    ((n, distinct, kept, rejected),) = query(
        out,
        "select count(*), count(distinct id), count(*) filter (status='kept'),"
        " count(*) filter (status='rejected') from documents",
    )
    assert n == distinct == n_inputs == kept + rejected
    assert result.run["counts"]["documents"] == n_inputs
    assert query(out, "select count(*) from documents where status='rejected' and (stage is null or reason is null)") == [(0,)]
    # docs/ and rejected/ hold the same rows as the table says.
    kept_files = pq.read_table(out / "docs").num_rows
    rejected_rows = sum(pq.read_table(p).num_rows for p in (out / "rejected").glob("**/*.parquet"))
    assert (kept_files, rejected_rows) == (kept, rejected)

    # The planted problems are caught by the right stage.
    reasons = dict(
        ((s, r), c)
        for s, r, c in query(out, "select stage, reason, count(*) from documents where status='rejected' group by all")
    )
    assert reasons[("read", "malformed_json")] == 2
    assert reasons[("read", "missing_text_field")] == 2
    assert reasons[("langid", "language_not_kept")] >= 8  # fr, de, ja, es in both sources
    assert reasons[("length", "too_short")] >= 1
    assert reasons[("dedup", "exact_duplicate")] >= 4
    langs = dict(query(out, "select lang, count(*) from documents where status='kept' group by all"))
    assert set(langs) == {"zh", "en"}
    # A duplicate names its survivor, which is kept and has the same normalized text.
    dup, survivor = query(out, "select id, dup_of from documents where reason='exact_duplicate' order by id limit 1")[0]
    assert query(out, f"select status from documents where id='{survivor}'") == [("kept",)]
    texts = {r["id"]: r["text"] for r in pq.read_table(out / "rejected").to_pylist() if r["id"] == dup}
    texts.update({r["id"]: r["text"] for r in pq.read_table(out / "docs").to_pylist() if r["id"] == survivor})
    assert " ".join(texts[dup].split()).lower() == " ".join(texts[survivor].split()).lower()

    # run.json records config, versions, input hashes and timings.
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "complete" and meta["packages"]["pyarrow"]
    assert set(meta["timings"]) >= {"map0", "shuffle0", "map1", "pack", "stats"}
    assert {i["sha256"] for i in meta["inputs"]} == {hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def test_packed_shards_decode_to_the_kept_documents(demo_run: DemoRun) -> None:
    from tokenizers import Tokenizer

    out = demo_run.out
    tok = Tokenizer.from_file(TOKENIZER)
    eos = tok.token_to_id("<|endoftext|>")
    manifest = pq.read_table(out / "shards" / "manifest.parquet").to_pylist()
    for source in ("web_zh", "web_en"):
        docs = pq.read_table(out / "docs" / source)  # files are in shard order, rows in input order
        expected = [t for t, s in zip(docs["text"].to_pylist(), docs["split"].to_pylist()) if s == "train"]
        streams = []
        for entry in sorted((m for m in manifest if m["source"] == source and m["split"] == "train"), key=lambda m: m["path"]):
            table, meta = open_shard(out / entry["path"])
            tokens = tokens_view(table)
            assert tokens.dtype == np.uint16 and meta.seq_len == 512 and tokens.shape[1] == 512
            assert not tokens.flags.owndata  # a view over the memory-mapped file, not a copy
            n_valid = table["n_tokens"].to_numpy()
            streams.extend(row[:n] for row, n in zip(tokens, n_valid))
            assert hashlib.sha256((out / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]
        stream = np.concatenate(streams)
        pieces = np.split(stream, np.flatnonzero(stream == eos) + 1)[:-1]
        assert [tok.decode(p[:-1].tolist()) for p in pieces] == expected


def test_two_runs_give_byte_identical_shards(demo_run: DemoRun, tmp_path: Path) -> None:
    # the session's demo run is the first; a second run of the same pipeline file into another folder
    a, b = demo_run.out, tmp_path / "b"
    run(demo_run.project / "pipelines" / "demo.yaml", b)

    def digests(root: Path) -> dict[str, str]:
        return {
            p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((root / "shards").glob("**/*.arrow"))
        }

    assert digests(a) and digests(a) == digests(b)
    for sub in ("docs", "rejected"):
        ta = pq.read_table(a / sub).sort_by("id")
        tb = pq.read_table(b / sub).sort_by("id")
        assert ta.equals(tb)


def test_unreadable_inputs_become_rejects_and_the_run_goes_on(ray_local, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    good = [{"text": f"document number {i} about rivers and bridges and the people who cross them"} for i in range(30)]
    (data / "good.jsonl").write_text("\n".join(json.dumps(r) for r in good) + "\n")
    rng = np.random.default_rng(0)
    words = ["river", "bridge", "lantern", "harbour", "meadow", "granite", "orchard", "compass", "falcon", "tide"]
    many = [{"text": " ".join(rng.choice(words, 40))} for _ in range(2000)]  # big enough to break mid-file
    blob = gzip.compress(("\n".join(json.dumps(r) for r in many) + "\n").encode())
    (data / "truncated.jsonl.gz").write_bytes(blob[: len(blob) // 2])  # breaks off mid-stream
    (data / "garbage.jsonl.gz").write_bytes(b"\x00\x01 this is not gzip at all")
    (data / "binary.parquet").write_bytes(b"PAR1 not really parquet PAR1")
    (data / "latin1.jsonl").write_bytes(b'{"text": "caf\xe9 au lait"}\n{"text": "fine text here"}\n')
    pipeline = write_pipeline(
        tmp_path,
        {
            "name": "bad_inputs",
            "sources": [
                {"name": "docs", "paths": ["data/*.jsonl", "data/*.jsonl.gz"]},
                {"name": "tables", "paths": ["data/*.parquet"]},
            ],
            "stages": [{"length": {"min_chars": 5}}],
        },
    )
    result = run(pipeline, tmp_path / "out")
    out = tmp_path / "out"
    rows = query(out, "select id, reason, detail from documents where stage='read' order by id")
    by_reason = {}
    for id_, reason, detail in rows:
        by_reason.setdefault(reason, []).append((id_, detail))
    assert {i for i, _ in by_reason["unreadable_input"]} >= {"docs/data/garbage.jsonl.gz#L1-", "tables/data/binary.parquet#0-"}
    assert any(i.startswith("docs/data/truncated.jsonl.gz#L") for i, _ in by_reason["unreadable_input"])
    assert by_reason["invalid_utf8"][0][0] == "docs/data/latin1.jsonl#L1"
    # The truncated file's complete lines before the break are kept.
    kept_truncated = query(out, "select count(*) from documents where status='kept' and id like '%truncated%'")[0][0]
    assert 0 < kept_truncated < 2000
    assert result.run["counts"]["kept"] == 30 + kept_truncated + 1


def test_changed_pipeline_is_refused_unless_fresh(ray_local, demo_project: Path) -> None:
    pipeline = demo_project / "pipelines" / "demo.yaml"
    out = demo_project / "out"
    run(pipeline, out)
    text = pipeline.read_text().replace("length: {min_chars: 20}", "length: {min_chars: 30}")
    pipeline.write_text(text)
    with pytest.raises(PipelineError) as info:
        run(pipeline, out)
    assert "stages[1].length.min_chars: 20 -> 30" in str(info.value)
    # As asked, the run cannot be done there: a usage error (exit 2), and only a threshold changed, so
    # the hint offers re-deciding from the recorded signals (issue 50 item 8).
    assert info.value.exit_code == 2
    assert "--fresh" in str(info.value) and f"--from {out}" in str(info.value.hint)
    res = CliRunner().invoke(main, ["run", str(pipeline), "--output", str(out), "--no-progress"])
    assert res.exit_code == 2 and "only thresholds changed" in res.output, res.output
    # A change other than a threshold: no --from offered.
    pipeline.write_text(text.replace("seq_len: 512", "seq_len: 256"))
    with pytest.raises(PipelineError) as info:
        run(pipeline, out)
    assert info.value.exit_code == 2 and info.value.hint is None
    pipeline.write_text(text)
    result = run(pipeline, out, fresh=True)
    assert result.run["config"]["stages"][1]["length"]["min_chars"] == 30


def test_rerun_of_a_finished_run_does_no_work(ray_local, demo_project: Path) -> None:
    pipeline = demo_project / "pipelines" / "demo.yaml"
    out = demo_project / "out"
    first = run(pipeline, out)
    second = run(pipeline, out)
    assert first.executed_tasks > 0 and second.executed_tasks == 0
    assert second.skipped_tasks == first.executed_tasks


def test_refuses_to_write_into_a_folder_that_is_not_a_run(ray_local, demo_project: Path) -> None:
    target = demo_project / "precious"
    target.mkdir()
    (target / "thesis.tex").write_text("do not delete")
    with pytest.raises(RunFolderError, match="not empty and holds no run.json"):
        run(demo_project / "pipelines" / "demo.yaml", target, fresh=True)
    assert (target / "thesis.tex").read_text() == "do not delete"


def test_sql_command_answers_and_refuses_writes(demo_run: DemoRun) -> None:
    out = demo_run.out
    runner = CliRunner()
    res = runner.invoke(main, ["sql", str(out), "select stage, reason, count(*) from documents group by all", "--format", "csv"])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines[0] == "stage,reason,count_star()" and "dedup,exact_duplicate," in res.output
    res = runner.invoke(
        main, ["sql", str(out), "select count(*) as n from kept_docs where text like '%城市%'", "--format", "json"]
    )
    assert res.exit_code == 0 and json.loads(res.output)["n"] > 0
    for statement in (
        "delete from documents",
        "drop table documents",
        "copy documents to 'x.csv'",
        "attach 'other.duckdb'",
        "create table t as select 1",
    ):
        res = runner.invoke(main, ["sql", str(out), statement])
        assert res.exit_code == 2, statement
        assert "read-only" in res.output
    assert query(out, "select count(*) from documents")[0][0] > 0
    assert not (out / "x.csv").exists()
    res = runner.invoke(main, ["sql", str(out), "select nope from documents"])
    assert res.exit_code == 2 and "SQL error" in res.output
