"""Access to the real public data in ``../shared/data`` (beside the project root).

Tests that need it call ``shared_path(...)``: it skips with a clear message when the
folder is absent, and fails instead when DATAPIPE_REQUIRE_SHARED_DATA=1 (CI sets it),
so real-data tests can never silently skip there.
"""

from __future__ import annotations

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
