"""Faults around the run folder: stray temporary files, disk full (hook and a real full tmpfs).

The pipeline tests run in this process on the shared embedded Ray and compare every output
with one clean run of the demo pipeline.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from datapipe.cli import main
from datapipe.engine.disk_full import find_disk_full
from datapipe.engine.runner import run_pipeline
from datapipe.pipeline.load import load_pipeline
from datapipe.storage.atomic import fault_scope, is_temp_name, sweep_temp_files, temp_path_for
from tests.e2e.test_resume import fingerprint
from tests.support.shared_data import PROJECT_ROOT


def temp_names(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if is_temp_name(p.name))


# --- pieces, no Ray -------------------------------------------------------------


def test_sweep_removes_every_temporary_name_and_nothing_else(tmp_path: Path) -> None:
    planted = [
        "rejected/web_zh/web_zh-00000.01-langid.parquet.tmp-4711-0a1b2c3d",
        "docs/web_en/web_en-00001.parquet.tmp-12-deadbeef",
        "_work/markers/map0/web_zh/web_zh-00000.json.tmp-99-00ff00ff",
        "shards/web_zh/train-00000.arrow.tmp-5-12345678",
        "stats.duckdb.tmp-77-abcdef01",
        "stats.duckdb.tmp-77-abcdef01.wal",
    ]
    for name in planted:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"half")
    spill = tmp_path / "stats.duckdb.tmp-77-abcdef01.tmp"  # DuckDB's spill folder of the temporary database
    spill.mkdir()
    (spill / "block").write_bytes(b"x")
    kept = ["docs/web_en/web_en-00001.parquet", "notes.tmp-draft.txt", "run.json"]
    for name in kept:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("keep")
    assert sweep_temp_files(tmp_path) == len(planted) + 1
    assert temp_names(tmp_path) == []
    assert all((tmp_path / name).read_text() == "keep" for name in kept)


def test_enospc_hook_fails_only_the_named_task(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DATAPIPE_FAULT_ENOSPC_AT", "map0:web_zh/*")
    target = tmp_path / "docs" / "a.parquet"
    temp_path_for(target)  # outside any task: no fault
    with fault_scope("map0", "web_en/web_en-00000"):
        temp_path_for(target)
    with fault_scope("map0", "web_zh/web_zh-00001"), pytest.raises(OSError) as info:
        temp_path_for(target)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)


def test_disk_full_is_recognised_in_every_wrapping() -> None:
    import ray.exceptions

    plain = OSError(errno.ENOSPC, "No space left on device", "/run/docs/a.parquet.tmp-1-0a1b2c3d")
    assert find_disk_full(plain).path == "/run/docs/a.parquet"
    wrapped = ray.exceptions.RayTaskError("_map_task", 'File "/src/tasks.py", line 3\nOSError: ...', plain)
    found = find_disk_full(wrapped)
    assert found is not None and found.path == "/run/docs/a.parquet" and found.what == "no space left on device"
    quota = OSError(errno.EDQUOT, "Disk quota exceeded", "/run/run.json")
    assert find_disk_full(quota).what == "disk quota exceeded"
    arrow = OSError("Error writing bytes to file. Detail: [errno 28] No space left on device")  # no errno set
    assert find_disk_full(arrow) is not None and find_disk_full(arrow).path is None
    try:
        try:
            raise RuntimeError('IO Error: Could not write file "/run/stats.duckdb.tmp-3-aaaabbbb": No space left on device')
        except RuntimeError as inner:
            raise ValueError("building statistics failed") from inner
    except ValueError as outer:
        assert find_disk_full(outer).path == "/run/stats.duckdb"
    assert find_disk_full(OSError(errno.EACCES, "Permission denied", "/x")) is None


# --- whole runs on the shared embedded Ray ------------------------------------------


def run(pipeline: Path, out: Path, **kw):
    return run_pipeline(load_pipeline(pipeline), output=out, show_progress=False, log=lambda m: None, **kw)


@pytest.fixture(scope="module")
def clean(ray_local, tmp_path_factory) -> tuple[Path, dict]:
    """One clean run of the demo pipeline: (its pipeline file, the fingerprint of its outputs)."""
    project = tmp_path_factory.mktemp("project")
    shutil.copytree(PROJECT_ROOT / "pipelines", project / "pipelines")
    shutil.copytree(PROJECT_ROOT / "tokenizer", project / "tokenizer")
    pipeline = project / "pipelines" / "demo.yaml"
    run(pipeline, project / "clean")
    return pipeline, fingerprint(project / "clean")


# Every kind of phase's writer, in one chain as tests/e2e/test_resume.py's kills: each run fails at the
# next phase's first write and the next run resumes it (a run per fault, each with its own full rerun,
# cost CI ~4 min of a test worker).
ENOSPC_CHAIN = ["map0:web_zh/*", "shuffle0", "reduce1", "pack", "stats"]


@pytest.mark.timeout(1200)  # six runs (the chain, then the one that completes): ~2-4 min on 2 cores
def test_disk_full_in_each_phase_gives_one_line_and_the_rerun_completes_identically(clean, tmp_path: Path, monkeypatch) -> None:
    pipeline, expected = clean
    out = tmp_path / "out"
    for fault in ENOSPC_CHAIN:
        monkeypatch.setenv("DATAPIPE_FAULT_ENOSPC_AT", fault)
        res = CliRunner().invoke(main, ["run", str(pipeline), "--output", str(out), "--no-progress"])
        assert res.exit_code == 1, (fault, res.output)
        errors = [line for line in res.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in res.output, (fault, res.output)
        assert "disk full (no space left on device) while writing " + str(out) in errors[0], fault
        assert "free space" in errors[0] and "run the same command again to resume" in errors[0], fault
    monkeypatch.delenv("DATAPIPE_FAULT_ENOSPC_AT")
    res = CliRunner().invoke(main, ["run", str(pipeline), "--output", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert fingerprint(out) == expected
    assert temp_names(out) == []


def test_stray_temp_files_of_a_killed_worker_are_swept_and_never_read(clean, tmp_path: Path) -> None:
    """As a pack worker killed mid-write leaves it: no marker, a half-written shard under a temporary
    name, and leftovers of killed writers elsewhere; the rerun removes them all and redoes the task."""
    pipeline, expected = clean
    out = tmp_path / "out"
    run(pipeline, out)
    shard = out / "shards" / "web_zh" / "train-00000.arrow"
    half = shard.read_bytes()[: shard.stat().st_size // 2]
    (out / "_work" / "markers" / "pack" / "web_zh" / "train-00000.json").unlink()
    shard.unlink()
    planted = {
        shard.with_name(shard.name + ".tmp-4242-0badf00d"): half,
        next((out / "rejected").glob("*/*.parquet")).with_suffix(".parquet.tmp-4243-0badf00d"): b"PAR1",
        out / "docs" / "web_en" / "zz.parquet.tmp-4244-0badf00d": b"PAR1 half",
        out / "_work" / "markers" / "pack" / "web_zh" / "train-00000.json.tmp-4242-12345678": b'{"docs_in": 1',
        out / "stats.duckdb.tmp-4245-abcdef01.wal": b"wal",
    }
    for path, data in planted.items():
        path.write_bytes(data)
    result = run(pipeline, out)
    assert result.executed_tasks == 1  # only the killed pack task was redone
    assert temp_names(out) == []
    assert fingerprint(out) == expected


def _can_mount() -> str | None:
    if os.geteuid() != 0:
        return "needs root to mount a size-limited tmpfs"
    probe = Path("/tmp") / f"datapipe-mount-probe-{os.getpid()}"
    probe.mkdir(exist_ok=True)
    try:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)], capture_output=True).returncode != 0:
            return "mount -t tmpfs is not permitted here (no CAP_SYS_ADMIN)"
        subprocess.run(["umount", str(probe)], check=True)
        return None
    except FileNotFoundError:
        return "no mount command"
    finally:
        probe.rmdir()


def test_real_full_disk_while_building_statistics(clean, tmp_path: Path) -> None:
    """A real ENOSPC from a small tmpfs, with room for everything but the statistics database."""
    reason = _can_mount()
    if reason:
        pytest.skip(reason)
    pipeline, expected = clean
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], check=True)
    try:
        reference = tmp_path / "reference"  # the same run on a roomy disk, to size the ballast
        run(pipeline, reference)
        pages = {p: -(-p.stat().st_size // 4096) * 4096 for p in reference.rglob("*") if p.is_file()}
        del pages[reference / "stats.duckdb"]
        # Room for every other output, with slack for folders and temporary copies, not for the database.
        room = sum(pages.values()) + 32 * 4096
        free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
        ballast = mnt / "ballast"
        ballast.write_bytes(b"\0" * (free - room))
        out = mnt / "out"
        res = CliRunner().invoke(main, ["run", str(pipeline), "--output", str(out), "--no-progress"])
        assert res.exit_code == 1, res.output
        errors = [line for line in res.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in res.output, res.output
        assert f"disk full (no space left on device) while writing {out}" in errors[0]
        assert "stats.duckdb" in errors[0] or "manifest.parquet" in errors[0]  # it broke building statistics
        assert "run the same command again to resume" in errors[0]
        ballast.unlink()  # free space, then the same command
        res = CliRunner().invoke(main, ["run", str(pipeline), "--output", str(out), "--no-progress"])
        assert res.exit_code == 0, res.output
        assert fingerprint(out) == expected
        assert temp_names(out) == []
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_failed_tasks_are_told_once_after_retries_without_ray_noise(clean, tmp_path: Path, capfd, monkeypatch) -> None:
    """A task that fails every attempt (a full disk in one map task) on the shared embedded Ray: Ray's
    notices of the attempts it retries ("Task ray_run_task failed. There are 3 retries remaining ...",
    with pyarrow's OSError and traceback lines) no longer reach the terminal before or after datapipe's
    one-line error; the tracebacks are in _work/failures.log, which a task error names."""
    import time

    pipeline, _ = clean
    monkeypatch.setenv("DATAPIPE_FAULT_ENOSPC_AT", "map0:web_zh/*")
    res = CliRunner().invoke(main, ["run", str(pipeline), "--output", str(tmp_path / "out"), "--no-progress"])
    assert res.exit_code == 1 and "disk full" in res.output, res.output
    time.sleep(3)  # the notice of the last retried attempt can come after the task's failure
    seen = capfd.readouterr()
    noise = seen.out + seen.err + res.output
    assert "retries remaining" not in noise and "Errno 28" not in noise and "(raylet)" not in noise, noise

    from datapipe.engine.failures import held, write_log

    assert any("retries remaining" in text for _, text in held())  # Ray did send them: held back, not lost

    log = write_log(tmp_path / "work", "map0", [("web_zh/00000", OSError(28, "No space left on device"))])
    text = log.read_text(encoding="utf-8")
    assert "map0 web_zh/00000" in text and "OSError: [Errno 28] No space left on device" in text
    assert "Ray's notices of the attempts it retried" in text and "retries remaining" in text
