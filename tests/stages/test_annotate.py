"""The annotate stage's parts: answers judged against the schema, the run identity (model, prompt,
schema, sampling are; the server and its settings are not), validation messages, the seeded sample,
keep rules and the journal's torn last line. Whole runs against a server process: tests/e2e/test_annotate.py.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from datapipe.pipeline.load import ConfigError, build_pipeline
from datapipe.stages.annotate import Annotate, in_sample
from datapipe.stages.annotate.answers import AnswerSchema, field_type
from datapipe.stages.annotate.bottom_k import BottomK, picked
from datapipe.stages.annotate.journal import Answer, Journal, read_journal
from datapipe.stages.annotate.options import AnnotateOptions
from datapipe.stages.base import StageContext
from tests.support.openai_server import FakeOpenAI, expected_answer
from tests.support.shared_data import shared_path

SCHEMA = {
    "type": "object",
    "properties": {
        "n_chars": {"type": "integer"},
        "has_digit": {"type": "boolean"},
        "first_word": {"type": "string"},
        "digit_share": {"type": ["number", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["n_chars", "has_digit"],
}
BASE = {
    "model": "m",
    "endpoint": "http://127.0.0.1:9/v1",
    "prompt": "Describe:\n<doc>\n{{text}}\n</doc>",
    "output_schema": SCHEMA,
}


def test_schema_types_and_answers_judged() -> None:
    schema = AnswerSchema(SCHEMA, "llm")
    assert {p: str(t) for p, t in schema.fields.items()} == {
        "n_chars": "int64",
        "has_digit": "bool",
        "first_word": "string",
        "digit_share": "double",
        "tags": "string",  # an array: kept as its JSON text
    }
    assert field_type({"enum": ["a", "b"]}) == pa.string() and field_type({"type": ["integer", "string"]}) == pa.string()
    good = schema.judge('```json\n{"n_chars": 3.0, "has_digit": true, "tags": ["x"]}\n```', None, "stop")
    assert good.error is None and good.values == {
        "n_chars": 3,
        "has_digit": True,
        "first_word": None,
        "digit_share": None,
        "tags": '["x"]',
    }
    assert schema.judge("Sure! It has 3 characters.", None, "stop").error == "not_json"
    assert schema.judge('{"n_chars": 3, "has_d', None, "length").error == "truncated"
    bad = schema.judge('{"n_chars": "3", "has_digit": true}', None, "stop")
    assert (bad.error, bad.values) == ("schema_violation", {}) and "n_chars" in (bad.detail or "")
    assert schema.judge(None, "I cannot help with that.", "stop").error == "refusal"
    assert schema.judge("", None, "stop").error == "empty"


def _pipeline(tmp_path: Path, **options: Any):
    raw = {
        "name": "a",
        "sources": [
            {"name": "dj", "kind": "web", "paths": [str(shared_path("en", "datajuicer_demo-dataset-deduplication.jsonl"))]}
        ],
        "stages": [{"annotate": {**BASE, **options}}],
    }
    return build_pipeline(raw, tmp_path)


def test_the_server_and_its_settings_are_not_the_run_identity_what_is_asked_is(tmp_path: Path) -> None:
    base = _pipeline(tmp_path).fingerprint()
    same = {
        "endpoint": "https://api.example.com/v1",
        "max_in_flight": 64,
        "timeout_s": 5,
        "max_retries": 1,
        "prices": {"prompt": 1, "completion": 2},
    }
    for key, value in same.items():
        assert _pipeline(tmp_path, **{key: value}).fingerprint() == base, key
    changed = {
        "model": "other",
        "prompt": "Annotate:\n{{text}}",
        "system": "You label documents.",
        "output_schema": {**SCHEMA, "required": ["n_chars"]},
        "temperature": 0.7,
        "max_tokens": 64,
        "sample": {"fraction": 0.5},
        "max_chars": 1000,
    }
    for key, value in changed.items():
        assert _pipeline(tmp_path, **{key: value}).fingerprint() != base, key
    normalized = _pipeline(tmp_path, endpoint="https://api.example.com/v1").normalized()
    assert normalized["stages"][0]["annotate"]["endpoint"] == "https://api.example.com/v1"  # recorded all the same


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"output_schema": {"type": "array"}}, "output_schema: must be"),
        ({"output_schema": {"type": "object", "properties": {"x": {"type": "nope"}}}}, "not a valid JSON Schema"),
        ({"prompt": "Describe {{title}}"}, "{{title}} is no column"),
        ({"prompt": "Describe this"}, "names no document column"),
        ({"output_schema": {"type": "object", "properties": {"model": {"type": "string"}}}}, "which the stage writes its model"),
        ({"keep": [{"field": "color", "values": ["red"]}]}, "keep[0].field: 'color' is no property"),
        ({"keep": [{"field": "first_word", "min": 1}]}, "min and max need a number"),
        ({"keep": [{"field": "n_chars", "values": ["many"]}]}, "'n_chars' is an integer column"),
        ({"api_key_env": "DATAPIPE_SURELY_UNSET_KEY"}, "DATAPIPE_SURELY_UNSET_KEY is not set"),
        ({"prompt_file": "missing.txt", "prompt": None}, "prompt_file: file not found"),
        ({"endpoint": "127.0.0.1:8000"}, "endpoint must be an http"),
    ],
)
def test_validation_names_the_key(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _pipeline(tmp_path, **options)
    assert any(p.startswith("stages[0].annotate") and message in p for p in err.value.problems), err.value.problems


def test_prompt_and_schema_files_are_resources_of_the_run(tmp_path: Path) -> None:
    (tmp_path / "prompt.txt").write_text("Describe:\n{{text}}\n", encoding="utf-8")
    (tmp_path / "schema.yaml").write_text(json.dumps(SCHEMA), encoding="utf-8")
    options = {"prompt": None, "prompt_file": "prompt.txt", "output_schema": None, "output_schema_file": "schema.yaml"}
    before = _pipeline(tmp_path, **options)
    assert [r["role"] for r in before.resources()] == ["prompt", "schema"]
    fingerprint = before.fingerprint()
    (tmp_path / "prompt.txt").write_text("Summarise:\n{{text}}\n", encoding="utf-8")
    assert _pipeline(tmp_path, **options).fingerprint() != fingerprint


def test_the_sample_is_seeded_by_id() -> None:
    ids = [f"src/file.jsonl#L{i}" for i in range(4000)]
    picked = [i for i in ids if in_sample(i, 0.25, seed=7)]
    assert 900 < len(picked) < 1100
    assert picked == [i for i in ids if in_sample(i, 0.25, seed=7)]
    assert picked != [i for i in ids if in_sample(i, 0.25, seed=8)]


def _docs() -> pa.Table:
    rows = [
        json.loads(line) for line in shared_path("en", "datajuicer_demo-dataset-deduplication.jsonl").read_text().splitlines()
    ]
    return pa.table(
        {
            "id": [f"dj/demo.jsonl#L{i}" for i in range(len(rows))],
            "source": ["dj"] * len(rows),
            "kind": ["web"] * len(rows),
            "text": [r["text"] for r in rows],
        }
    )


def test_a_stage_samples_keeps_by_rule_and_reads_its_journal_back(tmp_path: Path) -> None:
    docs = _docs()
    with FakeOpenAI(tmp_path / "server") as server:
        options = AnnotateOptions.model_validate(
            {
                **BASE,
                "endpoint": server.url,
                "max_chars": 100_000,
                "sample": {"fraction": 0.4, "seed": 5},
                "keep": [{"field": "n_chars", "min": 100}],
            }
        )
        stage = Annotate(options, StageContext(str(tmp_path), str(tmp_path)))
        stage.setup()
        stage.start_task(tmp_path / "task")
        out = stage.compute(docs)
        decision = stage.decide(out)
        stage.end_task(completed=True)
        first = len(server.rows())
        # The same task again (a resumed attempt): every answer comes from the journal.
        stage.start_task(tmp_path / "task")
        again = stage.compute(docs)
        stage.end_task(completed=True)
        assert len(server.rows()) == first
    errors = out["llm_error"].to_pylist()
    sampled = [_hash(i, 5) < 0.4 * 2**64 for i in docs["id"].to_pylist()]  # recomputed here, not by the stage
    assert 0 < sum(sampled) < docs.num_rows
    assert errors == [None if s else "not_sampled" for s in sampled]
    texts = [t for t, s in zip(docs["text"].to_pylist(), sampled) if s]
    assert first == len(set(texts))  # identical texts: one request
    for text, n, reason, s in zip(docs["text"].to_pylist(), out["llm_n_chars"].to_pylist(), decision.reason.to_pylist(), sampled):
        if s:
            assert n == expected_answer(text)["n_chars"]
            assert reason == (None if n >= 100 else "annotate:n_chars")
    assert again.drop_columns(["llm_endpoint"]).equals(out.drop_columns(["llm_endpoint"]))
    assert sum(p for p in out["llm_prompt_tokens"].to_pylist() if p) == sum(r["prompt_tokens"] for r in server.rows())


def _hash(doc_id: str, seed: int) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode(), digest_size=8, key=str(seed).encode()).digest(), "big")


def test_bottom_k_keeps_the_k_smallest_pairs_ties_by_id_in_any_batching() -> None:
    rng = random.Random(7)
    ids = [f"doc{i:04d}" for i in range(2000)]
    hashes: list[int | None] = [rng.choice([None, rng.randrange(50), rng.randrange(2**64)]) for _ in ids]  # many ties
    pairs = sorted((h, i) for h, i in zip(hashes, ids) if h is not None)
    for k in (1, 37, len(pairs), len(pairs) + 5):
        for size in (1, 64, 2000):
            order = list(range(len(ids)))
            rng.shuffle(order)
            best = BottomK(k)
            entered = set()  # what a map task writes: the pairs that entered its k smallest when seen
            for at in range(0, len(order), size):
                part = order[at : at + size]
                mask = best.add(pa.array([hashes[j] for j in part], pa.uint64()), pa.array([ids[j] for j in part]))
                entered |= {(hashes[j], ids[j]) for j, m in zip(part, mask) if m}
            assert best.pairs() == pairs[:k]
            assert set(pairs[:k]) <= entered
            if k == 37:
                assert len(entered) < len(pairs) / 2  # most are never written
            threshold = best.threshold()
            chosen = picked(hashes, ids, threshold if threshold.num_rows else None)
            assert sorted((h, i) for h, i, c in zip(hashes, ids, chosen) if c) == pairs[:k]
            assert threshold.num_rows == (1 if k <= len(pairs) else 0)


def test_a_torn_last_line_is_skipped_and_the_next_answer_starts_a_line(tmp_path: Path) -> None:
    def answer(key: str) -> Answer:
        return Answer(key, "doc", '{"a": 1}', None, "stop", 3, 4, "m")

    journal = Journal(tmp_path)
    journal.record(answer("k1"))
    journal.close()
    path = tmp_path / "answers.jsonl"
    with open(path, "a") as fh:
        fh.write('{"request": "k2", "id": "doc", "cont')  # what a SIGKILL mid-write leaves
    assert set(read_journal(path)) == {"k1"}
    journal = Journal(tmp_path)
    journal.record(answer("k3"))
    journal.close()
    assert set(read_journal(path)) == {"k1", "k3"}
