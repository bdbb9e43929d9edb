"""Per-code-point tables kept in datapipe's cache: loaded when valid, rebuilt when missing or damaged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from datapipe.dedup import shingles
from datapipe.text.unicode_tables import SIZE, _path, cached_table


def test_cached_shingle_tables_equal_the_built_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAPIPE_CACHE_DIR", str(tmp_path))
    for name, dtype, build in (
        ("shingle-norm", np.uint32, shingles._build_norm_table),
        ("shingle-classes", np.uint8, shingles._build_char_classes),
    ):
        built = build()
        calls = []

        def counting(build=build, calls=calls) -> np.ndarray:
            calls.append(1)
            return build()

        first = cached_table(name, 1, dtype, counting)  # builds and stores
        assert _path(name, 1, counting).is_file()
        second = cached_table(name, 1, dtype, counting)
        assert len(calls) == 1, "a stored table was rebuilt"
        assert np.array_equal(first, built) and np.array_equal(second, built)
        assert second.dtype == dtype and second.flags.writeable  # the kernels' compiled signature
    shingles.char_classes.cache_clear()
    try:
        assert np.array_equal(shingles.char_classes(), shingles._build_char_classes())
    finally:
        shingles.char_classes.cache_clear()


def test_changed_inputs_of_a_table_are_not_served_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table built from other ranges (``depends``) is another file: never the stale one."""
    monkeypatch.setenv("DATAPIPE_CACHE_DIR", str(tmp_path))
    assert cached_table("t", 1, np.uint8, lambda: np.zeros(SIZE, np.uint8), depends="ranges A")[65] == 0
    assert cached_table("t", 1, np.uint8, lambda: np.ones(SIZE, np.uint8), depends="ranges B")[65] == 1


def test_a_damaged_or_foreign_table_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAPIPE_CACHE_DIR", str(tmp_path))
    calls = []

    def build() -> np.ndarray:
        calls.append(1)
        return np.arange(SIZE, dtype=np.uint32)

    path = _path("t", 1, build)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x93NUMPY half a file")
    assert np.array_equal(cached_table("t", 1, np.uint32, build), np.arange(SIZE, dtype=np.uint32))
    np.save(path, np.zeros(10, np.uint32))  # wrong shape
    assert cached_table("t", 1, np.uint32, build)[5] == 5
    assert len(calls) == 2
    assert cached_table("t", 1, np.uint32, build)[7] == 7 and len(calls) == 2  # the rebuilt one is kept
