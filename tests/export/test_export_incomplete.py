"""Exports refuse an unfinished run unless told otherwise (issue 37, item 4), through the API and
the command line, on a small real-data run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from datapipe.cli import main
from datapipe.export import ExportError, export
from tests.support.small_real_run import real_pipeline, run_in_process


@pytest.fixture(scope="module")
def running_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("real")
    out = tmp / "out"
    run_in_process(real_pipeline(tmp), out)
    running = tmp / "running"
    shutil.copytree(out, running)
    record = json.loads((running / "run.json").read_text(encoding="utf-8"))
    record["status"] = "running"
    (running / "run.json").write_text(json.dumps(record), encoding="utf-8")
    return running


@pytest.mark.parametrize("fmt", ["megatron", "hf", "mds", "jsonl"])
def test_every_export_refuses_a_running_run_unless_allowed(running_run: Path, tmp_path: Path, fmt: str) -> None:
    with pytest.raises(ExportError, match="is not complete") as info:
        export(running_run, fmt, tmp_path / "refused")
    assert "--allow-incomplete" in (info.value.hint or "")
    assert not (tmp_path / "refused").exists()
    result = export(running_run, fmt, tmp_path / fmt, allow_incomplete=True)
    assert result.documents > 0


def test_cli_flag(running_run: Path, tmp_path: Path) -> None:
    args = ["export", str(running_run), "--format", "jsonl", "--output", str(tmp_path / "x"), "--no-progress"]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2 and "error: RUN: the run in" in refused.output and "hint:" in refused.output
    done = CliRunner().invoke(main, [*args, "--allow-incomplete"])
    assert done.exit_code == 0, done.output


def test_a_garbage_run_json_is_one_error(running_run: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(running_run, broken)
    (broken / "run.json").write_bytes(b'{"status": "comp')
    res = CliRunner().invoke(main, ["export", str(broken), "--format", "jsonl", "--output", str(tmp_path / "y")])
    assert res.exit_code == 2 and "run.json is unreadable" in res.output and "Traceback" not in res.output
