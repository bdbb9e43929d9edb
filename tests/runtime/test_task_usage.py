"""Per-task CPU and peak RSS in completion markers (datapipe/runtime/task_usage.py): the peak is the
task's own in a process that runs many tasks, not the process's lifetime peak."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from datapipe.runtime.task_usage import TaskUsage
from tests.conftest import write_pipeline

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def test_peak_belongs_to_the_task_that_reached_it() -> None:
    big = TaskUsage()
    block = bytearray(200 * MIB)  # zero-filled: every page touched
    block[::4096] = b"x" * len(block[::4096])
    del block
    first = big.finish()
    if not first:
        pytest.skip("no /proc/self/status here")
    assert first["peak_rss_mib"] - first["rss_start_mib"] >= 150
    second = TaskUsage().finish()
    if second["peak_scope"] != "task":
        pytest.skip("VmHWM cannot be reset here (/proc/self/clear_refs refused): peaks are per process")
    # The next task in the same process does not inherit the first one's 200 MiB peak.
    assert second["peak_rss_mib"] < first["peak_rss_mib"] - 150
    assert second["cpu_seconds"] >= 0


def test_every_marker_of_a_run_records_cpu_and_peak(tmp_path: Path) -> None:
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    demo = sorted((ROOT / "pipelines" / "demo" / "data").glob("web_*.jsonl"))[:2]
    lines = [line for path in demo for line in path.read_text(encoding="utf-8").splitlines()[:15]]
    (tmp_path / "docs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    pipeline = write_pipeline(
        tmp_path,
        {
            "name": "t",
            "sources": [{"name": "web", "kind": "web", "paths": ["docs.jsonl"]}],
            "stages": [{"dedup": {"exact": True, "partitions": 2}}, {"minhash": {"partitions": 2}}],
            "tokenize": {"tokenizer": str(ROOT / "tokenizer" / "demo.json"), "seq_len": 128},
        },
    )
    out = tmp_path / "out"
    run_pipeline(load_pipeline(pipeline), output=out, in_process=True, show_progress=False, log=lambda m: None)
    markers = {p: json.loads(p.read_text()) for p in (out / "_work" / "markers").glob("**/*.json")}
    phases = {p.relative_to(out / "_work" / "markers").parts[0] for p in markers}
    assert {"map0", "shuffle0", "map1", "shuffle1", "reduce1", "map2", "pack"} <= phases
    for path, marker in markers.items():
        assert marker["cpu_seconds"] >= 0, path
        if "peak_rss_mib" in marker:  # absent only where /proc/self/status is
            assert marker["peak_rss_mib"] >= marker["rss_start_mib"] > 0, path
