"""`explain` lists a kept document's copies from the copies index, the same as a scan of every reject.

A small real-data run (Wikipedia articles, each with two edited copies and some exact copies, the
copies shuffled into other input files than their originals) through exact dedup and MinHash: for
every document some copy names as its survivor, the index (``copies/``, engine/tasks/copies.py)
lists exactly the rows ``select ... from documents where dup_of = id`` finds, and it reads only
the copies files of the survivor's own task (one per dedup stage), while the copies themselves lie
in the reject files of several tasks.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

from datapipe.audit import documents
from datapipe.audit.explain import copies_of, explain, scanned_copies_of
from datapipe.audit.sql import run_query
from datapipe.dedup.evalset import build
from tests.conftest import write_pipeline
from tests.support.shared_data import shared_path
from tests.support.small_real_run import run_in_process

FILES = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("copies")
    texts, _, _ = build(
        [
            (shared_path("corpus", "zh_wikipedia.jsonl"), "zh", 8, 300),
            (shared_path("corpus", "en_wikipedia.jsonl"), "en", 8, 600),
        ],
        seed=5,
    )
    rng = random.Random(1)
    texts += rng.sample(texts, 10)  # exact copies, of originals and of edited copies (chains across the stages)
    rng.shuffle(texts)  # copies land in other files than their survivors
    (base / "data").mkdir()
    for f in range(FILES):
        lines = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts[f::FILES])
        (base / "data" / f"part-{f}.jsonl").write_text(lines, encoding="utf-8")
    pipeline = write_pipeline(
        base,
        {
            "name": "copies",
            "sources": [{"name": "wiki", "paths": ["data/*.jsonl"]}],
            "split": {"group_small_files": False, "min_tasks_per_cpu": 0},  # a map task per input file
            "stages": [{"dedup": {"exact": True, "partitions": 2}}, {"minhash": {"threshold": 0.7, "partitions": 2}}],
        },
    )
    run_in_process(pipeline, base / "out")
    return base / "out"


def test_explain_lists_every_copy_from_the_survivors_own_files(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dropped = run_query(run, "select id, stage, dup_of from documents where dup_of is not null").to_pylist()
    stages = {r["stage"] for r in dropped}
    assert stages == {"dedup", "minhash"}, stages
    # The copies lie in the reject files of several tasks, and some are in another task than their survivor.
    assert len({r["id"].split("#")[0] for r in dropped}) == FILES
    assert any(r["id"].split("#")[0] != r["dup_of"].split("#")[0] for r in dropped)
    survivors = sorted({r["dup_of"] for r in dropped})
    both = {s for s in survivors if {r["stage"] for r in dropped if r["dup_of"] == s} == stages}
    assert both, "no survivor with both exact and near copies"

    # What a scan of every reject file finds, per survivor: the rows of `where dup_of = id`.
    scanned: dict[str, list[tuple]] = {}
    for r in run_query(run, "select dup_of, id, reason, detail from documents where dup_of is not null order by id").to_pylist():
        scanned.setdefault(r["dup_of"], []).append((r["id"], r["reason"], r["detail"]))
    assert scanned_copies_of(run, survivors[0]) == scanned[survivors[0]]

    registered: list[int | None] = []
    attach = documents.attach_copies
    monkeypatch.setattr(documents, "attach_copies", lambda *a: registered.append(attach(*a)) or registered[-1])
    for survivor in survivors:  # kept ones, and those a later stage dropped (an exact copy's survivor)
        assert copies_of(run, survivor) == scanned[survivor], survivor
    # Each lookup read the index files of the survivor's own task only (its input file's: one per
    # dedup stage at most), not those of every task holding a copy.
    assert len(registered) == len(survivors) and all(n is not None and 1 <= n <= len(stages) for n in registered), registered

    kept = run_query(run, "select id from documents where status = 'kept'")["id"].to_pylist()
    survivor = next(s for s in sorted(both) if s in kept)
    out = io.StringIO()
    explain(run, survivor, out)
    said = out.getvalue()
    assert "kept as the survivor of these copies" in said
    assert "dropped as exact_duplicate" in said and "dropped as near_duplicate" in said


def test_the_index_is_one_file_per_task_and_stage_with_its_own_survivors(run: Path) -> None:
    from datapipe.audit.sql import connect

    with connect(run) as con:
        files = con.execute("select path, stage, rows, min_dup_of, max_dup_of from copies_files order by path").fetchall()
    assert {f[1] for f in files} == {"dedup", "minhash"}
    assert (
        sum(f[2] for f in files) == run_query(run, "select count(*) as n from documents where dup_of is not null")["n"][0].as_py()
    )
    # A file per task and stage, holding that task's survivors: one input file's ids.
    assert len({(Path(f[0]).name.split(".")[0], f[1]) for f in files}) == len(files) > FILES
    for path, _, _, lo, hi in files:
        assert lo.split("#")[0] == hi.split("#")[0], (path, lo, hi)
