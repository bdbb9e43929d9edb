"""Progress names a phase by its stage and step (issue 50 item 2): ``semantic: training vectors and
clustering the sample``, ``minhash: verifying pairs (round 3 of 56)``, never the marker folder's
``shuffle4: 3/4 partitions`` alone. The plan of a real pipeline over the shared corpus."""

from __future__ import annotations

from pathlib import Path

from datapipe.engine.phases import plan_phases
from datapipe.engine.plan import make_spec
from datapipe.pipeline.load import load_pipeline
from datapipe.stages.minhash import MinHashDedup
from tests.conftest import write_pipeline
from tests.support.shared_data import PROJECT_ROOT, shared_path


def test_every_phase_says_its_stage_and_step(tmp_path: Path) -> None:
    config = {
        "name": "labels",
        "sources": [{"name": "wiki", "kind": "web", "paths": [str(shared_path("corpus", "zh_wikipedia.jsonl"))]}],
        "stages": [
            {"langid": {"keep": ["zh", "en"]}},
            {"dedup": {"exact": True}},
            {"minhash": {"threshold": 0.8}},
            {"semantic": {"threshold": 0.95, "clusters": 4, "sample": 200}},
            {"boilerplate": {}},
        ],
        "tokenize": {"tokenizer": str(PROJECT_ROOT / "tokenizer" / "demo.json")},
    }
    spec = make_spec(load_pipeline(write_pipeline(tmp_path, config)), tmp_path / "out", tmp_path / "cache")
    labels = {p.name: p.label for p in plan_phases(spec)}
    assert all(labels.values()), [name for name, label in labels.items() if not label]
    assert labels["map0"] == "map: langid, dedup"
    assert labels["shuffle0"] == "dedup: exact copies by text"
    assert labels["map1"] == "map: dedup, minhash"
    n = MinHashDedup.rounds()
    assert labels["shuffle1"] == f"minhash: finding candidate pairs (round 1 of {n})"
    assert labels["shuffle1r2"] == f"minhash: verifying pairs (round 3 of {n})"
    assert labels["shuffle1r3"] == f"minhash: joining clusters (round 4 of {n})"
    assert labels[f"shuffle1r{n - 1}"] == f"minhash: deciding clusters (round {n} of {n})"
    assert labels["reduce1"] == "minhash: deciding the clusters left open"
    assert labels["shuffle2"] == "semantic: training vectors and clustering the sample (round 1 of 3)"
    assert labels["shuffle2r2"] == "semantic: comparing within clusters (round 3 of 3)"
    assert labels["shuffle3"] == "boilerplate: counting repeated lines"
    assert labels["map4"] == "map: boilerplate, tokenize" and labels["pack"] == "packing shards"
