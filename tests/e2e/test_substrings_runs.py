"""The substrings stage in whole runs: byte-identical outputs in this process (one worker), on Ray with
two workers, and after a SIGKILL in the middle of its shuffle rounds and a resume; its columns reach
the documents table, ``explain`` and the report."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from datapipe.audit.sql import connect as connect_stats
from datapipe.engine.runner import run_pipeline
from datapipe.pipeline.load import load_pipeline
from tests.conftest import write_pipeline
from tests.dedup.test_substrings import MIN_TOKENS, planted_corpus


def _project(tmp_path: Path) -> Path:
    docs, _ = planted_corpus()
    docs.append(docs[3][:400])  # a short copy: left with nothing, rejected as substring_only
    (tmp_path / "data").mkdir()
    for f in range(3):
        chunk = docs[f::3]
        (tmp_path / "data" / f"p{f}.jsonl").write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in chunk))
    return write_pipeline(
        tmp_path,
        {
            "name": "ss",
            "sources": [{"name": "web", "kind": "web", "paths": ["data/*.jsonl"]}],
            "split": {"target_bytes": 1 << 30, "group_small_files": False},
            "stages": [{"substrings": {"min_tokens": MIN_TOKENS, "partitions": 2}}],
        },
    )


def outputs(out: Path) -> dict[str, str]:
    """Every file a user reads of the run (kept and rejected documents), by its bytes."""
    return {
        p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for folder in ("docs", "rejected")
        for p in sorted((out / folder).glob("**/*.parquet"))
    }


def test_runs_are_byte_identical_in_process_on_two_ray_workers_and_after_a_kill(ray_local, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from datapipe.cli import main

    pipeline = _project(tmp_path)
    one = tmp_path / "one"
    run_pipeline(load_pipeline(pipeline), output=one, show_progress=False, log=lambda m: None, in_process=True)
    two = tmp_path / "two"
    run_pipeline(load_pipeline(pipeline), output=two, show_progress=False, log=lambda m: None)
    assert outputs(one) == outputs(two) and outputs(one)

    # Killed after the first task of round 3, then resumed: the same bytes, the finished rounds not redone.
    killed = tmp_path / "killed"
    args = [sys.executable, "-m", "datapipe.cli", "run", str(pipeline), "--output", str(killed), "--in-process", "--no-progress"]
    proc = subprocess.run(
        args, capture_output=True, text=True, timeout=300, env={**os.environ, "DATAPIPE_FAULT_KILL_AT": "shuffle0r3:1"}
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "already done" in proc.stderr
    assert outputs(killed) == outputs(one)

    with connect_stats(two) as con:
        n, spans, chars, short = con.execute(
            "select count(*), sum(substr_spans_removed), sum(substr_chars_removed), "
            "count(*) filter (reason = 'substring_only') from documents"
        ).fetchone()
        assert n == 47 and spans >= 10 and chars > 1000 and short >= 1
        top = con.execute("select count(*), count(distinct id) from removed_spans").fetchone()
        assert top[0] >= 10 and top[1] >= 9
        doc_id = con.execute("select id from documents where substr_spans_removed > 0 order by id limit 1").fetchone()[0]
    result = CliRunner().invoke(main, ["explain", str(two), doc_id])
    assert result.exit_code == 0 and "substr_chars_removed" in result.output and "substr_removed" in result.output
    page = tmp_path / "r.html"
    result = CliRunner().invoke(main, ["report", str(two), "--html", str(page)])
    assert result.exit_code == 0, result.output
    html = page.read_text(encoding="utf-8")
    assert "Repeated spans removed" in html and "most removed span" in html
