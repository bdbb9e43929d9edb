"""``sample.max_docs`` is a corpus-wide cap: over several map tasks exactly the k sampled documents
with the smallest seeded hash of their ids (recomputed here, independently of the stage) are asked,
the same set with one map task or five, and a run killed mid-way asks no answered document again.
Real documents: 60 English Wikipedia articles, against the test server process (~10 s).
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from datapipe.cli import main
from tests.support.openai_server import ANSWER_SCHEMA, DESCRIBE_PROMPT, FakeOpenAI, doc_hash
from tests.support.shared_data import PROJECT_ROOT, shared_path

SEED = 11
FRACTION = 0.8


def _pipeline(folder: Path, url: str, k: int, tasks: int, **overrides: Any) -> Path:
    wiki = folder / "wiki.jsonl"
    if not wiki.exists():
        with open(shared_path("corpus", "en_wikipedia.jsonl"), encoding="utf-8") as fh:
            wiki.write_text("".join(next(fh) for _ in range(60)), encoding="utf-8")
    options = {
        "model": "test-model",
        "endpoint": url,
        "prompt": DESCRIBE_PROMPT,
        "output_schema": ANSWER_SCHEMA,
        "max_chars": 1_000_000,
        "sample": {"fraction": FRACTION, "max_docs": k, "seed": SEED},
        "max_in_flight": 4,
        "backoff_s": 0.05,
        **overrides,
    }
    # ~72 KB: one map task by default, several where the split target is a fraction of it.
    size = wiki.stat().st_size
    split = {"target_bytes": max(4096, size // tasks + 1), "min_bytes": 4096, "min_tasks_per_cpu": 0}
    config = {"name": "annotate_cap", "sources": [{"name": "wiki", "kind": "web", "paths": [str(wiki)]}], "split": split,
              "stages": [{"annotate": options}]}  # fmt: skip
    path = folder / f"pipeline{tasks}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _run(pipeline: Path, out: Path) -> Any:
    return CliRunner().invoke(main, ["run", str(pipeline), "--output", str(out), "--in-process", "--no-progress"])


def _docs(out: Path) -> list[dict[str, Any]]:
    return [r for p in sorted((out / "docs").rglob("*.parquet")) for r in pq.read_table(p).to_pylist()]


def _map_tasks(out: Path) -> int:
    return len({p.parent for p in (out / "_work" / "stage01-annotate").rglob("answers.jsonl")})


def _bottom_k(ids: list[str], k: int) -> set[str]:
    """The k sampled ids with the smallest (hash, id), computed here from the documented rule."""

    def h(i: str) -> int:
        return int.from_bytes(hashlib.blake2b(i.encode(), digest_size=8, key=str(SEED).encode()).digest(), "big")

    return {i for _, i in sorted((h(i), i) for i in ids if h(i) < FRACTION * 2**64)[:k]}


def test_max_docs_asks_the_k_smallest_hashes_of_the_corpus_whatever_the_split(tmp_path: Path) -> None:
    k = 7
    chosen: dict[int, set[str]] = {}
    for tasks in (5, 1):
        with FakeOpenAI(tmp_path / f"server{tasks}") as server:
            out = tmp_path / f"out{tasks}"
            res = _run(_pipeline(tmp_path, server.url, k, tasks), out)
            assert res.exit_code == 0, res.output
        docs = _docs(out)
        assert len(docs) == 60
        if tasks > 1:
            assert _map_tasks(out) >= 3  # several tasks asked (a per-task cap would ask k each)
        asked = [r for r in server.rows() if r["status"] == "ok"]
        assert len(asked) == k  # counted by the server
        answered = {d["id"] for d in docs if d["llm_error"] is None}
        assert answered == _bottom_k([d["id"] for d in docs], k)
        assert {doc_hash(d["text"]) for d in docs if d["id"] in answered} == {r["doc"] for r in asked}
        assert all(d["llm_error"] == "not_sampled" for d in docs if d["id"] not in answered)
        assert not any("sample_hash" in c for c in docs[0])  # the step's column is not an output
        chosen[tasks] = answered
    assert chosen[5] == chosen[1]


def test_a_killed_max_docs_run_resumes_without_asking_again(tmp_path: Path) -> None:
    k, out = 30, tmp_path / "out"
    server = FakeOpenAI(tmp_path / "server", delay=0.05).start()
    try:
        pipeline = _pipeline(tmp_path, server.url, k, 4, max_in_flight=1)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, "-m", "datapipe.cli", "run", str(pipeline), "--output", str(out), "--in-process", "--no-progress"]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while sum(r["status"] == "ok" for r in server.rows()) < 8:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        server.stop()
    before = {r["doc"] for r in server.rows() if r["status"] == "ok"}
    assert 8 <= len(before) < k
    with FakeOpenAI(tmp_path / "server2") as again:
        _pipeline(tmp_path, again.url, k, 4, max_in_flight=1)
        res = _run(pipeline, out)
        assert res.exit_code == 0, res.output
    after = {r["doc"] for r in again.rows()}
    # At most the one request in flight at the kill was answered but not journaled.
    assert len(before & after) <= 1, f"{len(before & after)} answered documents asked again"
    docs = _docs(out)
    answered = {d["id"] for d in docs if d["llm_error"] is None}
    assert answered == _bottom_k([d["id"] for d in docs], k)
    assert len(before | after) == k


@pytest.fixture(autouse=True)
def _no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATAPIPE_TEST_LLM_KEY", raising=False)
