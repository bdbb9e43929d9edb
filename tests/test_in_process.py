"""`datapipe run --in-process`: every task in the driver, no Ray started, the same outputs as a
resumed run would expect (markers, run.json, conservation)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb

from tests.conftest import write_pipeline

ROOT = Path(__file__).resolve().parent.parent


def test_in_process_run_completes_without_importing_ray(tmp_path: Path) -> None:
    demo = sorted((ROOT / "pipelines" / "demo" / "data").glob("web_*.jsonl"))[:2]
    lines = [line for path in demo for line in path.read_text(encoding="utf-8").splitlines()[:15]]
    (tmp_path / "docs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    pipeline = write_pipeline(tmp_path, {
        "name": "t", "sources": [{"name": "web", "kind": "web", "paths": ["docs.jsonl"]}],
        "stages": [{"langid": {"keep": ["zh", "en"]}}, {"length": {"min_chars": 20}}, {"dedup": {"exact": True}}],
        "tokenize": {"tokenizer": str(ROOT / "tokenizer" / "demo.json"), "seq_len": 128}})
    out = tmp_path / "out"
    probe = ("import sys\nfrom datapipe.cli import main\ntry:\n    main()\nexcept SystemExit as e:\n"
             "    assert not e.code, e.code\nprint('RAY_IMPORTED', 'ray' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", probe, "run", str(pipeline), "--output", str(out), "--in-process",
                           "--no-progress"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "RAY_IMPORTED False" in proc.stdout
    assert "in this process (no Ray)" in proc.stderr
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "complete"
    assert run["counts"]["documents"] == len(lines) == run["counts"]["kept"] + run["counts"]["rejected"]
    assert {"map0", "shuffle0", "map1", "pack"} <= set(run["timings"])  # dedup decides in its partitions
    with duckdb.connect(str(out / "stats.duckdb"), read_only=True) as con:
        assert con.execute("select count(*) from documents").fetchone()[0] == len(lines)
    assert list((out / "shards").glob("*/*")), "no token shards written"
    # Running again finds every task done and starts nothing.
    again = subprocess.run([sys.executable, "-m", "datapipe.cli", "run", str(pipeline), "--output", str(out),
                            "--in-process", "--no-progress"], capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0 and "already done" in again.stderr
