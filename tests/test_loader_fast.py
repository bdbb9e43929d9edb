"""The block path of iter_batches (address-table gathers, numba kernel or numpy) must return
exactly what the straightforward row-by-row reference (``PackedDataset.read``) returns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from datapipe.loader import PackedDataset, fused
from tests.loader_helpers import make_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("run"), {"web": [20, 16, 7], "code": [9, 15]})


@pytest.fixture(params=["numba", "numpy"])
def kernel_mode(request, monkeypatch):
    if request.param == "numpy":
        monkeypatch.setitem(fused._built, "segments", None)  # as if numba were missing
        monkeypatch.setitem(fused._built, "permute", None)
    elif fused.kernel() is None:
        pytest.skip("numba not installed")
    return request.param


def _check_against_reference(ds: PackedDataset, passes: int = 2, copy: bool = False) -> int:
    ref = PackedDataset(ds.manifest.root, backend="numpy", batch_size=ds.batch_size, seed=ds.seed,
                        max_segments=ds.max_segments, mask_cross_document=ds.mask_cross_document,
                        ignore_index=ds.ignore_index, fields=ds.fields)
    n = 0
    for _ in range(passes):
        for b in (ds.iter_batches(in_process=True) if not copy else ds.iter_batches(0, 1, in_process=False)):
            want = ref.read(*ref.locate(ref.batch_indices(int(b["batch_index"]))))
            assert set(b) - {"batch_index"} == set(want) == set(ds.fields)
            for k, v in want.items():
                assert b[k].dtype == v.dtype and np.array_equal(b[k], v), k
            n += 1
        if copy:
            break
    return n


@pytest.mark.parametrize("opts", [{}, {"mask_cross_document": True}, {"ignore_index": -100},
                                  {"fields": ("input_ids", "labels")}, {"fields": ("position_ids", "labels")}])
def test_block_path_equals_reference(run, kernel_mode, opts):
    ds = PackedDataset(run, backend="numpy", batch_size=3, seed=4, **opts)
    assert _check_against_reference(ds) == 2 * len(ds)


def test_worker_copies_and_lru_eviction_equal_reference(run, kernel_mode):
    # Two open shards at most: every block evicts and reopens; batches still match.
    ds = PackedDataset(run, backend="numpy", batch_size=2, seed=9, max_open_shards=2)
    assert _check_against_reference(ds, copy=True) == len(ds)
    with pytest.raises(ValueError, match="max_open_shards"):
        for _ in PackedDataset(run, backend="numpy", batch_size=20, seed=9, max_open_shards=2):
            pass


def test_irregular_record_batches(tmp_path, kernel_mode):
    run = make_run(tmp_path, {"web": [23, 10]})
    path = run / "shards/web/train-00000.arrow"
    with pa.OSFile(str(path)) as f:  # read into memory: the file is rewritten below
        table = pa.ipc.open_file(f).read_all()
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        for lo, hi in [(0, 5), (5, 6), (6, 17), (17, 23)]:  # uneven chunks: per-row addresses
            w.write_table(table.slice(lo, hi - lo))
    ds = PackedDataset(run, backend="numpy", batch_size=11, seed=2)
    assert len(ds.table.shard(0).tokens) == 4
    assert _check_against_reference(ds) == 2 * len(ds)


def test_unknown_field_refused(run):
    with pytest.raises(ValueError, match="fields"):
        PackedDataset(run, backend="numpy", fields=("input_ids", "tokens"))


def test_runs_without_numba(run):
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; sys.modules['numba'] = None; sys.modules['torch'] = None\n"
            "from datapipe.loader import PackedDataset, fused\n"
            f"ds = PackedDataset({str(run)!r}, batch_size=3, mask_cross_document=True)\n"
            "n = sum(1 for _ in ds)\n"
            "assert fused.kernel() is None and n == len(ds), n\n")
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
