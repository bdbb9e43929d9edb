"""A task of a run folder on an object store lists nothing and reads no marker there: what earlier
phases committed that it reads comes from the driver (``Task.committed``, from ``Phase.inputs``;
run_folder/remote.py ``install``), so its requests do not grow with the run, nor its node's tables. Each task runs as on a node that has seen nothing of the
run (its own mirror, no memory of the store's markers), on a loopback S3 server that counts them."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from datapipe.engine import runner
from datapipe.engine.executors.base import Outcome
from datapipe.engine.executors.in_process import InProcessExecutor
from datapipe.engine.phases import Phase, Task
from datapipe.engine.worker import run_task
from datapipe.run_folder import remote
from datapipe.run_folder.layout import LINES_PHASE, RunFolder
from datapipe.storage.atomic import write_bytes_atomic
from tests.support.counting_s3 import CountingS3, serve_for_test

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server", reason="needs moto[server] (the test extras)")

BUCKET = "tasks"


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CountingS3]:
    server = serve_for_test(monkeypatch, tmp_path / "driver", BUCKET)
    yield server
    server.stop()


def write_part(spec: Any, i: int) -> dict[str, Any]:
    """Phase 1 (the pre-pass, whose markers later tasks read): a small file and a count in its marker."""
    write_bytes_atomic(RunFolder(spec.root).work / "parts" / f"{i:04d}.bin", b"x" * (i + 1))
    return {"docs_in": 0, "newlines": i}


def read_part(spec: Any, i: int) -> dict[str, Any]:
    """Phase 2: reads the file and the marker of phase 1's task of the same number."""
    folder = RunFolder(spec.root)
    data = folder.fetched(folder.work / "parts" / f"{i:04d}.bin").read_bytes()
    marker = folder.markers.read(LINES_PHASE, f"t{i:04d}")
    return {"docs_in": 0, "read": len(data), "newlines": None if marker is None else marker["newlines"]}


class NewNodes(InProcessExecutor):
    """Every task as on a node that has seen nothing of the run: its own cache folder (so its own,
    empty mirror) and nothing of this process's memory of the store's markers and files."""

    def __init__(self, nodes: Path, uri: str) -> None:
        super().__init__()
        self.nodes, self.uri, self.started = nodes, uri, 0
        self.held: list[int] = []

    def outcomes(self, spec: Any, phase: Phase, tasks: Sequence[Task]) -> Iterator[Outcome]:
        for task in tasks:
            self.started += 1
            driver = self._forget()
            driver_cache = os.environ["DATAPIPE_CACHE_DIR"]
            os.environ["DATAPIPE_CACHE_DIR"] = str(self.nodes / f"node{self.started}")
            outcome: dict[str, Any] | Exception
            try:  # as a worker of another node runs it: handed what it reads (the driver's own process is not)
                try:
                    outcome, _ = run_task(phase.name, task.key, phase.fn, spec, *task.args, committed=[task.committed])
                except Exception as exc:  # noqa: BLE001 - reported as the executors do
                    outcome = exc
                # What this node holds of the run: the task's own inputs, never the run's other files.
                self.held.append(len(remote._named.get(self.uri, {})))
            finally:
                os.environ["DATAPIPE_CACHE_DIR"] = driver_cache
                self._forget()
                for name, state in driver.items():  # the driver's own memory, back
                    getattr(remote, name)[self.uri] = state
            yield task.key, outcome  # the driver adopts its marker in its own memory

    def _forget(self) -> dict[str, Any]:
        """Take out whatever run_folder/remote.py holds for the run folder (its state per URI)."""
        return {
            name: state.pop(self.uri) for name, state in vars(remote).items() if isinstance(state, dict) and self.uri in state
        }


def run_two_phases(s3: CountingS3, tmp: Path, n: int, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, int], list[Any]]:
    """Two phases of ``n`` tasks through the runner's loop; the store's requests and phase 2's markers."""
    uri = f"s3://{BUCKET}/run-{n}"
    folder = RunFolder(uri)
    first = Phase(LINES_PHASE, write_part, tuple(Task(f"t{i:04d}", (i,)) for i in range(n)), {}, "tasks")
    second = Phase(
        "map0",
        read_part,
        tuple(Task(f"t{i:04d}", (i,)) for i in range(n)),
        {},
        "tasks",
        inputs=lambda t: ([f"_work/parts/{t.key[1:]}.bin"], [(LINES_PHASE, t.key)]),  # what read_part reads
    )
    monkeypatch.setattr(runner, "prune_after", lambda spec: {})  # no shuffle folders to prune in these two phases
    result = runner.RunResult(folder.root, {})
    before = s3.folder_snapshot()
    nodes = NewNodes(tmp / f"nodes-{n}", uri)
    runner.run_phases(result, folder, SimpleNamespace(root=str(folder.root)), nodes, {}, False, phases=[first, second])  # type: ignore[arg-type]
    assert max(nodes.held) <= 1  # a node holds its task's inputs' entries, not a table of the run's files
    used = s3.folder_snapshot() - before
    assert result.executed_tasks == 2 * n
    counts = {
        "LIST": sum(v for (kind, _), v in used.items() if kind == "LIST"),
        "marker GET": sum(v for (kind, f), v in used.items() if kind == "GET" and "/_work/markers" in f),
        "file GET": sum(v for (kind, f), v in used.items() if kind == "GET" and f.endswith("/_work/parts")),
    }
    return counts, [folder.markers.read("map0", f"t{i:04d}") for i in range(n)]


def test_a_tasks_store_requests_do_not_grow_with_the_run(s3: CountingS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    n = 3
    small, small_markers = run_two_phases(s3, tmp_path, n, monkeypatch)
    large, large_markers = run_two_phases(s3, tmp_path, 3 * n, monkeypatch)
    # Each phase-2 task, on a node without phase 1's files, found and fetched its one file and read
    # phase 1's marker without reading it from the store.
    for i, m in enumerate(large_markers):
        assert (m["read"], m["newlines"]) == (i + 1, i), m
    assert [(m["read"], m["newlines"]) for m in small_markers] == [(i + 1, i) for i in range(n)]
    assert (small["file GET"], large["file GET"]) == (n, 3 * n)
    # No task reads a marker on the store, and the listings are the driver's one at the start of
    # the run: three times the tasks, the same requests (before, every task listed the markers and
    # read those its node had not seen: 1 + 2n listings and ~1.5 n^2 reads).
    assert small["marker GET"] == large["marker GET"] == 0, (small, large)
    assert small["LIST"] == large["LIST"] <= 1, (small, large)
