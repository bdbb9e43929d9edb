"""Damaged shards and hostile manifests: the loader raises a Python error naming the shard and
never crashes the process.

Each case corrupts its own copy of a run folder and is read in a process of its own (a fresh
interpreter, or one forked per case from an interpreter that imported the loader once), so
a SIGSEGV or SIGBUS shows up as a signal (a failure here), not as a dead test runner.
Every case runs three ways: in-process with the numba kernels forced on from the first
block, in-process with DATAPIPE_LOADER_NUMBA=0, and through a torch DataLoader with two
workers. Shards are synthetic (exact shapes: equal rows and tokens per shard) and, for a
subset, packed from real zh/en Wikipedia text. Before these checks existed, the first case (last doc_starts offset + 4,000,000)
killed the reader with SIGSEGV and a truncated mapped shard with SIGBUS.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datapipe.tokens.shard_format import ShardMeta
from datapipe.tokens.shard_writer import write_shard
from tests.support.loader_helpers import make_run, write_manifest
from tests.support.shared_data import PROJECT_ROOT

# Every case in child processes, three ways (one with torch DataLoader workers): minutes on 2 cores.
pytestmark = pytest.mark.slow

VICTIM = "shards/web/train-00001.arrow"


# ---- the child: reads a run and reports what happened -------------------------------------
def child(spec: dict) -> dict:
    """Iterate one epoch; report the exception (type, message) or the number of batches."""
    import time

    from datapipe.loader import PackedDataset, fused

    kw = {
        "batch_size": 4,
        "seed": 3,
        "verify": spec.get("verify", "full"),
        "recheck_interval": spec.get("recheck", 0.0),
        **spec.get("kw", {}),
    }
    n = 0
    try:
        if spec["via"] == "torch":
            ds = PackedDataset(spec["run"], **kw)
            assert type(ds).__name__ == "TorchPackedDataset"
            ds._warm = True  # workers inherit it: compiled paths (when enabled) from their first block
            batches = iter(ds.dataloader(num_workers=2))
        else:
            ds = PackedDataset(spec["run"], backend="numpy", **kw)
            ds._warm = True  # the numba kernels from the first block on (numpy ones when disabled)
            if spec.get("preopen"):
                ds.table.pin(np.arange(len(ds.manifest.paths)))
            batches = iter(ds)
        if spec.get("epochs", 1) > 1:  # every epoch's batches, then the change between epochs
            batches = _epochs(ds, spec)
        for _batch in batches:
            n += 1
            if n == 1 and spec.get("change_after_first"):  # at once, with no pause: the next gather follows
                if spec.get("wait_verified"):
                    ds._verifier.wait()  # every mapped shard hashed and found good before the change
                for sh in [sh for sh in ds.table.objs if sh is not None]:
                    change_in_place(sh.path, spec["change_after_first"])
            if n == 1 and spec.get("truncate_after_first"):
                if spec["via"] == "torch" or spec["truncate_after_first"] == "all":
                    time.sleep(0.5)  # let the workers fill their prefetch queues and go idle
                    paths = [str(p) for p in Path(spec["run"]).glob("shards/*/*.arrow")]
                else:  # exactly the shards mapped so far
                    paths = [sh.path for sh in ds.table.objs if sh is not None]
                for p in paths:
                    os.truncate(p, os.path.getsize(p) // 2)
                time.sleep(spec.get("sleep_after", 0.0))
        out = {"exc": None}
    except Exception as exc:  # noqa: BLE001 - report whatever it is; the test judges
        out = {"exc": type(exc).__name__, "msg": str(exc)}
    out["batches"] = n
    out["numba"] = fused.gather_kernel() is not None
    return out


def change_in_place(path: str, how: str) -> None:
    """Change a shard file in place as another process would: cut it in half (``truncate``), write
    other bytes over its middle half with ``write`` (``overwrite``), or through a shared memory
    map (``mmap_write``, which no file event reports)."""
    import mmap

    size = os.path.getsize(path)
    if how == "truncate":
        os.truncate(path, size // 2)
        return
    with open(path, "r+b") as f:
        lo, hi = size // 4, size // 2
        if how == "overwrite":
            f.seek(lo)
            data = f.read(hi - lo)
            f.seek(lo)
            f.write(bytes(b ^ 0x5A for b in data))
        else:
            with mmap.mmap(f.fileno(), size) as mm:
                mm[lo:hi] = bytes(b ^ 0x5A for b in mm[lo:hi])


def _epochs(ds, spec: dict):
    """``spec["epochs"]`` epochs of ``ds``; between them each mapped shard is changed as
    ``spec["between_epochs"]`` says (``change_in_place``)."""
    for epoch in range(spec["epochs"]):
        if epoch:
            for sh in [sh for sh in ds.table.objs if sh is not None]:
                change_in_place(sh.path, spec["between_epochs"])
        yield from ds


def forked(specs: list[dict]) -> list[dict]:
    """``child`` for each spec in a process of its own, forked from this one after the loader
    (numba kernels, torch) is imported once: a case that crashes reports its signal and the
    others still run."""
    from datapipe.loader import fused

    for load in (fused.kernel, fused.locate_kernel, fused.address_kernel, fused.gather_kernel):
        load()  # compiled (or found disabled) once, before forking
    if any(s["via"] == "torch" for s in specs):
        import datapipe.loader.torch_adapter  # noqa: F401 - imports torch once
    with tempfile.TemporaryDirectory() as tmp:  # load the kernels' compiled code once, not per fork
        child({"run": str(make_run(Path(tmp), {"web": [8, 8]}, seq_len=32)), "via": "inproc"})
    results = []
    for spec in specs:
        fd, out = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:  # the case's own process
            try:
                Path(out).write_text(json.dumps(child(spec)))
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        text = Path(out).read_text()
        os.unlink(out)
        if os.WIFSIGNALED(status):
            results.append({"crashed": os.WTERMSIG(status)})
        else:
            results.append(json.loads(text) if text else {"exc": "no result", "msg": f"exit status {status}"})
    return results


def run_child(spec: dict | list[dict], numba: bool = True) -> dict | list[dict]:
    """Run ``child`` in a fresh interpreter; a list of specs runs as ``forked`` there."""
    env = {**os.environ, "DATAPIPE_LOADER_NUMBA": "1" if numba else "0"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.faults.test_loader_corrupt", json.dumps(spec)],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode >= 0, f"the reader CRASHED with signal {-proc.returncode}:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for r, s in zip(result if isinstance(result, list) else [result], spec if isinstance(spec, list) else [spec]):
        if s["via"] == "inproc" and "numba" in r:
            assert r["numba"] is numba or (numba and not _has_numba())
    return result


def _has_numba() -> bool:
    import importlib.util

    return importlib.util.find_spec("numba") is not None


# ---- corruptions ---------------------------------------------------------------------------
def layout(path: Path) -> dict[str, int]:
    """File offsets of the first record batch's buffers, and a few counts."""
    data = path.read_bytes()
    buf = pa.py_buffer(data)
    table = pa.ipc.open_file(pa.BufferReader(buf)).read_all()
    ids, starts, n_tok = (table.column(c).chunks[0] for c in ("input_ids", "doc_starts", "n_tokens"))

    def at(b: pa.Buffer) -> int:
        return b.address - buf.address

    return {
        "tokens": at(ids.values.buffers()[1]),
        "offsets": at(starts.buffers()[1]),
        "values": at(starts.values.buffers()[1]),
        "n_tokens": at(n_tok.buffers()[1]),
        "rows": len(ids),
        "n_values": len(starts.values),
        "size": len(data),
        "row_len": ids.type.list_size,
    }


def patch_i32(path: Path, pos: int, change: Callable[[int], int]) -> None:
    with path.open("r+b") as f:
        f.seek(pos)
        (old,) = struct.unpack("<i", f.read(4))
        f.seek(pos)
        f.write(struct.pack("<i", change(old)))


def offsets(path: Path) -> np.ndarray:
    lay = layout(path)
    return np.frombuffer(path.read_bytes(), np.int32, count=lay["rows"] + 1, offset=lay["offsets"])


def last_offset_plus_4m(run: Path, victim: str = VICTIM) -> str:
    lay = layout(run / victim)
    patch_i32(run / victim, lay["offsets"] + 4 * lay["rows"], lambda v: v + 4_000_000)
    return "doc_starts offsets"


def middle_offset_out_of_range(run: Path, victim: str = VICTIM) -> str:
    lay = layout(run / victim)
    patch_i32(run / victim, lay["offsets"] + 4 * (lay["rows"] // 2), lambda v: v + 1_000_000)
    return "doc_starts offsets"


def offset_negative(run: Path, victim: str = VICTIM) -> str:
    lay = layout(run / victim)
    patch_i32(run / victim, lay["offsets"], lambda v: -8)
    return "doc_starts offsets"


def offsets_decreasing(run: Path, victim: str = VICTIM) -> str:
    o = offsets(run / victim)
    k = int(np.nonzero(np.diff(o) > 0)[0][0]) + 1  # o[k] > o[k - 1]: make o[k] < o[k - 1]
    patch_i32(run / victim, layout(run / victim)["offsets"] + 4 * k, lambda v: int(o[k - 1]) - 1)
    return "not monotonic"


def doc_start_out_of_row(run: Path, victim: str = VICTIM) -> str:
    lay = layout(run / victim)
    patch_i32(run / victim, lay["values"] + 4 * (lay["n_values"] - 1), lambda v: lay["row_len"] + 100)
    return r"doc_starts value \d+ in row \d+ is outside"


def doc_start_negative(run: Path, victim: str = VICTIM) -> str:
    lay = layout(run / victim)
    patch_i32(run / victim, lay["values"], lambda v: -3)
    return "is outside"


def doc_starts_unsorted(run: Path, victim: str = VICTIM) -> str:
    lay = layout(run / victim)
    o = offsets(run / victim)
    v = np.frombuffer((run / victim).read_bytes(), np.int32, count=lay["n_values"], offset=lay["values"])
    r = next(r for r in range(lay["rows"]) if o[r + 1] - o[r] >= 2 and v[o[r]] >= 1)  # two starts, first > 0
    patch_i32(run / victim, lay["values"] + 4 * int(o[r] + 1), lambda _: int(v[o[r]]) - 1)  # below the first
    return f"doc_starts of row {r} are not sorted"


def n_tokens_out_of_range(run: Path, victim: str = VICTIM) -> str:
    lay = layout(run / victim)
    patch_i32(run / victim, lay["n_tokens"] + 4 * 3, lambda v: -5)
    return r"n_tokens\[3\] = -5"


def truncated_before_open(run: Path, victim: str = VICTIM) -> str:
    p = run / victim
    os.truncate(p, p.stat().st_size // 2)
    return "no Arrow IPC file magic"


def truncated_to_nothing(run: Path, victim: str = VICTIM) -> str:
    os.truncate(run / victim, 3)
    return "too small"


def flipped_token_byte(run: Path, victim: str = VICTIM) -> str:
    lay = layout(run / victim)
    pos = lay["tokens"] + lay["rows"] * lay["row_len"]  # a byte in the middle of the token data
    with (run / victim).open("r+b") as f:
        f.seek(pos)
        b = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([b ^ 0x10]))
    return "sha256 .* does not match the manifest"


def swapped_valid_shard(run: Path, victim: str = VICTIM) -> str:
    """Another valid shard in its place: same source, rows and token count, other rows."""
    with pa.OSFile(str(run / victim)) as f:
        table = pa.ipc.open_file(f).read_all()
    meta = ShardMeta.from_schema(table.schema)
    ids = table.column("input_ids").combine_chunks()
    tokens = ids.flatten().to_numpy().reshape(len(ids), -1)[::-1]
    starts = table.column("doc_starts").combine_chunks()
    counts = np.diff(starts.offsets.to_numpy())[::-1]
    values = [starts[i].values.to_numpy() for i in range(len(starts))][::-1]
    n_tok = table.column("n_tokens").to_numpy()[::-1]
    write_shard(
        run / victim, tokens, np.concatenate([[0], np.cumsum(counts)]), np.concatenate(values).astype(np.int32), n_tok, meta
    )
    return "sha256 .* does not match the manifest"


def copied_other_shard(run: Path, victim: str = VICTIM) -> str:
    """A byte-for-byte copy of a sibling shard (same source, rows and token count) in its place."""
    sibling = next(p for p in sorted((run / victim).parent.glob("*.arrow")) if p.name != Path(victim).name)
    shutil.copy(sibling, run / victim)
    return "sha256 .* does not match the manifest"


def _outside_copy(run: Path) -> Path:
    outside = run.parent / f"{run.name}-elsewhere" / "x.arrow"
    outside.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(run / VICTIM, outside)
    return outside


def _set_path(run: Path, new: str) -> None:
    recs = pq.read_table(run / "shards" / "manifest.parquet").to_pylist()
    for rec in recs:
        if rec["path"] == VICTIM:
            rec["path"] = new
    write_manifest(run, recs)


def manifest_dotdot(run: Path, victim: str = VICTIM) -> str:
    _outside_copy(run)
    _set_path(run, f"shards/../../{run.name}-elsewhere/x.arrow")
    return r"'\.\.' in a manifest path"


def manifest_absolute(run: Path, victim: str = VICTIM) -> str:
    _set_path(run, str(_outside_copy(run)))
    return "absolute manifest paths are refused"


def symlink_escaping(run: Path, victim: str = VICTIM) -> str:
    target = _outside_copy(run)
    (run / victim).unlink()
    (run / victim).symlink_to(target)
    return "outside the run folder"


CASES: dict[str, tuple[Callable[[Path], str], str]] = {  # name -> (corrupt, exception type)
    "last_offset_plus_4m": (last_offset_plus_4m, "ShardCorrupt"),
    "middle_offset_out_of_range": (middle_offset_out_of_range, "ShardCorrupt"),
    "offset_negative": (offset_negative, "ShardCorrupt"),
    "offsets_decreasing": (offsets_decreasing, "ShardCorrupt"),
    "doc_start_out_of_row": (doc_start_out_of_row, "ShardCorrupt"),
    "doc_start_negative": (doc_start_negative, "ShardCorrupt"),
    "doc_starts_unsorted": (doc_starts_unsorted, "ShardCorrupt"),
    "n_tokens_out_of_range": (n_tokens_out_of_range, "ShardCorrupt"),
    "truncated_before_open": (truncated_before_open, "ShardCorrupt"),
    "truncated_to_nothing": (truncated_to_nothing, "ShardCorrupt"),
    "flipped_token_byte": (flipped_token_byte, "ShardCorrupt"),
    "swapped_valid_shard": (swapped_valid_shard, "ShardCorrupt"),
    "copied_other_shard": (copied_other_shard, "ShardCorrupt"),
    "manifest_dotdot": (manifest_dotdot, "ShardPathError"),
    "manifest_absolute": (manifest_absolute, "ShardPathError"),
    "symlink_escaping": (symlink_escaping, "ShardPathError"),
}
WAYS = {"numba": ("inproc", True), "numpy": ("inproc", False), "torch-workers": ("torch", True)}


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory) -> Path:
    # Equal rows per shard; several documents per row; the last row of each shard padded.
    return make_run(tmp_path_factory.mktemp("clean") / "run", {"web": [48, 48, 48], "code": [48, 48]}, seq_len=32)


def fresh_copy(clean: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(clean, run)
    return run


@pytest.fixture(scope="module")
def case_results(clean_run, tmp_path_factory) -> Callable[[str], dict[str, dict]]:
    """way -> {case: result}: every case corrupts its own copy of the run, and one interpreter
    per way reads them, each case in its own forked process (``forked``), so a crash is
    that case's crash. Through the DataLoader, the two workers read the shards: one that
    crashes is reported by the DataLoader as a RuntimeError naming the signal."""
    cache: dict[str, dict[str, dict]] = {}

    def get(way: str) -> dict[str, dict]:
        if way not in cache:
            via, numba = WAYS[way]
            specs, patterns = [], {}
            for case, (corrupt, _) in CASES.items():
                run = fresh_copy(clean_run, tmp_path_factory.mktemp(f"{way}-{case}"))
                patterns[case] = corrupt(run)
                specs.append({"run": str(run), "via": via})
            results = run_child(specs, numba)
            cache[way] = {case: {**r, "pattern": patterns[case]} for case, r in zip(CASES, results)}
        return cache[way]

    return get


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("case", list(CASES))
def test_corruption_raises_naming_the_shard(case_results, case, way):
    if way == "torch-workers":
        pytest.importorskip("torch")
    result = case_results(way)[case]
    assert "crashed" not in result, f"the reader CRASHED with signal {result.get('crashed')}: {case}, {way}"
    assert result["exc"] == CASES[case][1], result
    assert VICTIM in result["msg"] or "x.arrow" in result["msg"], result  # names the shard
    assert re.search(result["pattern"], result["msg"]), result


REAL_VICTIM = "shards/zh/train-00001.arrow"


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """Shards best-fit packed from real zh/en Wikipedia text (tests/loader/test_loader_real.py)."""
    from tests.loader.test_loader_real import _real_run

    return _real_run(tmp_path_factory.mktemp("real"))[0]


REAL_CASES = ["last_offset_plus_4m", "n_tokens_out_of_range", "flipped_token_byte", "swapped_valid_shard"]
# The real run's shards, every one mapped, then changed in place (``change_in_place``): what the error says.
CHANGED_UNDER_A_MAP = {"truncate": "shrank below", "overwrite": "written while mapped"}


@pytest.fixture(scope="module")
def real_results(real_run, tmp_path_factory) -> Callable[[bool], dict[str, dict]]:
    """numba -> {case: result} over copies of the real run, every case forked from one interpreter
    (``forked``): the damage cases both ways, the shards changed under a map with the numba kernels
    only (what they test is the watch and the re-checks, not the kernels)."""
    cache: dict[bool, dict[str, dict]] = {}

    def get(numba: bool) -> dict[str, dict]:
        if numba not in cache:
            tmp = tmp_path_factory.mktemp("real-numba" if numba else "real-numpy")
            specs, names, patterns = [], [], {}
            for case in REAL_CASES:
                run = fresh_copy(real_run, tmp / case)
                patterns[case] = CASES[case][0](run, REAL_VICTIM)
                specs.append({"run": str(run), "via": "inproc"})
                names.append(case)
            for how in CHANGED_UNDER_A_MAP if numba else ():
                run = fresh_copy(real_run, tmp / how)
                spec = {"run": str(run), "via": "inproc", "preopen": True, "recheck": 0.25, "change_after_first": how}
                specs.append({**spec, "wait_verified": how == "overwrite"})
                names.append(how)
            cache[numba] = {name: {**r, "pattern": patterns.get(name)} for name, r in zip(names, run_child(specs, numba))}
        return cache[numba]

    return get


@pytest.mark.parametrize("numba", [True, False], ids=["numba", "numpy"])
def test_real_text_shards(real_results, numba):
    results = real_results(numba)
    for case in REAL_CASES:
        result = results[case]
        assert "crashed" not in result, f"the reader CRASHED with signal {result.get('crashed')}: {case}"
        assert result["exc"] == "ShardCorrupt" and REAL_VICTIM in result["msg"], (case, result)
        assert re.search(result["pattern"], result["msg"]), (case, result)


@pytest.mark.parametrize("how", list(CHANGED_UNDER_A_MAP))
def test_real_text_shards_changed_under_a_map(real_results, how):
    """Shards packed from real text, every one mapped, then all cut in half (the next batch asked for
    at once) or overwritten in place after verification: ShardCorrupt naming a shard, never SIGBUS
    (signal 7) nor batches read from the changed bytes (before: both)."""
    result = real_results(True)[how]
    assert "crashed" not in result, f"the reader CRASHED with signal {result.get('crashed')}"
    assert result["exc"] == "ShardCorrupt" and "shards/" in result["msg"], result
    assert CHANGED_UNDER_A_MAP[how] in result["msg"], result
    assert result["batches"] == 1, result  # nothing read after the change


def test_random_damage_never_crashes(clean_run, tmp_path):
    """Seeded random damage anywhere in a shard (footer, schema, offsets, tokens) or a cut at a
    random length: every case is a ShardCorrupt naming the shard, never a signal."""
    rng = np.random.default_rng(12)
    data = (clean_run / VICTIM).read_bytes()
    specs = []
    for trial in range(25):
        run = fresh_copy(clean_run, tmp_path / str(trial))
        b = bytearray(data)
        if trial % 5 == 4:
            b = b[: int(rng.integers(0, len(b)))]
        else:
            for pos in rng.integers(0, len(b), size=int(rng.integers(1, 5))):
                b[pos] ^= int(rng.integers(1, 256))  # always a different byte
        (run / VICTIM).write_bytes(bytes(b))
        specs.append({"run": str(run), "via": "inproc"})
    for trial, result in enumerate(run_child(specs, numba=True)):
        assert "crashed" not in result, f"trial {trial}: the reader CRASHED with signal {result.get('crashed')}"
        assert result["exc"] == "ShardCorrupt" and VICTIM in result["msg"], (trial, result)


@pytest.mark.parametrize("way", list(WAYS))
def test_clean_run_reads_without_error(clean_run, tmp_path, way):
    """The same subprocess read of the intact copy succeeds: the errors above come from the damage."""
    if way == "torch-workers":
        pytest.importorskip("torch")
    via, numba = WAYS[way]
    result = run_child({"run": str(fresh_copy(clean_run, tmp_path)), "via": via}, numba)
    assert result["exc"] is None and result["batches"] == 240 // 4, result


@pytest.mark.parametrize("way", list(WAYS))
def test_truncated_after_mapping(clean_run, tmp_path, way):
    """Shards already memory-mapped are cut in half mid-epoch: a Python error, not SIGBUS."""
    if way == "torch-workers":
        pytest.importorskip("torch")
    via, numba = WAYS[way]
    spec: dict = {"run": str(fresh_copy(clean_run, tmp_path)), "via": via, "truncate_after_first": True}
    if way == "torch-workers":
        # Workers send runs of up to 32 batches and prefetch two runs each: batches of one row make the
        # epoch (240) longer than what they hold before the cut (2 x 2 x 32), so later runs read cut shards
        spec["kw"] = {"batch_size": 1}
    result = run_child(spec, numba)
    assert result["exc"] == "ShardCorrupt", result
    assert "shards/" in result["msg"], result
    if via == "inproc":  # in-process, exactly the mapped shards were cut: the size re-check caught it
        assert "shrank below" in result["msg"], result


def test_truncated_after_mapping_default_interval(clean_run, tmp_path):
    """With the default re-check interval the check runs before the next gather once it has passed."""
    run = fresh_copy(clean_run, tmp_path)
    result = run_child({"run": str(run), "via": "inproc", "truncate_after_first": True, "recheck": 0.25, "sleep_after": 0.6})
    assert result["exc"] == "ShardCorrupt" and "shrank below" in result["msg"], result


def test_copy_shards_survives_truncated_originals(clean_run, tmp_path):
    """copy_shards maps private, verified copies: cutting the originals in place harms nothing."""
    run = fresh_copy(clean_run, tmp_path)
    result = run_child(
        {
            "run": str(run),
            "via": "inproc",
            "truncate_after_first": "all",
            "preopen": True,
            "kw": {"copy_shards": True, "cache_dir": str(tmp_path / "cache")},
        }
    )
    assert result["exc"] is None and result["batches"] == 60, result
    assert (run / VICTIM).stat().st_size < (clean_run / VICTIM).stat().st_size  # the originals were cut


def test_truncated_and_iterated_at_once(clean_run, tmp_path):
    """Every mapped shard cut in half and the next batch asked for at once, with the default
    re-check interval: ShardCorrupt naming the shard (before the shards were watched: SIGBUS)."""
    run = fresh_copy(clean_run, tmp_path)
    spec = {"run": str(run), "via": "inproc", "preopen": True, "recheck": 0.25, "change_after_first": "truncate"}
    result = run_child(spec)
    assert result["exc"] == "ShardCorrupt" and "shards/" in result["msg"] and "shrank below" in result["msg"], result


def test_overwritten_in_place_while_mapped(clean_run, tmp_path):
    """Every mapped shard verified, then overwritten in place (size kept) while mapped: the next batch
    raises ShardCorrupt instead of handing out the new bytes (before: the epoch ended without error,
    its later batches read from the changed files)."""
    run = fresh_copy(clean_run, tmp_path)
    spec = {
        "run": str(run),
        "via": "inproc",
        "preopen": True,
        "recheck": 0.25,
        "wait_verified": True,
        "change_after_first": "overwrite",
    }
    result = run_child(spec)
    assert result["exc"] == "ShardCorrupt" and "written while mapped" in result["msg"], result
    assert result["batches"] == 1, result


def test_changed_between_epochs_through_a_map(clean_run, tmp_path):
    """A shard changed through another memory map (no file event) between epochs: the next epoch's
    re-check of every open shard (size, modification and change time) raises before its first batch."""
    run = fresh_copy(clean_run, tmp_path)
    result = run_child({"run": str(run), "via": "inproc", "epochs": 2, "between_epochs": "mmap_write"})
    assert result["exc"] == "ShardCorrupt" and "changed on disk since it was opened" in result["msg"], result
    assert result["batches"] == 60, result  # the first epoch whole, nothing of the second


def test_shards_others_may_write_are_copied_by_default(clean_run, tmp_path):
    """Group-writable shards (a folder others may write to) are mapped as private copies without
    asking: cutting the originals in place harms no batch."""
    run = fresh_copy(clean_run, tmp_path)
    for p in (run / "shards").rglob("*.arrow"):
        p.chmod(0o664)
    kw = {"cache_dir": str(tmp_path / "cache")}
    result = run_child({"run": str(run), "via": "inproc", "truncate_after_first": "all", "preopen": True, "kw": kw})
    assert result["exc"] is None and result["batches"] == 60, result
    assert (run / VICTIM).stat().st_size < (clean_run / VICTIM).stat().st_size  # the originals were cut
    copies = list((tmp_path / "cache").glob("*.arrow"))
    assert len(copies) == 5 and all(c.stat().st_mode & 0o222 == 0 for c in copies)  # read-only copies


def test_verify_modes(clean_run, tmp_path):
    """strict: the flipped shard is refused when first opened; open: the flip goes unnoticed
    (documented), while structural damage is still refused."""
    run = fresh_copy(clean_run, tmp_path)
    flipped_token_byte(run)
    strict = run_child({"run": str(run), "via": "inproc", "verify": "strict"})
    assert strict["exc"] == "ShardCorrupt" and VICTIM in strict["msg"] and "sha256" in strict["msg"], strict
    assert run_child({"run": str(run), "via": "inproc", "verify": "open"}) == {"exc": None, "batches": 60, "numba": _has_numba()}
    run2 = fresh_copy(clean_run, tmp_path / "b")
    last_offset_plus_4m(run2)
    opened = run_child({"run": str(run2), "via": "inproc", "verify": "open"})
    assert opened["exc"] == "ShardCorrupt" and "doc_starts offsets" in opened["msg"], opened


def test_verify_mode_refused(clean_run):
    from datapipe.loader import PackedDataset

    with pytest.raises(ValueError, match="verify='fast'; allowed: full, strict, open"):
        PackedDataset(clean_run, backend="numpy", verify="fast")


def test_manifest_size_column(clean_run, tmp_path):
    """A manifest with a ``bytes`` column: a shard of another size is refused before it is mapped."""
    from datapipe.loader import PackedDataset, ShardCorrupt

    run = fresh_copy(clean_run, tmp_path)
    recs = pq.read_table(run / "shards" / "manifest.parquet").to_pylist()
    for rec in recs:
        rec["bytes"] = (run / rec["path"]).stat().st_size + (1 if rec["path"] == VICTIM else 0)
    pq.write_table(pa.Table.from_pylist(recs), run / "shards" / "manifest.parquet")
    ds = PackedDataset(run, backend="numpy", batch_size=4)
    with pytest.raises(ShardCorrupt, match=f"shard {VICTIM}: .* bytes on disk, the manifest says"):
        list(ds)


def test_bad_sha256_in_manifest_refused(clean_run, tmp_path):
    """The sha256 names cache files for remote shards: anything but hex is refused up front."""
    from datapipe.loader import PackedDataset

    run = fresh_copy(clean_run, tmp_path)
    recs = pq.read_table(run / "shards" / "manifest.parquet").to_pylist()
    recs[0]["sha256"] = "../../etc/passwd"
    write_manifest(run, recs)
    with pytest.raises(ValueError, match="not 64 lowercase hex digits"):
        PackedDataset(run, backend="numpy")


def test_uri_path_is_allowed_on_purpose(clean_run, tmp_path):
    """A manifest path written as a file:// URI reads that file: a deliberate choice, not an escape."""
    from datapipe.loader import PackedDataset

    run = fresh_copy(clean_run, tmp_path)
    outside = _outside_copy(run)
    (run / VICTIM).unlink()
    _set_path(run, outside.as_uri())
    ds = PackedDataset(run, backend="numpy", batch_size=4)
    assert sum(len(b["input_ids"]) for b in ds) == 240


if __name__ == "__main__":
    arg = json.loads(sys.argv[1])
    print(json.dumps(forked(arg) if isinstance(arg, list) else child(arg)))
