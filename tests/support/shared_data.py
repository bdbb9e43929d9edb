"""Access to the real public data in ``../shared/data`` (beside the project root).

Tests that need it call ``shared_path(...)``: it skips with a clear message when the
folder is absent, and fails instead when DATAPIPE_REQUIRE_SHARED_DATA=1 (CI sets it),
so real-data tests can never silently skip there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = Path(os.environ.get("DATAPIPE_SHARED_DATA", PROJECT_ROOT.parent / "shared" / "data"))


def shared_path(*parts: str) -> Path:
    path = SHARED_DATA.joinpath(*parts)
    if path.exists():
        return path
    message = f"real test data not found at {path} (expected ../shared/data beside the project root)"
    if os.environ.get("DATAPIPE_REQUIRE_SHARED_DATA") == "1":
        pytest.fail(message + "; DATAPIPE_REQUIRE_SHARED_DATA=1 forbids skipping", pytrace=False)
    pytest.skip(message)


def jsonl_texts(path: Path, every: int = 1) -> list[str]:
    """The ``text`` of every ``every``-th record of a JSONL file; lines that are not a JSON object with
    a string ``text`` are skipped (the demo inputs have broken lines on purpose)."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if i % every == 0 and isinstance(record, dict) and isinstance(record.get("text"), str):
                out.append(record["text"])
    return out
