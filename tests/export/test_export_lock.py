"""Two exports into one folder (issue 37, item 7): the second is refused with one error naming the
holder, as a second driver of a run folder is, instead of sweeping the first's temporary files and
rewriting its manifest (the first then crashed with FileNotFoundError). The first finishes intact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from datapipe.cli import main
from tests.support.shared_data import PROJECT_ROOT
from tests.support.small_real_run import real_pipeline, run_in_process


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("real")
    run_in_process(real_pipeline(tmp), tmp / "out")
    return tmp / "out"


def test_a_second_export_into_the_same_folder_is_refused(real_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "export"
    args = ["export", str(real_run), "--format", "jsonl", "--output", str(out), "--docs-per-file", "10", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    first = subprocess.Popen(
        [sys.executable, "-m", "datapipe.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.time() + 300
        while not (out / "export-manifest.json").is_file():  # the first export has begun writing parts
            assert first.poll() is None and time.time() < deadline, first.communicate()
            time.sleep(0.005)
        first.send_signal(signal.SIGSTOP)  # stopped mid-export, wherever it was: it still holds the folder
        second = CliRunner().invoke(main, args)
        first.send_signal(signal.SIGCONT)
        assert second.exit_code == 1 and "Traceback" not in second.output, second.output
        errors = [line for line in second.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and f"export folder {out} is in use by another datapipe driver: pid {first.pid}" in errors[0], (
            second.output
        )
        _, err = first.communicate(timeout=300)
        assert first.returncode == 0, err
    finally:
        first.send_signal(signal.SIGCONT)
        first.kill()
    manifest = json.loads((out / "export-manifest.json").read_text(encoding="utf-8"))
    run = json.loads((real_run / "run.json").read_text(encoding="utf-8"))
    written = sum(len((out / f).read_text(encoding="utf-8").splitlines()) for p in manifest["parts"] for f in p["files"])
    assert written == run["counts"]["kept"]  # every kept document once: nothing lost or doubled
    again = CliRunner().invoke(main, args)  # the lock was released: the same command finds it all done
    assert again.exit_code == 0 and "0 files written" in again.output, again.output
