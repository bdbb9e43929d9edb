"""examples/train_tiny.py on a real run: the loss falls, and a run resumed from a checkpoint reads
the same next batch (and every later one) as the uninterrupted run, with the same losses."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.support.export_helpers import build_real_run
from tests.support.shared_data import PROJECT_ROOT

pytest.importorskip("torch")
SMALL = [
    "--d-model",
    "64",
    "--layers",
    "2",
    "--heads",
    "4",
    "--batch-size",
    "8",
    "--threads",
    "1",
    "--warmup",
    "10",
    "--save-every",
    "30",
]


def _example():
    spec = importlib.util.spec_from_file_location("train_tiny", PROJECT_ROOT / "examples" / "train_tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_tiny_loss_falls_and_resume_continues_on_the_same_batch(ray_local, tmp_path_factory, tmp_path: Path) -> None:
    run = build_real_run(tmp_path_factory)
    train = _example()
    whole = train.main(["--run", str(run), "--out", str(tmp_path / "a"), "--steps", "60", *SMALL])
    losses = [whole["steps"][s]["loss"] for s in range(1, 61)]
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < first - 1.0, (first, last)  # ln(vocab) ~ 7.9 at the start
    assert (tmp_path / "a" / "ckpt-000030.pt").is_file() and (tmp_path / "a" / "ckpt-000060.pt").is_file()

    resumed = train.main(
        [
            "--run",
            str(run),
            "--out",
            str(tmp_path / "b"),
            "--steps",
            "60",
            *SMALL,
            "--resume",
            str(tmp_path / "a" / "ckpt-000030.pt"),
        ]
    )
    assert resumed["start_step"] == 30 and sorted(resumed["steps"]) == list(range(31, 61))
    assert resumed["steps"][31]["batch"] == whole["steps"][31]["batch"]  # the very next sample
    assert [resumed["steps"][s]["batch"] for s in range(31, 61)] == [whole["steps"][s]["batch"] for s in range(31, 61)]
    assert len({whole["steps"][s]["batch"] for s in range(1, 61)}) > 30  # batches do change
    for s in range(31, 61):
        assert resumed["steps"][s]["loss"] == pytest.approx(whole["steps"][s]["loss"], rel=1e-4, abs=1e-4)
