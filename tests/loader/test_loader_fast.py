"""The block path of iter_batches (address-table gathers, numba kernel or numpy) must return
exactly what the straightforward row-by-row reference (``PackedDataset.read``) returns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from datapipe.loader import PackedDataset, fused
from datapipe.loader.batch import ALL_FIELDS, COMPACT_FIELDS, bounds
from tests.support.loader_helpers import make_run, refresh_sha256


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("run"), {"web": [20, 16, 7], "code": [9, 15]})


@pytest.fixture(params=["numba", "numpy"])
def kernel_mode(request, monkeypatch):
    if request.param == "numpy":
        monkeypatch.setitem(fused._built, "segments", None)  # as if numba were missing
        monkeypatch.setitem(fused._built, "order", None)
        monkeypatch.setitem(fused._built, "gather", None)
    elif fused.kernel() is None:
        pytest.skip("numba not installed")
    return request.param


def _check_against_reference(ds: PackedDataset, passes: int = 2, copy: bool = False) -> int:
    ref = PackedDataset(
        ds.manifest.root,
        backend="numpy",
        batch_size=ds.batch_size,
        seed=ds.seed,
        max_segments=ds.max_segments,
        mask_cross_document=ds.mask_cross_document,
        ignore_index=ds.ignore_index,
        fields=ds.fields,
        position_dtype="int16" if ds.position_dtype is np.int16 else "int32",
    )
    n = 0
    for _ in range(passes):
        for b in ds.iter_batches(in_process=True) if not copy else ds.iter_batches(0, 1, in_process=False):
            want = ref.read(*ref.locate(ref.batch_indices(int(b["batch_index"]))))
            assert set(b) - {"batch_index"} == set(want) == set(ds.fields)
            for k, v in want.items():
                assert b[k].dtype == v.dtype and np.array_equal(b[k], v), k
            n += 1
        if copy:
            break
    return n


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"mask_cross_document": True},
        {"ignore_index": -100},
        {"fields": ("input_ids", "labels")},
        {"fields": ("position_ids", "labels")},
        {"fields": COMPACT_FIELDS},
        {"fields": COMPACT_FIELDS, "mask_cross_document": True},
        {"fields": ("cu_seqlens", "label_end")},
        {"fields": ALL_FIELDS},
        {"position_dtype": "int16"},
    ],
)
def test_block_path_equals_reference(run, kernel_mode, opts):
    ds = PackedDataset(run, backend="numpy", batch_size=3, seed=4, **opts)
    assert _check_against_reference(ds) == 2 * len(ds)


@pytest.mark.parametrize("mask_cross", [False, True])
def test_compact_rows_with_many_documents_equal_reference(tmp_path, kernel_mode, mask_cross):
    """Rows of up to 200 documents (more segments than the default max_segments=64): compact
    batches, bounds from numpy in the first block and compiled after, equal the reference."""
    run = make_run(tmp_path, {"web": [40, 33]}, seq_len=256, max_starts=200)
    ds = PackedDataset(
        run, backend="numpy", batch_size=4, seed=3, fields=COMPACT_FIELDS, max_segments=256, mask_cross_document=mask_cross
    )
    assert _check_against_reference(ds) == 2 * len(ds)
    assert max(int(b["num_segments"].max()) for b in ds) > 100


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
    refresh_sha256(run)
    ds = PackedDataset(run, backend="numpy", batch_size=11, seed=2)
    assert len(ds.table.shard(0).tokens) == 4
    assert _check_against_reference(ds) == 2 * len(ds)


def test_equal_record_batches(tmp_path, kernel_mode):
    # Chunks of equal rows and a shorter last one (what write_shard writes): one address per
    # chunk, rows past the first chunk found by divmod, the first chunk's without.
    run = make_run(tmp_path, {"web": [23, 10]})
    path = run / "shards/web/train-00000.arrow"
    with pa.OSFile(str(path)) as f:
        table = pa.ipc.open_file(f).read_all()
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        for lo in range(0, 23, 6):
            w.write_table(table.slice(lo, min(6, 23 - lo)))
    refresh_sha256(run)
    ds = PackedDataset(run, backend="numpy", batch_size=11, seed=2)
    assert [len(t) for t in ds.table.shard(0).tokens] == [6, 6, 6, 5]
    assert _check_against_reference(ds) == 2 * len(ds)


def test_unknown_field_refused(run):
    with pytest.raises(ValueError, match="fields"):
        PackedDataset(run, backend="numpy", fields=("input_ids", "tokens"))


def test_runs_without_numba(run):
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys; sys.modules['numba'] = None; sys.modules['torch'] = None\n"
        "from datapipe.loader import PackedDataset, fused\n"
        f"ds = PackedDataset({str(run)!r}, batch_size=3, mask_cross_document=True)\n"
        "n = sum(1 for _ in ds)\n"
        "assert fused.kernel() is None and n == len(ds), n\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr


def _manifest_only(root, shard_rows: dict[str, list[int]]):
    """A manifest without shard files: locate is pure arithmetic and never opens a shard."""
    from tests.support.loader_helpers import FINGERPRINT, write_manifest

    write_manifest(
        root,
        [
            {
                "path": f"shards/{s}/train-{k:05d}.arrow",
                "source": s,
                "split": "train",
                "rows": n,
                "tokens": n * 16,
                "sha256": "0" * 64,
                "tokenizer_fingerprint": FINGERPRINT,
                "seq_len": 16,
                "row_len": 17,
            }
            for s, rows in shard_rows.items()
            for k, n in enumerate(rows)
        ],
    )
    return root


@pytest.mark.parametrize("mixture", [None, {"big": 0.5, "tiny": 0.3, "skewed": 0.2}])
def test_compiled_locate_equals_numpy(tmp_path, mixture):
    """The compiled locate (blend, stepping instead of dividing, bucketed shard search) must
    give exactly the numpy order: resume and every rank rely on it. Shard sizes are skewed
    (one huge shard among small ones, empty-ish buckets), a source is smaller than a block
    (many passes per block), and the samples cross epochs and run non-consecutively."""
    if fused.locate_kernel() is None:
        pytest.skip("numba is not installed: only the numpy order exists")
    rng = np.random.default_rng(3)
    run = _manifest_only(
        tmp_path, {"big": rng.integers(1, 400, 57).tolist(), "tiny": [3, 1, 2], "skewed": [1, 1, 5000, 2, 1, 1, 700, 1]}
    )
    kw = {"mixture": mixture, "samples_per_epoch": 9000} if mixture else {}
    ds = PackedDataset(run, backend="numpy", batch_size=7, world_size=3, seed=11, **kw)
    starts = [0, ds.samples_per_epoch - 500, 5 * ds.samples_per_epoch + 13]
    runs = [np.arange(s, s + 3000, dtype=np.int64) for s in starts]
    strided = (np.arange(200)[:, None] * 63 + np.arange(7)).reshape(-1) + 12_345  # one rank's view
    for index in runs + [strided, np.asarray([4], np.int64)]:
        ds._warm = False
        want = ds.locate(index)
        ds._warm = True
        got = ds.locate(index)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_interleaved_iterators_keep_evicted_maps_alive(run, kernel_mode):
    """Two iterators over one dataset share its open-shard table. With two open shards at
    most, each block of one iterator evicts shards that the other's current block still
    reads; the lease keeps those maps open (else the gather would read unmapped memory),
    and once both iterators are done every retired map is released."""
    ds = PackedDataset(run, backend="numpy", batch_size=2, seed=5, max_open_shards=2)
    ref = PackedDataset(run, backend="numpy", batch_size=2, seed=5)
    a, b = ds.iter_batches(0, 2, in_process=False), ds.iter_batches(1, 2, in_process=False)  # other batches
    seen_retired = 0
    for x, y in zip(a, b):
        seen_retired = max(seen_retired, len(ds.table.retired))
        for batch in (x, y):
            want = ref.read(*ref.locate(ref.batch_indices(int(batch["batch_index"]))))
            assert all(np.array_equal(batch[k], want[k]) for k in want)
    assert seen_retired > 0, "the test must make one iterator evict what the other reads"
    del a, b
    assert ds.table.retired == [] and not ds.table.leases


def test_dropped_dataset_unmaps_its_shards_without_a_collection(run):
    """A dataset and its shard table form no reference cycle: dropping the dataset closes its
    maps at once. (A training job that builds a loader per evaluation otherwise kept every old
    loader's shards mapped until Python's next full collection: in bench/perf/loader.py, 4,000
    stale maps.)"""
    import gc

    def shard_maps() -> int:
        with open("/proc/self/maps") as f:
            return sum(1 for line in f if str(run) in line and ".arrow" in line)

    if not Path("/proc/self/maps").exists():
        pytest.skip("needs /proc (Linux)")
    gc.disable()
    try:
        before = shard_maps()
        ds = PackedDataset(run, backend="numpy", batch_size=4, seed=3)
        for _ in ds:
            pass
        assert shard_maps() - before == len(ds.manifest.paths)  # every shard opened and mapped
        del ds
        assert shard_maps() == before
    finally:
        gc.enable()


def test_kernels_load_from_numbas_disk_cache(tmp_path):
    """Each DataLoader worker is a new process: the kernels must come from numba's on-disk
    cache after the first compile, not be recompiled (seconds per worker) into yet another
    cache file every time."""
    import subprocess
    import sys
    from pathlib import Path

    if fused.locate_kernel() is None:
        pytest.skip("numba is not installed")
    code = (
        "import numpy as np\n"
        "from datapipe.loader import fused\n"
        "g = fused.gather_kernel(); src = np.arange(64, dtype=np.uint16); out = np.empty((1, 4), np.uint16)\n"
        "g(src.__array_interface__['data'][0], np.array([3], np.int64), 2, out)\n"
        "assert out.tolist() == [[3, 4, 5, 6]], out\n"
        "p = fused.permute_kernel(); p(np.arange(4), np.uint64(10), np.zeros(4, np.uint64), np.uint64(2), "
        "np.empty(4, np.int64))\n"
        "print(sum(g.stats.cache_hits.values()), sum(p.stats.cache_hits.values()))\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "NUMBA_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, env=env) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    assert runs[0].stdout.split() == ["0", "0"] and runs[1].stdout.split() == ["1", "1"]
    files = sorted(p.name for p in tmp_path.rglob("*.nbc"))
    assert len(files) == len(set(files)) and len(files) <= 2


def test_compact_fields_with_max_segments_exactly_used(run, kernel_mode):
    """Rows whose segments fill cu_seqlens to its last column (num_segments == max_segments,
    no seq_len padding left): the kernel writes starts, then the padding, in two loops that
    meet at that edge; both must still equal the reference, in every field."""
    probe = PackedDataset(run, backend="numpy", batch_size=5, seed=2, fields=("num_segments",))
    most = max(int(b["num_segments"].max()) for b in probe)
    assert most > 1
    ds = PackedDataset(
        run, backend="numpy", batch_size=5, seed=2, fields=COMPACT_FIELDS, max_segments=most, mask_cross_document=True
    )
    assert _check_against_reference(ds) > 0
    full = [b["cu_seqlens"][b["num_segments"] == most] for b in ds]
    assert sum(len(c) for c in full) > 0  # the edge case occurred
    assert all((c[:, -1] == ds.seq_len).all() and (np.diff(c, axis=1) > 0).all() for c in full if len(c))


@pytest.mark.parametrize("label_shift", [0, 1])
@pytest.mark.parametrize("mask_cross", [False, True])
def test_compiled_bounds_equal_numpy_on_irregular_starts(label_shift, mask_cross):
    """The compiled bounds skip sorting a row whose starts are already strictly increasing
    (every shard datapipe writes); rows that are not (unsorted, repeated, a start at 0, at
    seq_len or exactly where padding begins) take the sort-and-dedupe path. Both must equal
    batch.bounds."""
    kernel = fused.bounds_kernel()
    if kernel is None:
        pytest.skip("numba not installed")
    rng = np.random.default_rng(7)
    L, rows = 32, 400
    n_tok = rng.integers(1, L + label_shift + 1, rows)
    counts = rng.integers(0, 6, rows)
    docs = []
    for r in range(rows):
        pool = [0, L, int(n_tok[r]), *rng.integers(0, L + 1, 4).tolist()]
        row_docs = rng.choice(pool, counts[r]).tolist()
        docs += sorted(row_docs) if r % 2 else row_docs  # half sorted (maybe repeated), half in any order
    docs = np.asarray(docs, np.int64)
    want = bounds(n_tok, counts, docs, L, L + label_shift, 8, mask_cross)
    got = {
        "cu_seqlens": np.empty((rows, 9), np.int32),
        "num_segments": np.empty(rows, np.int32),
        "label_end": np.empty(rows, np.int32),
    }
    most = kernel(n_tok, counts, docs, L, label_shift, mask_cross, got["cu_seqlens"], got["num_segments"], got["label_end"])
    assert most == int(want["num_segments"].max())
    assert (want["num_segments"] > 1).any() and (counts > 0).sum() > rows // 2
    for k, v in want.items():
        assert np.array_equal(got[k], v), k
