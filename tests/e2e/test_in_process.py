"""`datapipe run --in-process`: every task in the driver, no Ray started, the same outputs as a
resumed run would expect (markers, run.json, conservation)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from datapipe.audit.sql import connect as connect_stats
from tests.conftest import write_pipeline

ROOT = Path(__file__).resolve().parents[2]


def test_in_process_run_completes_without_importing_ray(tmp_path: Path) -> None:
    demo = sorted((ROOT / "pipelines" / "demo" / "data").glob("web_*.jsonl"))[:2]
    lines = [line for path in demo for line in path.read_text(encoding="utf-8").splitlines()[:15]]
    (tmp_path / "docs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    pipeline = write_pipeline(
        tmp_path,
        {
            "name": "t",
            "sources": [{"name": "web", "kind": "web", "paths": ["docs.jsonl"]}],
            "stages": [{"langid": {"keep": ["zh", "en"]}}, {"length": {"min_chars": 20}}, {"dedup": {"exact": True}}],
            "tokenize": {"tokenizer": str(ROOT / "tokenizer" / "demo.json"), "seq_len": 128},
        },
    )
    out = tmp_path / "out"
    # main.main: click's entry point, which returns by SystemExit (calling ``main()`` as a program
    # ends the process with os._exit once the command is done, before the probe could print).
    probe = (
        "import sys\nfrom datapipe.cli import main\ntry:\n    main.main()\nexcept SystemExit as e:\n"
        "    assert not e.code, e.code\nprint('RAY_IMPORTED', 'ray' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-c", probe, "run", str(pipeline), "--output", str(out), "--in-process", "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "RAY_IMPORTED False" in proc.stdout
    assert "in this process (no Ray)" in proc.stderr
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "complete"
    assert run["counts"]["documents"] == len(lines) == run["counts"]["kept"] + run["counts"]["rejected"]
    assert {"map0", "shuffle0", "map1", "pack"} <= set(run["timings"])  # dedup decides in its partitions
    # The driver's own CPU by section: the start (imports, planning), each phase's parts, the end; in
    # this process tasks are not handed over, so a phase's parts are its results and its commit.
    sections = run["driver_cpu_s"]
    assert {"start", "phase:map0:results", "phase:map0:commit", "phase:pack:results", "end"} <= set(sections)
    assert not any(s.endswith((":plan", ":submit")) for s in sections), sections
    assert sections["start"] > 0 and all(v >= 0 for v in sections.values())
    with connect_stats(out) as con:
        assert con.execute("select count(*) from documents").fetchone()[0] == len(lines)
    assert list((out / "shards").glob("*/*")), "no token shards written"
    # Running again finds every task done and starts nothing.
    again = subprocess.run(
        [sys.executable, "-m", "datapipe.cli", "run", str(pipeline), "--output", str(out), "--in-process", "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert again.returncode == 0 and "already done" in again.stderr


def _two_source_pipeline(tmp_path: Path) -> Path:
    demo = sorted((ROOT / "pipelines" / "demo" / "data").glob("web_*.jsonl"))[:2]
    sources = []
    for i, path in enumerate(demo):
        (tmp_path / f"d{i}.jsonl").write_text(
            "\n".join(path.read_text(encoding="utf-8").splitlines()[:5]) + "\n", encoding="utf-8"
        )
        sources.append({"name": f"web{i}", "kind": "web", "paths": [f"d{i}.jsonl"]})
    return write_pipeline(tmp_path, {"name": "t", "sources": sources, "stages": [{"length": {"min_chars": 20}}]})


def test_default_runs_a_one_task_run_in_process_and_a_larger_one_on_ray(tmp_path: Path) -> None:
    """Without --in-process or --ray the driver decides from the plan: one map task leaves Ray
    nothing to overlap, so it runs here; two sources are two map tasks, so Ray."""
    from datapipe.engine.runner import _auto_in_process
    from datapipe.pipeline.load import load_pipeline
    from datapipe.run_folder.layout import RunFolder

    two = load_pipeline(_two_source_pipeline(tmp_path))
    folder = RunFolder(tmp_path / "out")
    assert not _auto_in_process(two, folder, None, cpus=2)
    one = two.config.model_copy(update={"sources": two.config.sources[:1]})
    single = write_pipeline(
        tmp_path,
        {
            "name": "t",
            "sources": [s.model_dump(exclude_defaults=True) for s in one.sources],
            "stages": [{"length": {"min_chars": 20}}],
        },
        name="one.yaml",
    )
    assert _auto_in_process(load_pipeline(single), folder, None, cpus=2)
    # No per-document stages (tokenize-only): the encoder's threads do what Ray's workers would.
    stageless = write_pipeline(
        tmp_path,
        {"name": "t", "sources": [s.model_dump(exclude_defaults=True) for s in two.config.sources], "stages": []},
        name="stageless.yaml",
    )
    assert _auto_in_process(load_pipeline(stageless), folder, None, cpus=2)

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "datapipe.cli", "run", str(single), "--output", str(tmp_path / "o"), "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "in this process (no Ray)" in proc.stderr
    assert json.loads((tmp_path / "o" / "run.json").read_text())["split"]["map_tasks"] == 1
