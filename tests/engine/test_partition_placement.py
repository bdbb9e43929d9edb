"""A MinHash partition answers for the map outputs of the shards its number is, modulo the
partitions (``minhash._owner``): on a remote run folder over several nodes its tasks are placed on
the node that wrote most of those map outputs, so it reads them from that node's mirror instead of
through the store (bench/scaling/store_nodes.py). Exact dedup's partitions read no map output: not placed."""

from __future__ import annotations

from pathlib import Path

from datapipe.engine.phases import Task, plan_phases
from datapipe.engine.plan import make_spec
from datapipe.engine.work_files import map_phase
from datapipe.pipeline.load import load_pipeline
from tests.conftest import write_pipeline
from tests.support.shared_data import shared_path


def _spec(tmp_path: Path, files: int):
    lines = shared_path("corpus", "en_wikipedia.jsonl").read_text(encoding="utf-8").splitlines()
    data = tmp_path / "data"
    data.mkdir()
    for i in range(files):  # one map task per file
        (data / f"part-{i}.jsonl").write_text("\n".join(lines[i * 20 : (i + 1) * 20]) + "\n", encoding="utf-8")
    stages = [{"dedup": {"exact": True, "partitions": 2}}, {"minhash": {"threshold": 0.7, "partitions": 2}}]
    pipe = load_pipeline(
        write_pipeline(
            tmp_path,
            {
                "name": "place",
                "sources": [{"name": "en", "kind": "text", "paths": ["data/*.jsonl"]}],
                "stages": stages,
                "split": {"group_small_files": False},
            },
        )
    )
    return make_spec(pipe, tmp_path / "run", tmp_path / "cache")


def test_minhash_partitions_follow_the_map_outputs_they_answer_for(tmp_path: Path) -> None:
    spec = _spec(tmp_path, 5)
    assert [s.ordinal for s in spec.shards] == [0, 1, 2, 3, 4]
    phases = {p.name: p for p in plan_phases(spec)}
    # Exact dedup (segment 0) reads no map output in its partitions; MinHash (segment 1) does.
    assert phases["shuffle0"].follows is None
    minhash = [p for name, p in phases.items() if name.startswith("shuffle1")]
    assert minhash and all(p.follows == map_phase(1) for p in minhash)
    # Shards 0, 2, 4 (partition 0's) on node a, 1 and 3 (partition 1's) on node b.
    ran_on = {s.key: "a" if s.ordinal % 2 == 0 else "b" for s in spec.shards}
    for phase in minhash:
        tasks = [Task(f"{p:05d}", (None, p, 0)) for p in (0, 1)]
        assert {t.args[1]: t.node for t in phase.placed(tasks, ran_on)} == {0: "a", 1: "b"}
