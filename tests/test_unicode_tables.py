"""Per-code-point tables kept in datapipe's cache: loaded when valid, rebuilt when missing or damaged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from datapipe.dedup import shingles
from datapipe.unicode_tables import SIZE, _path, cached_table


def test_cached_shingle_tables_equal_the_built_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAPIPE_CACHE_DIR", str(tmp_path))
    for name, dtype, build in (("shingle-norm", np.uint32, shingles._build_norm_table),
                               ("shingle-classes", np.uint8, shingles._build_char_classes)):
        built = build()
        first = cached_table(name, 1, dtype, build)  # builds and stores
        assert _path(name, 1).is_file()
        second = cached_table(name, 1, dtype, lambda: pytest.fail("a stored table was rebuilt"))
        assert np.array_equal(first, built) and np.array_equal(second, built)
        assert second.dtype == dtype and second.flags.writeable  # the kernels' compiled signature


def test_a_damaged_or_foreign_table_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAPIPE_CACHE_DIR", str(tmp_path))
    calls = []

    def build() -> np.ndarray:
        calls.append(1)
        return np.arange(SIZE, dtype=np.uint32)

    path = _path("t", 1)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x93NUMPY half a file")
    assert np.array_equal(cached_table("t", 1, np.uint32, build), np.arange(SIZE, dtype=np.uint32))
    np.save(path, np.zeros(10, np.uint32))  # wrong shape
    assert cached_table("t", 1, np.uint32, build)[5] == 5
    assert len(calls) == 2
    assert cached_table("t", 1, np.uint32, build)[7] == 7 and len(calls) == 2  # the rebuilt one is kept
