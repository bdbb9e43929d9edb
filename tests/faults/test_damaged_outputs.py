"""Complete means complete (issue 37): finished work whose files are damaged or gone is found when
a run starts again, discarded and redone, so the outputs are those of a clean run; or the run stops
with one error naming the file. Never rc 0 over damaged outputs, never a folder stuck for ever.

All on a small real-data run in process (tests/support/small_real_run.py): outputs of every kind
(shards, kept and rejected documents) and intermediates (a map output, token lists) damaged the ways
disks and people damage them: truncated, deleted, a byte flipped in place, garbage.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from datapipe.cli import main
from tests.support.damage import flip_data_page
from tests.support.shared_data import PROJECT_ROOT
from tests.support.small_real_run import output_digests, real_pipeline, run_in_process


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """(pipeline file, a clean complete run folder, the digests of its outputs)."""
    tmp = tmp_path_factory.mktemp("clean")
    pipeline = real_pipeline(tmp)
    run_in_process(pipeline, tmp / "out")
    return pipeline, tmp / "out", output_digests(tmp / "out")


def _flip(path: Path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0xFF  # one byte, same size: only a checksum tells
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])


def _first(out: Path, pattern: str) -> Path:
    return sorted(out.glob(pattern))[0]


DAMAGES: dict[str, Callable[[Path], None]] = {
    "truncated shard": lambda out: _truncate(_first(out, "shards/zh/train-*.arrow")),
    "deleted shard": lambda out: _first(out, "shards/en/train-*.arrow").unlink(),
    "flipped shard byte": lambda out: _flip(_first(out, "shards/zh/train-0001*.arrow")),
    "flipped docs page": lambda out: _flip(out / "docs" / "zh" / "00000.parquet", 0.3),
    "garbage docs parquet": lambda out: (out / "docs" / "en" / "00000..00005.parquet").write_bytes(b"PAR1 garbage PAR1"),
    "deleted rejected file": lambda out: _first(out, "rejected/en/*-dedup.parquet").unlink(),
    "truncated token list": lambda out: _truncate(out / "_work" / "tokens" / "zh" / "00000.arrow"),
    "truncated map output": lambda out: _truncate(_first(out, "_work/map0/en/*.parquet")),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_rerun_of_a_complete_run_redoes_damaged_work(clean, tmp_path: Path, damage: str) -> None:
    pipeline, done, expected = clean
    out = tmp_path / "out"
    shutil.copytree(done, out)
    DAMAGES[damage](out)
    res = CliRunner().invoke(main, ["run", str(pipeline), "--output", str(out), "--in-process", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "; redoing " in res.output  # said what was damaged and what is redone
    assert output_digests(out) == expected


def _flip_bit(path: Path) -> None:
    """One bit flipped in the middle of a file's data (a Parquet file: in a column's pages, not its footer)."""
    if path.suffix == ".parquet":
        flip_data_page(path)
        return
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x08
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_truncate, _flip_bit], ids=["truncated", "one bit flipped"])
def test_a_damaged_intermediate_of_an_unfinished_run_is_redone(clean, tmp_path: Path, damage: Callable[[Path], None]) -> None:
    """Killed after the first task of the last map phase; then the map output the other shard's last
    map task reads and the token list of the finished one are truncated, or get one bit flipped (size
    kept: only a checksum tells). The rerun used to fail in those tasks every time while saying "run
    the same command again to resume" (a flipped bit: `OSError: Corrupt Lz4 compressed data`, or other
    values read without an error)."""
    pipeline, _, expected = clean
    out = tmp_path / "out"
    env = {
        **os.environ,
        "DATAPIPE_FAULT_KILL_AT": "map1:1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])),
    }
    killed = subprocess.run(
        [sys.executable, "-m", "datapipe.cli", "run", str(pipeline), "--output", str(out), "--in-process", "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    done = {p.stem for p in (out / "_work" / "markers" / "map1").rglob("*.json")}
    assert len(done) == 1  # one shard of the last map phase finished: its token list awaits packing
    pending = "en" if (out / "_work" / "markers" / "map1" / "zh").is_dir() else "zh"
    finished = "zh" if pending == "en" else "en"
    damage(_first(out, f"_work/map0/{pending}/*.parquet"))  # the input of the pending map1 task
    damage(_first(out, f"_work/tokens/{finished}/*.arrow"))  # the input of packing
    res = CliRunner().invoke(main, ["run", str(pipeline), "--output", str(out), "--in-process", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert f"redoing map0 {pending}/" in res.output and f"redoing map1 {finished}/" in res.output
    assert output_digests(out) == expected


@pytest.mark.parametrize("content", [b"", b'{"name": "complete_real", "status": "comp', b"\xff\xfe garbage"])
def test_a_damaged_run_json_is_one_error_naming_it(clean, tmp_path: Path, content: bytes) -> None:
    pipeline, done, _ = clean
    out = tmp_path / "out"
    shutil.copytree(done, out)
    (out / "run.json").write_bytes(content)
    res = CliRunner().invoke(main, ["run", str(pipeline), "--output", str(out), "--in-process", "--no-progress"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"{out}/run.json is damaged" in errors[0], res.output
    assert "hint: run again with --fresh" in res.output
    fresh = CliRunner().invoke(main, ["run", str(pipeline), "--output", str(out), "--in-process", "--no-progress", "--fresh"])
    assert fresh.exit_code == 0, fresh.output


def _jsonl(folder: Path) -> list[str]:
    return [line for f in sorted(folder.rglob("*.jsonl")) for line in f.read_text(encoding="utf-8").splitlines()]


def test_readers_of_a_finished_run_refuse_a_damaged_documents_file(clean, tmp_path: Path) -> None:
    """One bit flipped in a data page of a kept documents file (size kept): the JSONL export, a query
    reading the text, `sql --verify` and `stats --verify` refuse it by name and point at `datapipe run`;
    run again, the run redoes it and the export equals the clean run's. (Before: the export exited 0
    with the damaged text, and sql answered from it.)"""
    pipeline, done, _ = clean
    out = tmp_path / "out"
    shutil.copytree(done, out)
    victim = out / "docs" / "zh" / "00000.parquet"
    flip_data_page(victim)
    runner = CliRunner()
    name = f"{out}/docs/zh/00000.parquet"

    def refused(args: list[str]) -> str:
        res = runner.invoke(main, args)
        errors = [line for line in res.output.splitlines() if line.startswith("error:")]
        assert res.exit_code == 1 and len(errors) == 1 and name in errors[0], (args, res.output)
        assert "hint: run the same `datapipe run` command again" in res.output and "Traceback" not in res.output
        return errors[0]

    assert "sha256 differs" in refused(["export", str(out), "--format", "jsonl", "-o", str(tmp_path / "x"), "--no-progress"])
    assert "could not be decoded" in refused(["sql", str(out), "select sum(length(text)) from kept_docs where source = 'zh'"])
    assert "sha256 differs" in refused(["sql", str(out), "--verify", "select count(*) from documents"])
    assert "sha256 differs" in refused(["stats", str(out), "--verify"])
    rerun = runner.invoke(main, ["run", str(pipeline), "--output", str(out), "--in-process", "--no-progress"])
    assert rerun.exit_code == 0 and f"{name}: its sha256 differs" in rerun.output, rerun.output
    for run, folder in ((out, tmp_path / "after"), (done, tmp_path / "clean")):
        res = runner.invoke(main, ["export", str(run), "--format", "jsonl", "-o", str(folder), "--no-progress"])
        assert res.exit_code == 0, res.output
    assert _jsonl(tmp_path / "after") == _jsonl(tmp_path / "clean") and _jsonl(tmp_path / "clean")


def test_an_export_refuses_a_damaged_shard(clean, tmp_path: Path) -> None:
    """One byte flipped in a packed shard (size kept): a tokens export, which reads the shards' facts
    from the first one and cuts documents from the shards where token lists are gone, refuses it by
    name, against its pack marker's sha256 and, with _work deleted (no markers), against the shard
    manifest's; it points at `datapipe run`."""
    import pyarrow.parquet as pq

    _, done, _ = clean
    out = tmp_path / "out"
    shutil.copytree(done, out)
    rel = pq.read_table(out / "shards" / "manifest.parquet")["path"][0].as_py()
    _flip(out / rel)
    for against in ("the one recorded when it was written", "the shard manifest's"):
        if against == "the shard manifest's":
            shutil.rmtree(out / "_work")
        res = CliRunner().invoke(main, ["export", str(out), "--format", "megatron", "-o", str(tmp_path / "x"), "--no-progress"])
        errors = [line for line in res.output.splitlines() if line.startswith("error:")]
        assert res.exit_code == 1 and len(errors) == 1 and "Traceback" not in res.output, res.output
        assert errors[0].startswith(f"error: {out}/{rel}: its sha256 differs from {against}"), res.output
        assert "hint: run the same `datapipe run` command again" in res.output, res.output


def test_a_marker_edited_by_hand_is_named_and_its_task_redone(clean, tmp_path: Path) -> None:
    """A map0 marker's count of documents read raised by 7 (its JSON still valid): the end of the run
    finds inputs != kept + rejected, names the marker whose counts disagree with its files and redoes
    its task; the run completes with the clean outputs (before: "conservation violated: ... documents
    read, but ... kept + ... rejected", the folder blocked, no marker named)."""
    import json

    pipeline, done, expected = clean
    out = tmp_path / "out"
    shutil.copytree(done, out)
    marker = _first(out, "_work/markers/map0/en/*.json")
    data = json.loads(marker.read_text())
    data["docs_in"] += 7
    marker.write_text(json.dumps(data, sort_keys=True))
    key = marker.relative_to(out / "_work" / "markers" / "map0").with_suffix("").as_posix()
    res = CliRunner().invoke(main, ["run", str(pipeline), "--output", str(out), "--in-process", "--no-progress"])
    assert res.exit_code == 0, res.output
    read = data["docs_in"]
    assert f"{out}/_work/markers/map0/{key}.json: {read:,} documents read, but " in res.output, res.output
    assert f"; redoing map0 {key}" in res.output, res.output
    assert json.loads(marker.read_text())["docs_in"] == read - 7  # written again by the redone task
    assert output_digests(out) == expected
