"""The annotate stage against a real OpenAI-compatible server process on 127.0.0.1
(tests/support/openai_server.py): 429s, 500s, timeouts, bodies that are not JSON, answers that are
not JSON, break the schema or refuse, and a server restart mid-run; then a run SIGKILLed mid-way and
resumed, counting on the server's own log that no answered document is asked twice; token totals of
``datapipe stats`` against the server's count. Real documents: 60 English Wikipedia articles and the
data-juicer dedup demo (which holds an exact duplicate: one request answers both), in process, ~10 s.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from datapipe.cli import main
from datapipe.stages.annotate.journal import read_journal
from tests.support.openai_server import ANSWER_SCHEMA as SCHEMA
from tests.support.openai_server import DESCRIBE_PROMPT as PROMPT
from tests.support.openai_server import FakeOpenAI, doc_hash, expected_answer, fault_of
from tests.support.shared_data import PROJECT_ROOT, shared_path

KEY_ENV = "DATAPIPE_TEST_LLM_KEY"
KEY = "sk-test-0123456789abcdef"  # must never appear in the run folder


def write_pipeline(folder: Path, url: str, **overrides: Any) -> Path:
    wiki = folder / "wiki.jsonl"
    if not wiki.exists():  # a small slice of the real corpus, in the test's own folder
        with open(shared_path("corpus", "en_wikipedia.jsonl"), encoding="utf-8") as fh:
            wiki.write_text("".join(next(fh) for _ in range(60)), encoding="utf-8")
    options: dict[str, Any] = {
        "model": "test-model",
        "endpoint": url,
        "prompt": PROMPT,
        "output_schema": SCHEMA,
        "max_chars": 1_000_000,  # whole texts: the server's hashes are of the whole text
        "api_key_env": KEY_ENV,
        "timeout_s": 1.0,
        "backoff_s": 0.05,
        "max_backoff_s": 0.4,
        "max_retries": 8,
        "max_in_flight": 6,
        "prices": {"prompt": 0.5, "completion": 1.5},
        **overrides,
    }
    config = {
        "name": "annotate_real",
        "sources": [
            {"name": "wiki", "kind": "web", "paths": [str(wiki)]},
            {"name": "dj", "kind": "web", "paths": [str(shared_path("en", "datajuicer_demo-dataset-deduplication.jsonl"))]},
        ],
        "stages": [{"annotate": options}],
    }
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def run_cli(pipeline: Path, out: Path) -> Any:
    return CliRunner().invoke(main, ["run", str(pipeline), "--output", str(out), "--in-process", "--no-progress"])


def documents(out: Path) -> list[dict[str, Any]]:
    return [r for p in sorted((out / "docs").rglob("*.parquet")) for r in pq.read_table(p).to_pylist()]


def journal_ids(out: Path) -> set[str]:
    """The documents whose answers the run's journals hold."""
    return {a.id for path in out.glob("_work/stage01-annotate/*/*/answers.jsonl") for a in read_journal(path).values()}


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


def test_every_document_answered_or_explained_through_faults_and_a_restart(tmp_path: Path, api_key: str) -> None:
    # A plain answer comes back in milliseconds; 1.5 s leaves room for a loaded machine (an answer
    # after the client gave up would be asked again, and counted twice by the server).
    with FakeOpenAI(tmp_path / "server", faults=True, timeout_sleep=2.0, restart_after=25, api_key=api_key) as server:
        pipeline = write_pipeline(tmp_path, server.url, timeout_s=1.5)
        res = run_cli(pipeline, tmp_path / "out")
        assert res.exit_code == 0, res.output
        assert server.restarts == 1
    log = server.rows()
    statuses = Counter(r["status"] for r in log)
    for fault in ("429", "500", "timeout", "malformed", "restart"):
        assert statuses[fault] > 0, statuses  # every transport fault happened and was lived through
    docs = documents(tmp_path / "out")
    assert len(docs) == 74
    answered_by = Counter(r["doc"] for r in log if r["status"] == "ok")
    assert max(answered_by.values()) == 1  # no document was answered twice
    assert len(answered_by) == len({d["text"] for d in docs}) == 73  # the duplicate pair: one request
    expected_errors = {"not_json": 0, "schema_violation": 0, "refusal": 0}
    for d in docs:
        h = doc_hash(d["text"])
        fault = fault_of(h, attempt=99)  # the faults of every attempt: what the answer itself is
        if fault in expected_errors:
            expected_errors[fault] += 1
            assert d["llm_error"] == fault, d["id"]
            assert d["llm_n_chars"] is None and d["llm_tags"] is None and d["llm_error_detail"]
            continue
        assert d["llm_error"] is None, (d["id"], d["llm_error"], d["llm_error_detail"])
        want = expected_answer(d["text"])
        got = {k: d[f"llm_{k}"] for k in want}
        assert got == {**want, "tags": json.dumps(want["tags"], sort_keys=True)}, d["id"]
        assert d["llm_model"] == "test-model" and d["llm_endpoint"] == f"127.0.0.1:{server.port}"
    assert all(expected_errors.values()), expected_errors  # each kind of bad answer was met
    # Token totals: per document as the server reported, each request once; stats and the report say the same.
    server_prompt = sum(r["prompt_tokens"] for r in log)
    server_completion = sum(r["completion_tokens"] for r in log)
    assert sum(d["llm_prompt_tokens"] for d in docs) == server_prompt > 0
    assert sum(d["llm_completion_tokens"] for d in docs) == server_completion > 0
    stats = CliRunner().invoke(main, ["stats", str(tmp_path / "out")])
    assert stats.exit_code == 0, stats.output
    line = next(ln for ln in stats.output.splitlines() if "annotate (llm_)" in ln)
    assert f"{server_prompt:,}" in line and f"{server_completion:,}" in line
    cost = server_prompt / 1e6 * 0.5 + server_completion / 1e6 * 1.5
    assert f"{cost:,.4f} USD" in line
    # The key: sent to the server (it answers 401 otherwise), written nowhere in the run folder.
    for path in (tmp_path / "out").rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_a_killed_run_resumes_without_asking_again_for_an_answered_document(tmp_path: Path, api_key: str) -> None:
    out = tmp_path / "out"
    server = FakeOpenAI(tmp_path / "server", delay=0.05, api_key=api_key).start()
    try:
        pipeline = write_pipeline(tmp_path, server.url, max_in_flight=2)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
        proc = subprocess.Popen(
            [sys.executable, "-m", "datapipe.cli", "run", str(pipeline), "--output", str(out), "--in-process", "--no-progress"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 120
        while sum(r["status"] == "ok" for r in server.rows()) < 20:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert proc.returncode == -signal.SIGKILL
    finally:
        server.stop()  # nothing in flight reaches the log after this
    before = server.rows()
    ids = journal_ids(out)
    # Killed mid-way, with answers recorded (the last few the server sent may not have been).
    assert 20 - 2 <= len(ids) < 73, len(ids)
    journaled = {doc_hash(t) for t in _texts_of(out, ids)}
    # Resumed against another server (another port): the endpoint is not part of the run's identity.
    with FakeOpenAI(tmp_path / "server", api_key=api_key) as again:
        write_pipeline(tmp_path, again.url, max_in_flight=4)
        res = run_cli(pipeline, out)
        assert res.exit_code == 0, res.output
    after = server.rows()[len(before) :]
    asked_again = {r["doc"] for r in after} & journaled
    assert not asked_again, f"{len(asked_again)} answered documents asked again"
    assert after  # the rest was asked
    docs = documents(out)
    assert len(docs) == 74 and all(d["llm_error"] is None for d in docs)
    assert all(d["llm_n_chars"] == len(d["text"]) for d in docs)
    # Tokens: each document's as the server reported for the answer that was kept.
    last = {r["doc"]: r for r in server.rows() if r["status"] == "ok"}
    assert sum(d["llm_prompt_tokens"] for d in docs) == sum(r["prompt_tokens"] for r in last.values())
    assert {d["llm_endpoint"] for d in docs} == {f"127.0.0.1:{server.port}", f"127.0.0.1:{again.port}"}


def _texts_of(out: Path, ids: set[str]) -> list[str]:
    texts = {}
    for source, path in (
        ("wiki", out.parent / "wiki.jsonl"),
        ("dj", shared_path("en", "datajuicer_demo-dataset-deduplication.jsonl")),
    ):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            texts[f"{source}/{path.name}#L{i}"] = json.loads(line)["text"]
    missing = ids - texts.keys()
    assert not missing, sorted(missing)[:3]
    return [texts[i] for i in ids]


def test_a_changed_prompt_is_another_run_and_a_wrong_key_fails_the_task(
    tmp_path: Path, api_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeOpenAI(tmp_path / "server", api_key=api_key) as server:
        pipeline = write_pipeline(tmp_path, server.url)
        assert run_cli(pipeline, tmp_path / "out").exit_code == 0
        n = len(server.rows())
        write_pipeline(tmp_path, server.url, prompt=PROMPT.replace("Describe", "Summarise"))
        res = run_cli(pipeline, tmp_path / "out")
        assert res.exit_code != 0 and "stages[0].annotate.prompt" in res.output, res.output
        assert len(server.rows()) == n  # refused before asking anything
        monkeypatch.setenv(KEY_ENV, "wrong")
        res = run_cli(pipeline, tmp_path / "other")
        assert res.exit_code == 1, res.output
        assert "HTTP 401" in res.output and "api_key_env" in res.output
        assert len(server.rows()) - n <= 2 * 6  # two tasks: at most what each had in flight at its first 401


def minimal_pipeline(folder: Path, url: str, name: str, min_score: float, **langid: Any) -> Path:
    """The issue's minimal pipeline, langid -> length -> annotate, on the same real documents."""
    config = yaml.safe_load(write_pipeline(folder, url, max_in_flight=4).read_text(encoding="utf-8"))
    annotate = config["stages"][0]
    config["stages"] = [{"langid": {"keep": ["en"], "min_score": min_score, **langid}}, {"length": {"min_chars": 50}}, annotate]
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _run(pipeline: Path, out: Path, *extra: str) -> Any:
    args = ["run", str(pipeline), "--output", str(out), "--in-process", "--no-progress", *extra]
    return CliRunner().invoke(main, args)


def test_no_request_is_sent_twice_by_a_redecide_or_a_repeated_run(tmp_path: Path, api_key: str) -> None:
    """Issue 50 item 3, counted on the server: a re-decide (`run --from`) with only langid.min_score
    changed asks only the documents the earlier run never asked; a changed langid signal option
    (max_chars: langid and everything after it computed) and a `--fresh` run into the same folder
    find every answer by its request hash and send nothing; the message says what is reused."""
    with FakeOpenAI(tmp_path / "server", api_key=api_key) as server:

        def asked() -> Counter[str]:
            return Counter(r["doc"] for r in server.rows() if r["status"] == "ok")

        old = tmp_path / "old"
        res = _run(minimal_pipeline(tmp_path, server.url, "strict", min_score=0.9), old)
        assert res.exit_code == 0, res.output
        first = asked()
        assert first and max(first.values()) == 1

        looser = minimal_pipeline(tmp_path, server.url, "looser", min_score=0.3)
        new = tmp_path / "new"
        res = _run(looser, new, "--from", str(old))
        assert res.exit_code == 0, res.output
        assert "3 annotate" in res.stderr.split("signals reused for", 1)[1].split(";")[0], res.stderr
        assert "may rewrite the text" not in res.stderr
        assert "3 annotate: the earlier run's answers carried over" in res.stderr
        second = asked()
        assert max(second.values()) == 1, [d for d, n in second.items() if n > 1]  # nothing asked twice
        # and after the run, per stage: documents whose signals were read, and those computed
        read, computed = map(int, re.search(r"3 annotate (\d+) read, (\d+) computed", res.stderr).groups())  # type: ignore[union-attr]
        assert read == sum(first.values()) + 1 and computed >= len(set(second) - set(first))  # + the duplicate
        newly = set(second) - set(first)
        texts = [d["text"] for d in documents(new)]
        assert all(d["llm_error"] is None for d in documents(new))
        assert newly and newly == {doc_hash(t) for t in texts} - set(first)  # only the newly let through

        # A signal option of an earlier stage: every stage after it computed, no request sent again.
        again = tmp_path / "again"
        res = _run(minimal_pipeline(tmp_path, server.url, "shorter", min_score=0.3, max_chars=5_000), again, "--from", str(new))
        assert res.exit_code == 0, res.output
        assert "3 annotate computed (its input may differ" in res.stderr, res.stderr
        assert asked() == second

        # A fresh run into a folder that has the answers, and the same command again: nothing sent.
        res = _run(looser, new, "--fresh")
        assert res.exit_code == 0, res.output
        res = _run(looser, new)
        assert res.exit_code == 0, res.output
        assert asked() == second
        assert [d["llm_n_chars"] for d in documents(new)] == [len(t) for t in texts]  # every answer found
