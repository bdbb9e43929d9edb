"""The torch adapter with real DataLoader worker processes (skipped without torch)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (pip install torch==2.13.0 gives a CPU build); DataLoader worker tests skipped"
)

from datapipe.loader import PackedDataset  # noqa: E402
from tests.support.loader_helpers import ident, make_run  # noqa: E402

warnings.filterwarnings("ignore", message=".*worker processes in total.*")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("run"), {"web": [20, 16], "code": [9, 15]})


def test_adapter_is_selected(run):
    ds = PackedDataset(run, batch_size=4)
    assert isinstance(ds, torch.utils.data.IterableDataset)
    b = next(iter(ds))
    assert b["input_ids"].dtype == torch.uint16 and b["position_ids"].dtype == torch.int32
    assert type(PackedDataset(run, batch_size=4, backend="numpy")) is PackedDataset


def test_dataloader_three_workers_exactly_once_in_order(run):
    seen = []
    for rank in range(2):
        ds = PackedDataset(run, batch_size=6, rank=rank, world_size=2, seed=11)
        ref = [ident(b) for b in PackedDataset(run, batch_size=6, rank=rank, world_size=2, seed=11, backend="numpy")]
        got = [b for b in ds.dataloader(num_workers=3)]
        assert [int(b["batch_index"]) for b in got] == list(range(5))
        assert [ident(b) for b in got] == ref
        seen += [i for b in got for i in ident(b)]
    assert len(seen) == 60 and len(set(seen)) == 60


def test_resume_through_workers_with_other_worker_count(run):
    plain = PackedDataset(run, batch_size=4, seed=2, backend="numpy")
    ref = [ident(b) for _ in range(2) for b in plain]  # epochs 0 and 1
    ds = PackedDataset(run, batch_size=4, seed=2)
    got = []
    for b in ds.dataloader(num_workers=3):
        got.append(ident(b))
        if len(got) == 7:
            break
    state = ds.state_dict()
    assert state["consumed_samples"] == 28
    again = PackedDataset(run, batch_size=4, seed=2)
    again.load_state_dict(state)
    for _ in range(2):  # rest of epoch 0, then all of epoch 1
        got += [ident(b) for b in again.dataloader(num_workers=2)]
    assert got == ref


def test_plain_dataloader_with_workers_refuses_to_guess_state(run):
    ds = PackedDataset(run, batch_size=12)
    list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
    with pytest.raises(RuntimeError, match="mark_consumed"):
        ds.state_dict()
    ds0 = PackedDataset(run, batch_size=12)  # in-process iteration is tracked without help
    next(iter(torch.utils.data.DataLoader(ds0, batch_size=None, num_workers=0)))
    assert ds0.state_dict()["consumed_samples"] == 12
