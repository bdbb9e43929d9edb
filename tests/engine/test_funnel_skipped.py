"""The funnel explains documents a stage skips by kind (issue 16, item 10): langid skips code.

A pipeline over real web pages (OI-wiki) and real code (HumanEval's 164 Python solutions, written
out as a repository folder of .py files), run map task by map task in-process (no Ray): each row's docs_in - dropped is the next row's docs_in, and the
code documents that langid and a web-only pii stage passed untouched show as `skipped`.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from rich.console import Console

from datapipe.audit.sql import connect as connect_stats
from datapipe.cli.summary import print_summary
from datapipe.engine.finish import build_stats, collect_counts
from datapipe.engine.plan import make_spec
from datapipe.engine.runner import RunResult
from datapipe.engine.tasks.map import map_shard
from datapipe.pipeline.load import load_pipeline
from datapipe.run_folder.layout import RunFolder
from tests.conftest import write_pipeline
from tests.support.shared_data import shared_path


def humaneval_repo(folder: Path) -> Path:
    repo = folder / "humaneval"
    repo.mkdir()
    with gzip.open(shared_path("benchmarks", "HumanEval.jsonl.gz"), "rt", encoding="utf-8") as f:
        for line in f:
            task = json.loads(line)
            name = task["task_id"].replace("/", "_") + ".py"
            (repo / name).write_text(task["prompt"] + task["canonical_solution"], encoding="utf-8")
    return repo


def test_funnel_counts_skipped_kinds_and_adds_up(tmp_path: Path) -> None:
    config = {
        "name": "mixed",
        "sources": [
            {"name": "oiwiki", "kind": "web", "paths": [str(shared_path("corpus", "zh_oiwiki.jsonl"))]},
            {"name": "humaneval", "kind": "code", "paths": [str(humaneval_repo(tmp_path))]},
        ],
        "stages": [{"langid": {"keep": ["zh"], "min_score": 0.9}}, {"length": {"min_chars": 200}}, {"pii": {"kinds": ["web"]}}],
    }
    pipeline = load_pipeline(write_pipeline(tmp_path, config))
    spec = make_spec(pipeline, tmp_path / "out", tmp_path / "cache")
    folder = RunFolder(tmp_path / "out")
    (segment,) = spec.segments
    for shard in spec.shards:
        folder.markers.write("map0", shard.key, map_shard(spec, shard, segment))
    counts = collect_counts(folder, spec)
    build_stats(folder, spec, counts)

    read, langid, length, pii = counts["stages"]
    code_in = counts["sources"]["humaneval"]["documents"]
    assert code_in == 164 and counts["sources"]["oiwiki"]["documents"] == 460
    assert langid["in"] == read["in"] - sum(read["rejected"].values())
    assert langid["skipped"] == code_in  # every code document passed langid untouched
    assert sum(langid["rejected"].values()) > 0  # some OI-wiki pages are dropped (low language score)
    for before, after in ((read, langid), (langid, length), (length, pii)):
        assert after["in"] == before["in"] - sum(before["rejected"].values())
    short_code = 164 - counts["sources"]["humaneval"]["kept"]
    assert 0 < short_code < 164 and length["skipped"] == 0
    assert pii["skipped"] == code_in - short_code  # code surviving length, passed by the web-only pii stage

    with connect_stats(folder.root) as con:
        rows = con.execute("SELECT DISTINCT position, stage, docs_in, skipped, docs_out FROM funnel ORDER BY position").fetchall()
        stages = con.execute("SELECT stage, docs_in, skipped, dropped FROM stages ORDER BY position").fetchall()
        langid_share = con.execute("SELECT sum(drop_share) FROM funnel WHERE stage = 'langid'").fetchone()[0]
    assert [r[1] for r in rows] == ["read", "langid", "length", "pii"]
    assert all(rows[i][4] == rows[i + 1][2] for i in range(len(rows) - 1))
    assert rows[1][3] == code_in and stages[1] == ("langid", langid["in"], code_in, sum(langid["rejected"].values()))
    # The drop share is of the documents langid judged (the web pages), not diluted by skipped code.
    assert langid_share == pytest.approx(sum(langid["rejected"].values()) / (langid["in"] - code_in), abs=1e-5)

    console = Console(record=True, width=200)
    print_summary(RunResult(folder.root, {"counts": counts}), console)
    text = console.export_text()
    assert "skipped" in text
    langid_line = next(line for line in text.splitlines() if " langid " in line)
    assert f"{code_in:,}" in langid_line and f"{langid['in']:,}" in langid_line
