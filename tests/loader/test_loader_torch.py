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


def test_workers_send_runs_of_batches_that_unpack_to_the_same_batches(run, monkeypatch):
    """ds.dataloader's workers pack runs of consecutive batches into one shared buffer each: the
    loop still gets every field (values, dtype, shape) of each batch in order, len() counts
    batches, and a stop inside a run resumes on the very next batch."""
    from datapipe.loader import torch_adapter

    monkeypatch.setattr(torch_adapter, "_MAX_RUN", 2)  # forked workers inherit it: runs of 2 batches
    plain = PackedDataset(run, batch_size=2, seed=5, backend="numpy")
    ref = list(plain)
    ds = PackedDataset(run, batch_size=2, seed=5)
    loader = ds.dataloader(num_workers=3)
    assert len(loader) == len(ds) == len(ref) == 30
    got = list(loader)
    assert [int(b["batch_index"]) for b in got] == list(range(30))
    for b, r in zip(got, ref):
        assert b.keys() == r.keys()
        for k, v in r.items():
            assert b[k].numpy().dtype == v.dtype and b[k].numpy().shape == v.shape
            assert (b[k].numpy() == v).all(), k
    ds = PackedDataset(run, batch_size=2, seed=5)
    part = []
    for b in ds.dataloader(num_workers=2):
        part.append(ident(b))
        if len(part) == 4:  # in the middle of worker 0's first run of two (after one batch each)
            break
    again = PackedDataset(run, batch_size=2, seed=5)
    again.load_state_dict(ds.state_dict())
    part += [ident(b) for b in again.dataloader(num_workers=3)]
    assert part == [ident(r) for r in ref]


def test_plan_in_runs_round_robin_is_the_batch_order(run):
    ds = PackedDataset(run, batch_size=2, seed=5, backend="numpy")
    ds.consumed_samples = 2 * 4  # from batch 4 of 30
    plans = [list(ds.plan(w, 3, chunk=2)) for w in range(3)]
    runs = [[p[:1]] + [p[i : i + 2] for i in range(1, len(p), 2)] for p in plans]  # one batch, then runs
    merged = [g for k in range(max(map(len, runs))) for r in runs if k < len(r) for g in r[k]]
    assert merged == list(range(4, 30))
