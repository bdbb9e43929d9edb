"""Compact batches (tokens + cu_seqlens, num_segments, label_end) and the torch helper that
expands them: datapipe.loader.device must give exactly the position_ids, loss_mask and
labels of the host path and of the row-by-row reference ``PackedDataset.read``."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; the device helper needs it")

from datapipe.loader import PackedDataset, fused  # noqa: E402
from datapipe.loader.batch import COMPACT_FIELDS, DEFAULT_FIELDS  # noqa: E402
from datapipe.loader.device import expand_segments, position_ids_from_cu_seqlens  # noqa: E402
from tests.loader.test_loader_real import _real_run  # noqa: E402
from tests.support.loader_helpers import ident, make_run  # noqa: E402

warnings.filterwarnings("ignore", message=".*worker processes in total.*")
OPTS = [{}, {"mask_cross_document": True}, {"ignore_index": -100}, {"mask_cross_document": True, "ignore_index": -100}]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("run"), {"web": [20, 16, 7], "code": [9, 15]})


@pytest.fixture(params=["numba", "numpy"])
def kernel_mode(request, monkeypatch):
    if request.param == "numpy":
        for group in ("segments", "order", "gather"):
            monkeypatch.setitem(fused._built, group, None)  # as if numba were missing
    elif fused.kernel() is None:
        pytest.skip("numba not installed")
    return request.param


def _same(got: dict, want: dict, keys: tuple[str, ...]) -> None:
    for k in keys:
        g = got[k].cpu().numpy() if isinstance(got[k], torch.Tensor) else np.asarray(got[k])
        assert g.shape == want[k].shape and np.array_equal(g, want[k]), k


def _check(run: Path, opts: dict, batch_size: int = 3, passes: int = 2, in_process: bool = True) -> int:
    """Every compact batch: its compact fields equal the reference's, and expanded they equal
    the reference's full sample (position_ids, loss_mask, labels with ignore_index)."""
    ds = PackedDataset(run, backend="numpy", batch_size=batch_size, seed=4, fields=COMPACT_FIELDS, **opts)
    full = PackedDataset(run, backend="numpy", batch_size=batch_size, seed=4, **opts)  # host path, default fields
    ref = PackedDataset(
        run,
        backend="numpy",
        batch_size=batch_size,
        seed=4,
        fields=DEFAULT_FIELDS + ("label_end",),
        **{k: v for k, v in opts.items() if k != "ignore_index"},
    )
    host = iter([b for _ in range(passes) for b in full])
    n = 0
    for _ in range(passes):
        for b in ds.iter_batches(0, 1, in_process=in_process):
            where = ref.locate(ref.batch_indices(int(b["batch_index"])))
            want = ref.read(*where)
            assert set(b) - {"batch_index"} == set(COMPACT_FIELDS)
            assert b["input_ids"].dtype == want["input_ids"].dtype and b["labels"].dtype == want["labels"].dtype
            _same(b, want, COMPACT_FIELDS)  # labels stay in the token dtype: ignore_index is applied on expand
            got = ds.expand_segments(b)
            want_full = full.read(*where)
            h = next(host)
            assert int(h["batch_index"]) == int(b["batch_index"])
            _same(got, want_full, ("input_ids", "labels", "position_ids", "loss_mask", "cu_seqlens", "num_segments"))
            _same(got, h, ("labels", "position_ids", "loss_mask"))
            assert got["position_ids"].dtype == torch.int32 and got["loss_mask"].dtype == torch.bool
            if "ignore_index" in opts:
                assert got["labels"].dtype == torch.int64
                assert bool((got["labels"][~got["loss_mask"]] == -100).all())
            n += 1
        if not in_process:
            break
    return n


@pytest.mark.parametrize("opts", OPTS)
def test_compact_batches_expand_to_the_reference(run, kernel_mode, opts):
    ds = PackedDataset(run, backend="numpy", batch_size=3, seed=4)
    assert _check(run, opts) == 2 * len(ds)


def test_compact_worker_copies_and_rows_without_label_token(tmp_path, run, kernel_mode):
    assert _check(run, {"mask_cross_document": True}, batch_size=2, in_process=False) > 0
    short = make_run(tmp_path, {"web": [11, 6]}, label_token=False)  # row_len == seq_len: last label missing
    for opts in OPTS:
        assert _check(short, opts, batch_size=4) > 0


def test_compact_on_real_text(tmp_path):
    real, _, _ = _real_run(tmp_path)
    for opts in OPTS:
        assert _check(real, opts, batch_size=4, passes=1) > 0


def test_position_ids_helper_by_hand():
    cu = torch.tensor([[0, 3, 5, 8, 8], [0, 8, 8, 8, 8]], dtype=torch.int32)
    pos = position_ids_from_cu_seqlens(cu, 8)
    assert pos.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2], list(range(8))]
    batch = {
        "input_ids": torch.zeros(2, 8, dtype=torch.int64),
        "labels": torch.ones(2, 8, dtype=torch.int64),
        "cu_seqlens": cu,
        "num_segments": torch.tensor([3, 1]),
        "label_end": torch.tensor([7, 8]),
    }
    out = expand_segments(batch, mask_cross_document=True, ignore_index=-1)
    assert out["loss_mask"].tolist() == [[1, 1, 0, 1, 0, 1, 1, 0], [1] * 8]
    assert out["labels"].tolist() == [[1, 1, -1, 1, -1, 1, 1, -1], [1] * 8]
    with pytest.raises(KeyError, match="COMPACT_FIELDS"):
        expand_segments({"input_ids": batch["input_ids"]})


def test_int16_positions_round_trip(run, kernel_mode, tmp_path):
    wide = PackedDataset(run, backend="numpy", batch_size=3, seed=4, mask_cross_document=True)
    narrow = PackedDataset(run, backend="numpy", batch_size=3, seed=4, mask_cross_document=True, position_dtype="int16")
    compact = PackedDataset(run, backend="numpy", batch_size=3, seed=4, fields=COMPACT_FIELDS, position_dtype="int16")
    for w, n, c in zip(wide, narrow, compact):
        assert n["position_ids"].dtype == np.int16 and w["position_ids"].dtype == np.int32
        widened = torch.from_numpy(n["position_ids"]).int()  # what a trainer does on the GPU
        assert torch.equal(widened, torch.from_numpy(w["position_ids"]))
        assert torch.equal(compact.expand_segments(c)["position_ids"], torch.from_numpy(n["position_ids"]))
        want = narrow.read(*narrow.locate(narrow.batch_indices(int(n["batch_index"]))))
        assert want["position_ids"].dtype == np.int16 and np.array_equal(want["position_ids"], n["position_ids"])
    with pytest.raises(ValueError, match="position_dtype"):
        PackedDataset(run, backend="numpy", position_dtype="uint8")
    long_run = make_run(tmp_path / "long", {"web": [2]}, seq_len=40_000)
    with pytest.raises(ValueError, match="32768"):
        PackedDataset(long_run, backend="numpy", position_dtype="int16")


def test_compact_through_dataloader_workers_exact_once_and_resume(run):
    plain = PackedDataset(run, batch_size=4, seed=2, backend="numpy", fields=COMPACT_FIELDS)
    ref = [(ident(b), b["cu_seqlens"].tolist(), b["label_end"].tolist()) for _ in range(2) for b in plain]
    ds = PackedDataset(run, batch_size=4, seed=2, fields=COMPACT_FIELDS, mask_cross_document=True)
    got = []
    for b in ds.dataloader(num_workers=3):
        got.append((ident(b), b["cu_seqlens"].tolist(), b["label_end"].tolist()))
        if len(got) == 5:
            break
    again = PackedDataset(run, batch_size=4, seed=2, fields=COMPACT_FIELDS, mask_cross_document=True)
    again.load_state_dict(ds.state_dict())
    for _ in range(2):  # rest of epoch 0, then all of epoch 1
        got += [(ident(b), b["cu_seqlens"].tolist(), b["label_end"].tolist()) for b in again.dataloader(num_workers=2)]
    seen = [i for ids, _, _ in got[: len(plain)] for i in ids]
    assert len(seen) == len(set(seen)) == len(plain) * 4
    # mask_cross_document changes label_end only where a document starts at the last label
    assert [g[:2] for g in got] == [r[:2] for r in ref]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_expand_on_cuda_equals_cpu(run):
    ds = PackedDataset(
        run, backend="numpy", batch_size=5, seed=3, fields=COMPACT_FIELDS, mask_cross_document=True, ignore_index=-100
    )
    for b in ds:
        cpu, gpu = ds.expand_segments(b), ds.expand_segments(b, "cuda")
        assert gpu["position_ids"].is_cuda
        for k in ("position_ids", "loss_mask", "labels"):
            assert torch.equal(cpu[k], gpu[k].cpu()), k
