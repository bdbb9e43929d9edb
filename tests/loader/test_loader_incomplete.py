"""The loader refuses a run folder whose run.json does not say complete (issue 37, item 4): a run
being rerun still holds the shards and manifest of its last attempt, which may be rewritten or
missing by now. ``allow_incomplete=True`` reads them on purpose."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from datapipe.loader import PackedDataset, RunIncomplete
from tests.support.small_real_run import real_pipeline, run_in_process


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("real")
    out = tmp / "out"
    run_in_process(real_pipeline(tmp), out)
    return out


def _as_running(run: Path, to: Path) -> Path:
    shutil.copytree(run, to)
    record = json.loads((to / "run.json").read_text(encoding="utf-8"))
    record["status"] = "running"  # as `datapipe run` leaves it while a rerun is going, or after a kill
    (to / "run.json").write_text(json.dumps(record), encoding="utf-8")
    return to


def test_a_running_run_is_refused_unless_allowed(real_run: Path, tmp_path: Path) -> None:
    ds = PackedDataset(real_run, backend="numpy", batch_size=4)  # complete: read as ever
    assert next(iter(ds))["input_ids"].shape[0] == 4
    running = _as_running(real_run, tmp_path / "running")
    for source in (running, running / "shards", running / "shards" / "manifest.parquet"):
        with pytest.raises(RunIncomplete, match="not complete.*status 'running'") as info:
            PackedDataset(source, backend="numpy", batch_size=4)
        assert info.value.exit_code == 2 and "allow_incomplete=True" in (info.value.hint or "")
    ds = PackedDataset(running, backend="numpy", batch_size=4, allow_incomplete=True)
    assert next(iter(ds))["input_ids"].shape[0] == 4


def test_an_unreadable_run_json_is_refused(real_run: Path, tmp_path: Path) -> None:
    broken = _as_running(real_run, tmp_path / "broken")
    (broken / "run.json").write_bytes((real_run / "run.json").read_bytes()[:40])  # truncated
    with pytest.raises(RunIncomplete, match="run.json is unreadable"):
        PackedDataset(broken, backend="numpy", batch_size=4)
