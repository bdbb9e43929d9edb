"""Acceptance tests of the streaming loader's numpy core (no torch needed)."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pyarrow.parquet as pq
import pytest

from datapipe.loader import PackedDataset, StateMismatch, integer_weights, permute
from datapipe.loader.order import MixtureOrder
from tests.support.loader_helpers import ident, make_run

PROJECT = __import__("pathlib").Path(__file__).resolve().parents[2]


def _ds(run, **kw):
    kw.setdefault("seq_len", 16)
    return PackedDataset(run, backend="numpy", **kw)


def _worker_batches(ds, w, n_workers):
    """What DataLoader worker w sees: its own (pickled) copy of the dataset."""
    return list(pickle.loads(pickle.dumps(ds)).iter_batches(w, n_workers, in_process=False))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    # 36 + 24 = 60 rows: divisible by global batches 12 (2 ranks x 6) and 4 x 3 / 2 x 6.
    return make_run(tmp_path_factory.mktemp("run"), {"web": [20, 16], "code": [9, 15]})


def test_permute_is_a_bijection():
    for n in (1, 2, 3, 7, 64, 1000, 4097):
        for key in (0, 1, 2**63 + 5):
            p = permute(np.arange(n), n, key)
            assert np.array_equal(np.sort(p), np.arange(n))
    assert not np.array_equal(permute(np.arange(50), 50, 1), permute(np.arange(50), 50, 2))


def test_exactly_once_two_ranks_three_workers(run):
    seen, per_rank = [], []
    for rank in range(2):
        ds = _ds(run, batch_size=6, rank=rank, world_size=2, seed=3)
        assert len(ds) == 5
        batches = [b for w in range(3) for b in _worker_batches(ds, w, 3)]
        per_rank.append(len(batches))
        seen += [i for b in batches for i in ident(b)]
    assert per_rank == [5, 5]
    assert len(seen) == 60 and len(set(seen)) == 60  # every row exactly once


def test_workers_round_robin_equals_single_process_order(run):
    single = [ident(b) for b in _ds(run, batch_size=6, rank=1, world_size=2)]
    ds = _ds(run, batch_size=6, rank=1, world_size=2)
    streams = [_worker_batches(ds, w, 3) for w in range(3)]
    merged = [ident(streams[k % 3][k // 3]) for k in range(5)]
    assert merged == single


def test_epochs_reshuffle_and_cover_all(run):
    ds = _ds(run, batch_size=12, seed=1)
    e0 = [i for b in ds for i in ident(b)]
    e1 = [i for b in ds for i in ident(b)]
    assert sorted(e0) == sorted(e1) and len(set(e0)) == 60
    assert e0 != e1


def test_resume_equality_at_random_points(run):
    ref = _ds(run, batch_size=4, seed=7)
    full = [ident(b) for _ in range(3) for b in ref]  # three epochs, 15 batches each
    rng = np.random.default_rng(0)
    for k in [0, 14, 15, *rng.integers(1, 44, size=4).tolist()]:
        ds = _ds(run, batch_size=4, seed=7)
        got = []
        while len(got) < k:
            for b in ds:
                got.append(ident(b))
                if len(got) == k:
                    break
        state = ds.state_dict()
        assert state["consumed_samples"] == 4 * k
        again = _ds(run, batch_size=4, seed=7)
        again.load_state_dict(state)
        while len(got) < len(full):
            got += [ident(b) for b in again]
        assert got == full, f"resume after {k} batches diverged"


def test_elastic_resume_four_ranks_to_two(run):
    def global_batches(world, n_ranks_state=None, start_state=None, count=None):
        dss = [_ds(run, batch_size=12 // world, rank=r, world_size=world, seed=5) for r in range(world)]
        if start_state:
            for d in dss:
                d.load_state_dict(start_state)
        its = [iter(d) for d in dss]
        out = []
        for _ in range(count):
            out.append(sum((ident(next(it)) for it in its), []))
        return out, dss[0].state_dict()

    ref, _ = global_batches(4, count=5)
    head, state = global_batches(4, count=2)
    tail, _ = global_batches(2, start_state=state, count=3)
    assert head + tail == ref


def test_state_refused_on_changed_manifest(tmp_path, run):
    ds = _ds(run, batch_size=4)
    next(iter(ds))
    state = ds.state_dict()
    assert len(repr(state)) < 1000  # tiny
    other = make_run(tmp_path / "other", {"web": [20, 16], "code": [9, 15]}, seed=99)  # same shape, new content
    with pytest.raises(StateMismatch, match="shards changed"):
        _ds(other, batch_size=4).load_state_dict(state)
    retok = make_run(tmp_path / "retok", {"web": [20, 16], "code": [9, 15]}, fingerprint="tok-other")
    with pytest.raises(StateMismatch):
        _ds(retok, batch_size=4).load_state_dict(state)
    with pytest.raises(StateMismatch, match="global_batch_size"):
        _ds(run, batch_size=6).load_state_dict(state)
    with pytest.raises(StateMismatch, match="mixture"):
        _ds(run, batch_size=4, mixture={"web": 1, "code": 1}).load_state_dict(state)
    with pytest.raises(ValueError, match="seq_len"):
        _ds(run, seq_len=32, batch_size=4)


def test_seq_len_change_refused_in_state(tmp_path):
    a = make_run(tmp_path / "a", {"web": [12]}, seq_len=16)
    b = make_run(tmp_path / "b", {"web": [12]}, seq_len=8)
    state = PackedDataset(a, backend="numpy", batch_size=2).state_dict()
    with pytest.raises(StateMismatch):
        PackedDataset(b, backend="numpy", batch_size=2).load_state_dict(state)


@pytest.mark.parametrize(
    "weights",
    [
        {"a": 0.5, "b": 0.3, "c": 0.2},
        {"a": 297, "b": 42, "c": 1, "d": 117, "e": 1, "f": 281, "g": 2, "h": 177},  # skewed: greedy drifts here
        {"a": 1 / 3, "b": 2 / 3},
    ],
)
def test_mixture_exact_at_every_prefix(weights):
    shares = integer_weights(weights)
    names = sorted(shares)
    order = MixtureOrder([shares[n] for n in names])
    n = 3 * order.period + 17
    src, ordinal = order(np.arange(n))
    counts = np.zeros((n + 1, len(names)), dtype=np.int64)
    counts[1:] = np.cumsum(np.eye(len(names), dtype=np.int64)[src], axis=0)
    w = np.asarray([shares[k] for k in names]) / order.period
    err = np.abs(counts - np.arange(n + 1)[:, None] * w[None, :])
    assert err.max() < 1.0
    # ordinals are the per-source running counts, so sources advance without gaps
    assert np.array_equal(ordinal, counts[np.arange(n), src])
    total = sum(Fraction(v).limit_denominator(10**6) for v in weights.values())
    for k in names:  # decimals and simple fractions are realized exactly
        assert Fraction(shares[k], order.period) == Fraction(weights[k]).limit_denominator(10**6) / total


def test_mixture_on_data_repeats_and_truncates(tmp_path):
    run = make_run(tmp_path, {"big": [40], "small": [5]})
    ds = _ds(run, batch_size=5, mixture={"big": 0.5, "small": 0.5}, samples_per_epoch=40)
    samples = [i for _ in range(2) for b in ds for i in ident(b)]  # 80 samples
    src = [i // 1_000_000 for i in samples]  # source id 0 = big, 1 = small (sorted names)
    for n in range(1, len(src) + 1):
        assert abs(src[:n].count(1) - n / 2) <= 1
    small = [i for i in samples if i // 1_000_000 == 1]
    passes = [small[k : k + 5] for k in range(0, 40, 5)]
    assert all(sorted(p) == sorted(passes[0]) for p in passes)  # each pass: every row once
    assert len({tuple(p) for p in passes}) > 1  # ... in a new order
    big = [i for i in samples if i // 1_000_000 == 0]
    assert len(set(big[:40])) == 40  # truncated source: no repeats within its pass
    assert ds.mixture_counts(80) == {"big": 40, "small": 40}


def test_sample_fields(tmp_path):
    run = make_run(tmp_path, {"web": [30]}, seq_len=16)
    ds = _ds(run, batch_size=30, mask_cross_document=True, max_segments=8)
    b = next(iter(ds))
    ids, lab, pos, cu, lm = b["input_ids"], b["labels"], b["position_ids"], b["cu_seqlens"], b["loss_mask"]
    assert ids.shape == lab.shape == pos.shape == lm.shape == (30, 16) and cu.shape == (30, 9)
    from datapipe.tokens.shard_format import open_shard, tokens_view

    table, _ = open_shard(run / "shards/web/train-00000.arrow")
    rows = tokens_view(table)
    starts, ntok = table.column("doc_starts").to_pylist(), table.column("n_tokens").to_pylist()
    for i, key in enumerate(ident(b)):
        r = key % 1000
        assert np.array_equal(ids[i], rows[r, :16]) and np.array_equal(lab[i], rows[r, 1:])
        bounds = sorted({0, *[d for d in starts[r] if d < 16], *([ntok[r]] if ntok[r] < 16 else [])})
        expect = np.concatenate([np.arange(e - s) for s, e in zip(bounds, bounds[1:] + [16])])
        assert np.array_equal(pos[i], expect)
        assert cu[i, : len(bounds) + 1].tolist() == bounds + [16] and set(cu[i, len(bounds) + 1 :]) <= {16}
        mask = np.arange(16) + 1 < ntok[r]
        for d in starts[r]:
            if 1 <= d <= 16:
                mask[d - 1] = False
        assert np.array_equal(lm[i], mask)
    with pytest.raises(ValueError, match="max_segments"):
        next(iter(_ds(run, batch_size=30, max_segments=1)))
    ign = next(iter(_ds(run, batch_size=30, ignore_index=-100)))
    assert ign["labels"].dtype == np.int64 and (ign["labels"][~ign["loss_mask"]] == -100).all()


def test_rows_without_label_token_and_multibatch_shards(tmp_path):
    import tests.support.loader_helpers as h

    orig = h.write_shard
    h.write_shard = lambda *a, **k: orig(*a, **{**k, "rows_per_batch": 4})
    try:
        run = make_run(tmp_path, {"web": [11, 6]}, label_token=False)
    finally:
        h.write_shard = orig
    ds = _ds(run, batch_size=17)
    b = next(iter(ds))
    assert sorted(ident(b)) == sorted([k * 1000 + r for k, n in enumerate([11, 6]) for r in range(n)])
    assert not b["loss_mask"][:, -1].any()  # last position has no target token
    assert np.array_equal(b["labels"][:, :-1], b["input_ids"][:, 1:])


def test_uri_and_remote_copy(tmp_path, run):
    a = [ident(b) for b in _ds(run, batch_size=12)]
    b = [ident(x) for x in _ds(f"file://{run}/shards/manifest.parquet", batch_size=12)]
    assert a == b
    ds = _ds(run, batch_size=12, cache_dir=str(tmp_path / "cache"))
    ds.manifest.local = False  # exercise the copy path that non-local filesystems take
    assert [ident(x) for x in ds] == a
    assert len(list((tmp_path / "cache").glob("*.arrow"))) == 4


def fresh_python(code: str) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter that imports this checkout, with nothing else on its paths."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(PROJECT), "PATH": "/usr/bin:/bin"},
    )


def test_import_is_light():
    code = (
        "import sys; sys.modules['torch'] = None; import datapipe.loader as L; "
        "bad = [m for m in ('ray', 'duckdb', 'torch') if sys.modules.get(m) is not None]; "
        "assert not bad, bad; print(L.PackedDataset.__name__)"
    )
    out = fresh_python(code)
    assert out.returncode == 0, out.stderr


def test_local_manifest_read_without_pyarrow_parquet(tmp_path, run):
    """A training process reads a local run's manifest from the JSON copy beside the Parquet file
    and never imports pyarrow's Parquet or filesystem modules; it gets the same manifest and the same
    batches as the Parquet read. A copy that no longer matches the Parquet file (rewritten by hand)
    is ignored, and a manifest that is not Parquet gets pyarrow's own error."""
    stale = tmp_path / "stale"
    shutil.copytree(run, stale)
    table = pq.read_table(stale / "shards" / "manifest.parquet")
    pq.write_table(table.slice(0, 2), stale / "shards" / "manifest.parquet")  # the copy still has every row
    bad = tmp_path / "bad"
    (bad / "shards").mkdir(parents=True)
    (bad / "shards" / "manifest.parquet").write_bytes(b"not parquet at all")
    code = (
        "import sys\n"
        "from datapipe.loader import PackedDataset\n"
        f"ds = PackedDataset({str(run)!r}, backend='numpy', seq_len=16, batch_size=12)\n"
        "ids = [int(b['input_ids'][:, 0].sum()) for b in ds]\n"
        "loaded = [m for m in ('pyarrow.parquet', 'pyarrow.fs', 'pyarrow.dataset') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        f"assert len(PackedDataset({str(stale)!r}, backend='numpy').manifest.paths) == 2\n"
        "try:\n"
        f"    PackedDataset({str(bad)!r}, backend='numpy')\n"
        "except ValueError as exc:\n"  # pyarrow.ArrowInvalid
        "    assert 'Parquet' in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('a manifest that is not Parquet was read')\n"
        "print(ds.manifest.fingerprint, ids)\n"
    )
    out = fresh_python(code)
    assert out.returncode == 0, out.stderr
    (run / "shards" / "manifest.json").rename(tmp_path / "copy.json")  # the Parquet read, here
    try:
        here = _ds(run, batch_size=12)
    finally:
        (tmp_path / "copy.json").rename(run / "shards" / "manifest.json")
    fingerprint, ids = out.stdout.split(" ", 1)
    assert fingerprint == here.manifest.fingerprint
    assert ids.strip() == str([int(b["input_ids"][:, 0].sum()) for b in here])


def test_compiled_permutation_equals_numpy() -> None:
    """The optional numba Feistel kernel must give exactly the numpy order (resume relies on it)."""
    import pytest as _pytest

    from datapipe.loader.fused import permute_kernel
    from datapipe.loader.order import permute

    if permute_kernel() is None:
        _pytest.skip("numba is not installed: only the numpy permutation exists")
    rng = np.random.default_rng(0)
    for n in (2, 7, 1000, 16_000, 123_457, 10**9 + 7):
        index = rng.integers(0, n, 3000)
        for key in (np.uint64(12345), rng.integers(0, 2**63, 3000).astype(np.uint64)):
            fast = permute(index, n, key, fast=True)
            assert np.array_equal(permute(index, n, key), fast)
            assert len(np.unique(permute(np.arange(min(n, 5000)), n, key if np.ndim(key) == 0 else key[0], fast=True))) == min(
                n, 5000
            )
