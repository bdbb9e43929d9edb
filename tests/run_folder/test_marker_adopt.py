"""A marker that comes back with its task's result is never read back from the store by the driver:
not by the pull before a phase, not by the end of the run's sweep; one it did not get is still read."""

from __future__ import annotations

from pathlib import Path

import pytest

from datapipe.run_folder import remote
from datapipe.run_folder.layout import RunFolder
from datapipe.run_folder.markers import compact
from datapipe.storage import uri as storage
from tests.support.counting_s3 import CountingS3, serve_for_test

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server", reason="needs moto[server] (the test extras)")


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    server = serve_for_test(monkeypatch, tmp_path / "cache", "adopt")
    yield server
    server.stop()


def _task_commits(uri: str, folder: RunFolder, phase: str, key: str, out: str) -> tuple[dict, bytes]:
    """What a task on another node does: write its output, commit it and its marker; returns the
    marker and its bytes as committed (what a Ray task hands back: engine/executors/ray/worker.py ``ray_run_task``)."""
    path = folder.root / out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * 10)
    marker = {"docs_in": 3, "node": "elsewhere"}
    body = folder.markers.write(phase, key, marker, [path])
    with remote._lock:  # that node's memory, not the driver's
        remote._seen.pop(uri, None)
        remote._named.pop(uri, None)
    folder.markers.path(phase, key).unlink()  # nor its mirror
    return marker, body


def test_adopted_markers_are_not_read_back_and_others_are(s3: CountingS3) -> None:
    uri = "s3://adopt/run"
    folder = RunFolder(uri)
    result, body = _task_commits(uri, folder, "map0", "src/00000", "docs/src/00000.parquet")
    other, _ = _task_commits(uri, folder, "map0", "src/00001", "docs/src/00001.parquet")
    # An upload of a killed attempt: named by no marker, deleted by the sweep.
    storage.write_bytes(storage.child(uri, "docs/src/stray.parquet"), b"y")

    assert folder.markers.adopt("map0", "src/00000", body) == result  # as Ray hands it over
    on_store = storage.read_bytes(storage.child(uri, "_work/markers/map0/src/00000.json"))
    assert on_store == body
    assert folder.markers.path("map0", "src/00000").read_bytes() == on_store  # the mirror holds the committed bytes
    before = s3.folder_snapshot()
    folder.pull()
    folder.sweep()
    gets = {k: v for k, v in (s3.folder_snapshot() - before).items() if k[0] == "GET"}
    # Only the marker the driver did not get is read, once (by the pull; the sweep reads the mirror's copy).
    assert sum(gets.values()) == 1, gets
    # As held: a file's hash is read back only when checked (``compact``).
    assert folder.markers.read_all("map0") == {"src/00000": compact(result), "src/00001": compact(other)}
    assert folder.markers.path("map0", "src/00001").is_file()
    names = {f.uri for f in storage.list_files(uri)}
    assert storage.child(uri, "docs/src/stray.parquet") not in names
    assert {storage.child(uri, f"docs/src/0000{i}.parquet") for i in (0, 1)} <= names
