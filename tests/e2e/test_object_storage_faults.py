"""A run folder in object storage when the store misbehaves (issue 37), on a real S3 server on
loopback (moto) behind a TCP proxy that can take the endpoint down (tests/support/tcp_proxy.py):

* the endpoint down for 20 s mid-run: store operations are retried with backoff (for
  ``DATAPIPE_STORE_RETRY_SECONDS``) and the run completes; down for longer than that: one clear
  error, no traceback, and the same command completes once the store is back;
* objects lost behind the run's back (deleted between a kill and the resume, or lost mid-run as by
  an endpoint restarted without its data): the run redoes the work whose files are gone; run.json
  never says complete while a file a marker names is missing from the store.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.shared_data import PROJECT_ROOT, shared_path
from tests.support.small_real_run import output_digests, real_pipeline, run_in_process
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow

moto_server = pytest.importorskip("moto.server", reason="needs moto[server] (the test extras)")
boto3 = pytest.importorskip("boto3")

BUCKET = "datapipe-faults"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """(boto3 client, proxy): a loopback S3 server that datapipe reaches through the proxy (the environment
    set) and the test's client directly (it sees the store while datapipe's endpoint is down)."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    proxy = TcpProxy(host, port)
    env = {
        "AWS_ENDPOINT_URL": proxy.url,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "DATAPIPE_CACHE_DIR": str(tmp_path_factory.mktemp("cache")),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        client = boto3.client("s3", endpoint_url=f"http://{host}:{port}")
        client.create_bucket(Bucket=BUCKET)
        yield client, proxy
    finally:
        proxy.down()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture(scope="module")
def expected(tmp_path_factory) -> dict:
    """The outputs of the same pipeline run on local disk."""
    tmp = tmp_path_factory.mktemp("local")
    run_in_process(real_pipeline(tmp), tmp / "out")
    return output_digests(tmp / "out")


def run_cli(pipeline: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = (), **popen) -> subprocess.Popen:
    full = {
        **os.environ,
        **(env or {}),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "datapipe.cli", "run", str(pipeline), "--in-process", "--no-progress", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=full,
        **popen,
    )


def paused(proc: subprocess.Popen, pause: Path) -> None:
    deadline = time.time() + 300
    while not Path(str(pause) + ".paused").exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
        time.sleep(0.05)


def objects(client, prefix: str) -> dict[str, int]:
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
        out.update({o["Key"][len(prefix) + 1 :]: o["Size"] for o in page.get("Contents", []) if not o["Key"].endswith("/")})
    return out


def check_complete_on_store(client, prefix: str, expected: dict, to: Path) -> None:
    """run.json says complete, every file every marker names is there with its size, and the outputs
    are those of the local run."""
    listed = objects(client, prefix)
    run = json.loads(client.get_object(Bucket=BUCKET, Key=f"{prefix}/run.json")["Body"].read())
    assert run["status"] == "complete"
    markers = [k for k in listed if k.startswith("_work/markers/")]
    assert markers
    for key in markers:
        marker = json.loads(client.get_object(Bucket=BUCKET, Key=f"{prefix}/{key}")["Body"].read())
        for f in marker.get("files", []):
            assert listed.get(f["path"]) == f["bytes"], (key, f, listed.get(f["path"]))
    for rel in listed:
        target = to / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(BUCKET, f"{prefix}/{rel}", str(target))
    assert output_digests(to) == expected


# --- item 7: the endpoint down --------------------------------------------------------------


def test_endpoint_down_for_20_s_mid_run_is_waited_out(store, expected, tmp_path: Path) -> None:
    client, proxy = store
    prefix = "runs/outage"
    pipeline, pause = real_pipeline(tmp_path, output=f"s3://{BUCKET}/{prefix}"), tmp_path / "pause"
    proc = run_cli(pipeline, {"DATAPIPE_FAULT_PAUSE_AT": "map0:1", "DATAPIPE_FAULT_PAUSE_FILE": str(pause)})
    try:
        paused(proc, pause)
        proxy.down()  # refused connections, open ones cut: the next task's uploads and the lock's heartbeat fail
        pause.touch()
        time.sleep(20)
        proxy.up()
        out, _ = proc.communicate(timeout=600)
    finally:
        proxy.up()
        proc.kill()
    assert proc.returncode == 0, out
    assert "Traceback" not in out
    check_complete_on_store(client, prefix, expected, tmp_path / "from-s3")


def test_endpoint_down_longer_than_the_retries_is_one_error_and_the_rerun_completes(store, expected, tmp_path: Path) -> None:
    client, proxy = store
    prefix = "runs/outage-long"
    pipeline, pause = real_pipeline(tmp_path, output=f"s3://{BUCKET}/{prefix}"), tmp_path / "pause"
    proc = run_cli(
        pipeline,
        {"DATAPIPE_FAULT_PAUSE_AT": "map0:1", "DATAPIPE_FAULT_PAUSE_FILE": str(pause), "DATAPIPE_STORE_RETRY_SECONDS": "3"},
    )
    try:
        paused(proc, pause)
        proxy.down()
        pause.touch()
        out, _ = proc.communicate(timeout=600)  # gives up while the store is still down
    finally:
        proxy.up()
        proc.kill()
    assert proc.returncode == 1, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in out, out
    assert "the store did not answer for 3 s" in out, out
    rerun = run_cli(pipeline)
    out, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, out
    check_complete_on_store(client, prefix, expected, tmp_path / "from-s3")


# --- item 1: objects lost behind the run's back ----------------------------------------------


def lose(client, prefix: str) -> list[str]:
    """Delete, as a store restarted without its data would have lost them, most rejected documents
    files and every map work file of the run (not the markers that name them)."""
    listed = objects(client, prefix)
    rejected = sorted(k for k in listed if k.startswith("rejected/"))
    gone = rejected[: max(1, len(rejected) - 1)] + sorted(k for k in listed if k.startswith("_work/map0/"))
    assert len(gone) >= 3
    for key in gone:
        client.delete_object(Bucket=BUCKET, Key=f"{prefix}/{key}")
    return gone


def test_objects_deleted_between_a_kill_and_the_resume_are_redone(store, expected, tmp_path: Path) -> None:
    client, _ = store
    prefix = "runs/lost-at-rest"
    pipeline = real_pipeline(tmp_path, output=f"s3://{BUCKET}/{prefix}")
    killed = run_cli(pipeline, {"DATAPIPE_FAULT_KILL_AT": "pack:1"})
    killed.communicate(timeout=600)
    assert killed.returncode == -9
    gone = lose(client, prefix)  # the local mirror still holds them all: only the store can tell
    resumed = run_cli(pipeline)
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out
    check_complete_on_store(client, prefix, expected, tmp_path / "from-s3")
    assert f"{prefix}/{gone[-1]}: missing" in out and "; redoing map0 " in out, out


def test_objects_lost_mid_run_are_redone_before_the_run_says_complete(store, expected, tmp_path: Path) -> None:
    client, proxy = store
    prefix = "runs/lost-mid-run"
    pipeline, pause = real_pipeline(tmp_path, output=f"s3://{BUCKET}/{prefix}"), tmp_path / "pause"
    proc = run_cli(pipeline, {"DATAPIPE_FAULT_PAUSE_AT": "pack:1", "DATAPIPE_FAULT_PAUSE_FILE": str(pause)})
    try:
        paused(proc, pause)
        proxy.down()  # the endpoint restarts ...
        lose(client, prefix)  # ... without some of what was committed before
        proxy.up()
        pause.touch()
        out, _ = proc.communicate(timeout=600)
    finally:
        proxy.up()
        proc.kill()
    assert proc.returncode == 0, out
    check_complete_on_store(client, prefix, expected, tmp_path / "from-s3")
    assert "missing; redoing" in out, out


# --- issue 53, item 1: the inputs' store restarted empty mid-run -------------------------------


def upload_inputs(client) -> list[str]:
    """The English inputs uploaded under inputs/ (the bucket made again if it is gone); their URIs."""
    if BUCKET not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
        client.create_bucket(Bucket=BUCKET)
    uris = []
    for path in sorted(shared_path("en").glob("datajuicer_*.jsonl")):
        client.upload_file(str(path), BUCKET, f"inputs/{path.name}")
        uris.append(f"s3://{BUCKET}/inputs/{path.name}")
    return uris


def empty_the_store(client) -> None:
    """What a store restarted without its data shows: no object, no bucket."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for o in page.get("Contents", []):
            client.delete_object(Bucket=BUCKET, Key=o["Key"])
    client.delete_bucket(Bucket=BUCKET)


def outage(client, proxy, pipeline: Path, out: Path, retry_s: int, back_after_s: float | None) -> tuple[int, str]:
    """Run ``pipeline`` into ``out``; between map0's two tasks (the zh one, on local disk and the
    largest, runs first) the store is restarted empty, and the inputs are back ``back_after_s``
    seconds later (None: not until the run ended). Returns (exit code, output)."""
    pause = out.parent / f"{out.name}.pause"
    env = {
        "DATAPIPE_FAULT_PAUSE_AT": "map0:1",
        "DATAPIPE_FAULT_PAUSE_FILE": str(pause),
        "DATAPIPE_STORE_RETRY_SECONDS": str(retry_s),
    }
    proc = run_cli(pipeline, env, args=("--output", str(out)))
    try:
        paused(proc, pause)
        proxy.down()
        empty_the_store(client)
        proxy.up()
        pause.touch()  # the en task opens its inputs now
        if back_after_s is not None:
            time.sleep(back_after_s)
            upload_inputs(client)
        text, _ = proc.communicate(timeout=600)
    finally:
        proxy.up()
        proc.kill()
    return proc.returncode, text


def test_inputs_lost_with_their_store_are_waited_for_or_fail_the_run(store, tmp_path: Path) -> None:
    """The store holding the English inputs restarted empty while map0 ran (issue 53, item 1). Back
    3 s later: the task reading them waits for them (the store's retries) and the run completes with
    every document (before: each file became one unreadable_input reject, and the run said complete
    with 126 of its 1,294 documents gone). Gone past the retries: the task fails, and the run stops
    with one error naming the store and the files, not complete; the same command, once the inputs
    are back, completes. Both give the outputs of an undisturbed run, byte for byte."""
    client, proxy = store
    pipeline = real_pipeline(tmp_path, en=upload_inputs(client))
    clean = run_cli(pipeline, args=("--output", str(tmp_path / "clean")))
    out, _ = clean.communicate(timeout=600)
    assert clean.returncode == 0, out
    expected = output_digests(tmp_path / "clean")

    code, out = outage(client, proxy, pipeline, tmp_path / "waited", retry_s=60, back_after_s=3)
    assert code == 0, out
    assert output_digests(tmp_path / "waited") == expected

    code, out = outage(client, proxy, pipeline, tmp_path / "failed", retry_s=2, back_after_s=None)
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and "Traceback" not in out, out
    assert f"could not be read from s3://{BUCKET}, though they were there when the run was planned" in errors[0], out
    assert f"s3://{BUCKET}/inputs/datajuicer_" in out and "no such object" in out, out
    assert json.loads((tmp_path / "failed" / "run.json").read_text())["status"] != "complete"
    upload_inputs(client)
    rerun = run_cli(pipeline, args=("--output", str(tmp_path / "failed")))
    out, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, out
    assert output_digests(tmp_path / "failed") == expected
