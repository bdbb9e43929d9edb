"""Shuffle merges (engine/shuffle_plan.py, engine/tasks/merge.py): a round's runs, and a deciding step's
outputs, merged in levels of bounded fan-in (``split.shuffle_fan_in``) before their readers, so the files
opened per document stay flat when map tasks and partitions both grow with the corpus; the outputs do
not change, however the rounds are merged and cut into tasks (``split.partition_rows``).

On a real run (zh/en Wikipedia with planted copies, exact dedup + MinHash, in process) the Parquet files
the tasks open per document stay flat from 3 to 12 map tasks with fan-in 2 (merge levels), and grow
without merges (every partition opens every writer's run), with the same kept and rejected documents
either way. The merge tree's order on random runs: tests/engine/test_runs.py."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from datapipe.run_folder.layout import RunFolder
from tests.conftest import write_pipeline
from tests.support.shared_data import shared_path


def _corpus(folder: Path, files: int, per_file: int, texts: list[str]) -> int:
    rng = random.Random(files)
    folder.mkdir()
    n = 0
    for f in range(files):
        lines = []
        for _ in range(per_file):
            if n > 10 and rng.random() < 0.15:  # copies of earlier documents, often in other files
                src = texts[rng.randrange(n)]
                text = src if rng.random() < 0.5 else src + " (reposted)"
            else:
                text = texts[n % len(texts)] + f" #{n}"
            lines.append(json.dumps({"text": text}, ensure_ascii=False))
            n += 1
        (folder / f"part-{f:03d}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return n


def _opened_per_doc(
    tmp_path: Path, name: str, tasks: int, fan_in: int, rows: int, texts: list[str], monkeypatch
) -> tuple[float, dict]:
    """Run in process; Parquet files under _work the tasks opened, per document; and the outputs."""
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    root = tmp_path / name
    root.mkdir()
    docs = _corpus(root / "data", tasks, 25, texts)
    pipeline = write_pipeline(
        root,
        {
            "name": name,
            "sources": [{"name": "wiki", "kind": "text", "paths": ["data/*.jsonl"]}],
            "stages": [{"dedup": {"exact": True, "partitions": tasks}}, {"minhash": {"threshold": 0.7, "partitions": tasks}}],
            "split": {
                "target_bytes": 1 << 30,
                "min_tasks_per_cpu": 0,
                "group_small_files": False,
                "shuffle_fan_in": fan_in,
                "partition_rows": rows,
            },
        },
    )
    out = root / "out"
    work = str(out / "_work") + "/"
    opened: list[str] = []

    def note(source) -> None:
        for s in source if isinstance(source, list | tuple) else [source]:
            if isinstance(s, str | Path) and str(s).startswith(work) and "/markers/" not in str(s):
                opened.append(str(s))

    def wrap(owner, attr):
        original = getattr(owner, attr)

        def counting(source, *args, **kwargs):
            note(source)
            return original(source, *args, **kwargs)

        monkeypatch.setattr(owner, attr, counting)

    wrap(pads, "dataset")
    wrap(pq, "read_table")
    original_init = pq.ParquetFile.__init__

    def init(self, source, *args, **kwargs):
        note(source)
        original_init(self, source, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "__init__", init)
    run_pipeline(load_pipeline(pipeline), output=out, show_progress=False, log=lambda _: None, in_process=True)
    monkeypatch.undo()
    outputs = {kind: sorted(pq.read_table(out / kind, columns=["id"])["id"].to_pylist()) for kind in ("docs", "rejected")}
    outputs["reasons"] = sorted(pq.read_table(out / "rejected", columns=["reason"])["reason"].to_pylist())
    # Runs each merge and partition task read (their markers), the largest: bounded by the fan-in.
    folder = RunFolder(out)
    reads = [
        m["inputs"]
        for p in (out / "_work" / "markers").iterdir()
        for m in folder.markers.read_all(p.name).values()
        if "inputs" in m
    ]
    outputs["most_inputs"] = max(reads)  # type: ignore[assignment]
    return len(opened) / docs, outputs


@pytest.mark.slow
def test_files_opened_per_document_stay_flat_with_merges_and_outputs_do_not_change(tmp_path: Path, monkeypatch) -> None:
    texts = []
    for name in ("zh_wikipedia.jsonl", "en_wikipedia.jsonl"):
        with shared_path("corpus", name).open(encoding="utf-8") as f:
            texts += [t[:1500] for line in f if len(t := json.loads(line)["text"]) > 300][:150]
    # 25 documents a map task; partitions of ~40 rows (exact dedup: ~1.6 tasks per map task; MinHash's
    # band rows: more), so partitions grow with the corpus as map tasks do.
    small, out_small = _opened_per_doc(tmp_path, "small", 3, 2, 40, texts, monkeypatch)
    large, out_large = _opened_per_doc(tmp_path, "large", 12, 2, 40, texts, monkeypatch)
    plain_small, plain_out_small = _opened_per_doc(tmp_path, "plain-small", 3, 4096, 40, texts, monkeypatch)
    plain_large, plain_out_large = _opened_per_doc(tmp_path, "plain-large", 12, 4096, 40, texts, monkeypatch)
    one, out_one = _opened_per_doc(tmp_path, "one-task", 12, 4096, 1 << 30, texts, monkeypatch)
    # No merge or partition task read more than fan-in runs (and its owned map outputs, MinHash's answers).
    assert out_small.pop("most_inputs") <= 2 and out_large.pop("most_inputs") <= 2
    assert plain_out_large.pop("most_inputs") >= 12  # without merges: every writer's run
    plain_out_small.pop("most_inputs"), out_one.pop("most_inputs")
    assert out_small == plain_out_small and out_large == plain_out_large  # merging changes no output
    assert out_one == out_large  # nor does cutting a round into tasks: one task a round
    assert "near_duplicate" in out_large["reasons"] and "exact_duplicate" in out_large["reasons"]
    # Opens per document: without merges they grow with tasks x partitions; with fan-in 2 by the levels
    # only (12 writers need 3 levels, 3 writers 1: log2 of the writers), so less than the plain growth.
    assert plain_large / plain_small > 2, (plain_small, plain_large)
    assert large / small < plain_large / plain_small and large < plain_large, (small, large, plain_small, plain_large)


def test_holding_each_key_is_what_a_reader_of_that_one_key_reads() -> None:
    """A map phase asks, for every shard, the runs holding its rows (``Grid.holding_each``, one pass over
    the grid's ranges): the same runs, in the same order, as ``Grid.holding`` of that one key."""
    from datapipe.engine.shuffle_plan import Grid, RunFile

    rng = random.Random(7)
    for _ in range(50):
        keys = rng.randint(1, 40)
        cuts = sorted({0, *(rng.randint(0, keys) for _ in range(rng.randint(0, 6)))})  # empty ranges too
        ranges = tuple(zip(cuts, [*cuts[1:], keys]))
        files = tuple(
            tuple(
                None if rng.random() < 0.3 else RunFile(f"g{g}-r{j}", rng.choice([0, 1, 5]), lo, hi)
                for j, (lo, hi) in enumerate(ranges)
            )
            for g in range(rng.randint(1, 4))
        )
        grid = Grid(ranges, files)
        assert grid.holding_each(keys) == [tuple(grid.holding(k, k + 1)) for k in range(keys)]
