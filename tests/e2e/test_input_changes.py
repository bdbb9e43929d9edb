"""A run never completes on inputs that changed under it (engine/input_identity.py).

Real data (the shared corpus's zh and en JSONL, split into ranges): a run killed after its first
map task, its inputs then appended to, truncated, rewritten with the same size and modification
time, or deleted, is refused on resume with an error naming the file, and ``--fresh`` then gives
the outputs of a clean run on the new inputs. The same changes made while a run is paused after its
first map task (the fault hook) stop it before run.json says complete. Bytes put back as the tasks
read them (a restored copy) let the run go on. Objects on a loopback S3 server overwritten between
a kill and the resume, or during a run, are caught the same way.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.support.shared_data import shared_path
from tests.support.small_real_run import run_in_process

try:  # the loopback S3 server fixture (moto, of the test extras); without it only the S3 tests skip
    from tests.e2e.test_object_storage import BUCKET, s3  # noqa: F401
except pytest.skip.Exception:
    BUCKET = ""

pytestmark = pytest.mark.slow
needs_s3 = pytest.mark.skipif(not BUCKET, reason="needs moto[server] (the test extras)")

SPLIT = {"target_bytes": 700_000, "min_tasks_per_cpu": 0}  # each file in ranges: a lines pre-pass, several map tasks


def datapipe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "datapipe.cli", "run", *args, "--in-process", "--no-progress"],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


def make_project(folder: Path, data: str | None = None) -> Path:
    """zh and en inputs (two zh files, so one can be deleted) and a pipeline reading them."""
    if data is None:
        d = folder / "data"
        d.mkdir(parents=True)
        shutil.copy(shared_path("corpus", "zh_wikipedia.jsonl"), d / "zh-0.jsonl")
        en = shared_path("corpus", "en_wikipedia.jsonl").read_bytes()
        (d / "en-0.jsonl").write_bytes(en[: en.index(b"\n", 2_000_000) + 1])
        oi = shared_path("corpus", "zh_oiwiki.jsonl").read_bytes()
        (d / "zh-1.jsonl").write_bytes(oi[: oi.index(b"\n", 1_000_000) + 1])
        data = str(d)
    config = {
        "name": "changes",
        "sources": [{"name": "zh", "paths": [f"{data}/zh-*.jsonl"]}, {"name": "en", "paths": [f"{data}/en-*.jsonl"]}],
        "stages": [{"length": {"min_chars": 200}}],
        "split": SPLIT,
    }
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def outputs(root: Path) -> dict[str, object]:
    """What a user gets: kept documents, rejects and the counts."""
    docs = sorted((r["id"], r["text"]) for r in pq.read_table(root / "docs", columns=["id", "text"]).to_pylist())
    rejected = sorted(
        (r["id"], r["reason"])
        for p in (root / "rejected").glob("**/*.parquet")
        for r in pq.read_table(p, columns=["id", "reason"]).to_pylist()
    )
    counts = json.loads((root / "run.json").read_text())["counts"]
    return {"docs": docs, "rejected": rejected, "kept": counts["kept"], "documents": counts["documents"]}


def clean_run(pipeline: Path, out: Path) -> Path:
    """The reference outputs: a clean run in this process (what ``datapipe run --in-process`` runs; the
    runs under test are the CLI's, in their own processes, which the tests kill or pause)."""
    result = run_in_process(pipeline, out)
    assert result.run["status"] == "complete"
    return out


def status(root: Path) -> str:
    return json.loads((root / "run.json").read_text())["status"]


def reverse_second_half(path: Path) -> None:
    """Rewrite the file's second half (its lines in reverse order): same size, same modification time."""
    st = path.stat()
    data = path.read_bytes()
    cut = data.index(b"\n", len(data) // 2) + 1
    lines = data[cut:].rstrip(b"\n").split(b"\n")
    new = data[:cut] + b"\n".join(lines[::-1]) + b"\n"
    assert len(new) == len(data) and new != data
    with path.open("r+b") as f:  # in place, as a tool rewriting a file would
        f.write(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def append(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data + data[: data.index(b"\n", 10_000) + 1])


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: data.index(b"\n", len(data) * 2 // 3) + 1])


def delete(path: Path) -> None:
    path.unlink()


CHANGES = {"appended": append, "truncated": truncate, "rewritten_same_size_and_mtime": reverse_second_half, "deleted": delete}


@pytest.mark.parametrize("change", list(CHANGES))
def test_changed_between_kill_and_resume_is_refused_and_fresh_equals_a_clean_run(tmp_path: Path, change: str) -> None:
    pipeline = make_project(tmp_path)
    out = tmp_path / "out"
    killed = datapipe(str(pipeline), "--output", str(out), env={"DATAPIPE_FAULT_KILL_AT": "map0:1"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    markers = list((out / "_work" / "markers" / "map0").glob("**/*.json"))
    assert len(markers) == 1 and (out / "_work" / "markers" / "lines").is_dir()
    victim = tmp_path / "data" / ("zh-1.jsonl" if change == "deleted" else "zh-0.jsonl")
    CHANGES[change](victim)
    if change == "rewritten_same_size_and_mtime":
        reverse_second_half(tmp_path / "data" / "en-0.jsonl")

    resumed = datapipe(str(pipeline), "--output", str(out))
    assert resumed.returncode == 1, resumed.stderr
    assert str(victim) in resumed.stderr and "--fresh" in resumed.stderr, resumed.stderr
    assert status(out) != "complete"

    fresh = datapipe(str(pipeline), "--output", str(out), "--fresh")
    assert fresh.returncode == 0, fresh.stderr
    assert status(out) == "complete" and outputs(out) == outputs(clean_run(pipeline, tmp_path / "clean"))
    if change == "rewritten_same_size_and_mtime":  # the run as it was would have mixed versions: not this
        assert outputs(out)["docs"] != outputs(_baseline(tmp_path))["docs"]


def _baseline(tmp_path: Path) -> Path:
    """A clean run on the inputs as they were first written."""
    other = tmp_path / "original"
    return clean_run(make_project(other), other / "out")


def test_bytes_put_back_as_the_tasks_read_them_let_the_run_go_on(tmp_path: Path) -> None:
    """A copy restored with its modification time (new inode and ctime, same bytes): read again, and the run resumes."""
    pipeline = make_project(tmp_path)
    out = tmp_path / "out"
    killed = datapipe(str(pipeline), "--output", str(out), env={"DATAPIPE_FAULT_KILL_AT": "map0:1"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    victim = tmp_path / "data" / "zh-0.jsonl"
    saved = tmp_path / "saved.jsonl"
    shutil.copy2(victim, saved)
    reverse_second_half(victim)
    refused = datapipe(str(pipeline), "--output", str(out))
    assert refused.returncode == 1 and str(victim) in refused.stderr and "rewritten" in refused.stderr
    os.replace(saved, victim)  # cp -p of the copy: another inode, a new ctime, the old bytes and mtime
    resumed = datapipe(str(pipeline), "--output", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert "holds the bytes the run's tasks read" in resumed.stderr
    assert status(out) == "complete" and outputs(out) == outputs(clean_run(pipeline, tmp_path / "clean"))


def start_paused(pipeline: Path, out: Path, pause: Path) -> subprocess.Popen:
    """A run that stops after its first map task until ``pause`` exists (DATAPIPE_FAULT_PAUSE_AT)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "datapipe.cli", "run", str(pipeline), "--output", str(out), "--in-process", "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "DATAPIPE_FAULT_PAUSE_AT": "map0:1", "DATAPIPE_FAULT_PAUSE_FILE": str(pause)},
    )
    deadline = time.time() + 300
    while not Path(f"{pause}.paused").exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1]
        time.sleep(0.05)
    return proc


@pytest.mark.parametrize("change", list(CHANGES))
def test_changed_during_the_run_is_never_complete(tmp_path: Path, change: str) -> None:
    pipeline = make_project(tmp_path)
    out = tmp_path / "out"
    proc = start_paused(pipeline, out, tmp_path / "pause")
    victim = tmp_path / "data" / ("zh-1.jsonl" if change == "deleted" else "zh-0.jsonl")
    try:
        CHANGES[change](victim)
    finally:
        (tmp_path / "pause").touch()
        _, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err
    assert str(victim) in err, err
    assert status(out) != "complete"
    if change != "deleted":  # deleted: the tasks still to read it fail (the error names it); else the end check
        assert "changed while the run ran" in err and "not marked complete" in err, err


# --- object storage: the loopback S3 server of tests/test_object_storage.py ------------------------


def _s3_project(s3, tmp_path: Path, prefix: str) -> Path:
    local = tmp_path / "upload"
    make_project(local)
    for f in sorted((local / "data").iterdir()):
        s3.upload_file(str(f), BUCKET, f"{prefix}/{f.name}")
    return make_project(tmp_path, f"s3://{BUCKET}/{prefix}")


def _overwrite(s3, key: str) -> None:
    """The object's second half rewritten: same size, a new ETag."""
    body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    cut = body.index(b"\n", len(body) // 2) + 1
    new = body[:cut] + b"\n".join(body[cut:].rstrip(b"\n").split(b"\n")[::-1]) + b"\n"
    assert len(new) == len(body) and new != body
    s3.put_object(Bucket=BUCKET, Key=key, Body=new)


@needs_s3
def test_objects_overwritten_between_kill_and_resume_are_refused(s3, tmp_path: Path) -> None:
    pipeline = _s3_project(s3, tmp_path, "changes-kill")
    out = tmp_path / "out"
    killed = datapipe(str(pipeline), "--output", str(out), env={"DATAPIPE_FAULT_KILL_AT": "map0:1"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    reads = [r for m in (out / "_work" / "markers").glob("**/*.json") for r in json.loads(m.read_text()).get("reads", [])]
    assert reads and all(r["path"].startswith("s3://") and "etag=" in r["change"] and r["sha256"] for r in reads)
    _overwrite(s3, "changes-kill/zh-0.jsonl")
    resumed = datapipe(str(pipeline), "--output", str(out))
    assert resumed.returncode == 1, resumed.stderr
    assert f"s3://{BUCKET}/changes-kill/zh-0.jsonl" in resumed.stderr and "--fresh" in resumed.stderr
    assert status(out) != "complete"
    fresh = datapipe(str(pipeline), "--output", str(out), "--fresh")
    assert fresh.returncode == 0, fresh.stderr
    assert status(out) == "complete"


@needs_s3
def test_object_overwritten_during_the_run_is_caught_by_its_etag(s3, tmp_path: Path) -> None:
    """Same size, and the listing at the run's start knows no ETag: the tasks' recorded ETags and hashes tell."""
    pipeline = _s3_project(s3, tmp_path, "changes-during")
    out = tmp_path / "out"
    proc = start_paused(pipeline, out, tmp_path / "pause")
    try:
        _overwrite(s3, "changes-during/zh-0.jsonl")
    finally:
        (tmp_path / "pause").touch()
        _, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err
    assert f"s3://{BUCKET}/changes-during/zh-0.jsonl" in err and "changed while the run ran" in err, err
    assert status(out) != "complete"
