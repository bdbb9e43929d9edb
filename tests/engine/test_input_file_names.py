"""An input file whose name is not UTF-8 (issue 37, item 5): the run records it in run.json with its
bytes as \\xNN escapes (a stable name: a rerun finds the same inputs and resumes), instead of every
run failing with UnicodeEncodeError when run.json is written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support.shared_data import shared_path
from tests.support.small_real_run import real_pipeline, run_in_process


@pytest.mark.skipif(os.name != "posix", reason="byte file names are a POSIX thing")
def test_a_latin1_file_name_is_named_with_escapes_and_the_rerun_resumes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    name = os.fsdecode(b"caf\xe9-c4.jsonl")  # Latin-1 e-acute: not UTF-8, so a surrogate-escaped str
    shutil.copy(shared_path("en", "datajuicer_redpajama-c4-refined.jsonl"), data / name)
    shutil.copy(shared_path("en", "datajuicer_alpaca-cot.jsonl"), data / "alpaca.jsonl")
    pipeline = real_pipeline(tmp_path, en=[str(data / "*.jsonl")])
    out = tmp_path / "out"
    first = run_in_process(pipeline, out)
    assert first.run["status"] == "complete"
    record = json.loads((out / "run.json").read_bytes().decode("utf-8"))  # valid UTF-8 throughout
    paths = sorted(i["path"] for i in record["inputs"] if i["source"] == "en")
    assert paths == [str(data / "alpaca.jsonl"), str(data / "caf\\xe9-c4.jsonl")]
    assert all("sha256" in i for i in record["inputs"])  # the escaped name still finds its hash
    again = run_in_process(pipeline, out)  # the same name again: nothing changed, nothing redone
    assert again.executed_tasks == 0 and again.run["attempts"] == 2
