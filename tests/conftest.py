"""Shared fixtures: one embedded Ray for in-process runs, and pipeline files in tmp folders."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.shared_data import PROJECT_ROOT


@pytest.fixture(scope="session")
def ray_local():
    """One embedded Ray for the whole session: each run_pipeline call reuses it (starting Ray costs seconds)."""
    from datapipe.engine.ray_runtime import ray_session

    with ray_session(num_cpus=2) as where:
        yield where


@pytest.fixture
def demo_project(tmp_path: Path) -> Path:
    """A copy of the demo pipeline, its data and tokenizer, laid out as in the repository."""
    shutil.copytree(PROJECT_ROOT / "pipelines", tmp_path / "pipelines")
    shutil.copytree(PROJECT_ROOT / "tokenizer", tmp_path / "tokenizer")
    return tmp_path


def write_pipeline(folder: Path, config: dict[str, Any], name: str = "pipeline.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(config, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path
