"""Complete means complete (issue 37): finished work whose files are damaged or gone is found when
a run starts again, discarded and redone, so the outputs are those of a clean run; or the run stops
with one error naming the file. Never rc 0 over damaged outputs, never a folder stuck for ever.

All on a small real-data run in process (tests/support/small_real_run.py): outputs of every kind
(shards, kept and rejected documents) and intermediates (a map output, token lists) damaged the ways
disks and people damage them: truncated, deleted, a byte flipped in place, garbage.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from datapipe.cli import main
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

