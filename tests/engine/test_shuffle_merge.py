"""Shuffle merges (engine/tasks/merge.py): a shuffle round's input files, and a deciding step's
partition outputs, merged into ``split.shuffle_groups`` files, so the files opened per document stay
flat when map tasks and partitions both grow with the corpus; the outputs do not change.

The merged files give each reader exactly the rows, in the order, that the unmerged ones did
(random files, chunked streaming); and on a real run (zh/en Wikipedia with planted copies, exact
dedup + MinHash, in process) the Parquet files the tasks open per document stay flat from 3 to 12
map tasks and partitions with merges, and grow without them (every partition opens every
writer's file), with the same kept and rejected documents either way."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from datapipe.engine.tasks import merge
from datapipe.engine.tasks.sinks import ShuffleSink
from datapipe.engine.work_files import merge_outputs_phase
from datapipe.run_folder.layout import RunFolder
from tests.conftest import write_pipeline
from tests.support.shared_data import shared_path


def _read(files: list[Path], column: str, value: int) -> pa.Table:
    return pads.dataset([str(f) for f in files], format="parquet").to_table(filter=pads.field(column) == value)


@pytest.mark.parametrize("keys_per_file", [128, 2])
def test_merged_round_inputs_give_each_partition_the_same_rows_in_the_same_order(
    tmp_path: Path, monkeypatch, keys_per_file: int
) -> None:
    monkeypatch.setattr(merge, "CHUNK_BYTES", 2000)  # many chunks: the streaming path
    monkeypatch.setattr(merge, "KEYS_PER_FILE", keys_per_file)  # 2: each merged file split by key range
    rng = np.random.default_rng(3)
    files = []
    for w in range(7):
        sink = ShuffleSink(tmp_path / f"w{w}.parquet")
        for _ in range(3):  # batches, as a map task writes them
            n = int(rng.integers(0, 300))
            sink.write(pa.table({"part": rng.integers(0, 9, n).astype(np.int32), "doc": rng.integers(0, 1 << 40, n)}))
        sink.close()
        files.append(tmp_path / f"w{w}.parquet")
    present = [f for f in files if f.exists()]
    cuts = merge.key_files(9)
    merged: dict[int | None, list[Path]] = {}  # key file -> the groups' merged files, in group order
    for g in range(3):
        chosen = [files[i] for i in merge.group_writers(len(files), 3, g) if files[i].exists()]
        merge.merge_files(chosen, lambda k, g=g: tmp_path / f"m{g}-{k}.parquet", cuts)
        for k in range(cuts):
            if (tmp_path / f"m{g}-{k}.parquet").exists():
                merged.setdefault(k, []).append(tmp_path / f"m{g}-{k}.parquet")
    assert len(merged) == cuts and all(len(m) == 3 for m in merged.values())
    for part in range(9):
        mine = merged[part // keys_per_file if cuts > 1 else 0]
        assert _read(mine, "part", part).equals(_read(present, "part", part))
        # A reader's file holds its range's parts only: a footer that does not grow with the parts.
        assert all(pq.ParquetFile(f).metadata.num_row_groups <= keys_per_file for f in mine)


@pytest.mark.parametrize("keys_per_file", [128, 3])
def test_merged_decisions_give_each_shard_the_same_rows_in_the_same_order(
    tmp_path: Path, monkeypatch, keys_per_file: int
) -> None:
    monkeypatch.setattr(merge, "CHUNK_BYTES", 3000)
    monkeypatch.setattr(merge, "KEYS_PER_FILE", keys_per_file)
    rng = np.random.default_rng(5)
    files = []
    for p in range(6):  # partition outputs: sorted by shard, row groups spanning several shards
        n = int(rng.integers(1, 400))
        table = pa.table({"id": [f"d{p}-{i}" for i in range(n)], "shard": rng.integers(0, 20, n).astype(np.int32)})
        table = table.sort_by([("shard", "ascending")])
        pq.write_table(table, tmp_path / f"p{p}.parquet", row_group_size=37)
        files.append(tmp_path / f"p{p}.parquet")
    # Two groups of files, each cut into two ranges of shards, each range's output split by key.
    ranges = [range(0, 11), range(11, 20)]
    for name, group in (("a", files[:4]), ("b", files[4:])):
        for j, shards in enumerate(ranges):
            merge.merge_by_shard(
                [pq.ParquetFile(f) for f in group],
                lambda k, name=name, j=j: tmp_path / f"{name}-{j}-{k}.parquet",
                shards,
                merge.key_files(len(shards)),
            )
    for shard in range(20):
        j = 0 if shard < 11 else 1
        k = (shard - ranges[j].start) // keys_per_file if merge.key_files(len(ranges[j])) > 1 else 0
        merged = [f for name in "ab" if (f := tmp_path / f"{name}-{j}-{k}.parquet").exists()]
        assert _read(merged, "shard", shard).equals(_read(files, "shard", shard))
        assert all(pq.ParquetFile(f).metadata.num_row_groups <= keys_per_file for f in merged)


def test_decisions_merge_groups_are_cut_by_rows_not_by_outputs() -> None:
    # Outputs in reading order (round, partition): rows only in the middle rounds, as MinHash settles
    # pairs of copies in round 6. Cut by count, one group would hold them all; by rows, each about half.
    weights = [0.0] * 6 + [10.0, 12.0, 9.0, 11.0] + [0.0] * 6
    bounds = merge.output_bounds(weights, 2)
    assert bounds[0] == 0 and bounds[-1] == len(weights) and bounds == sorted(bounds)
    halves = [sum(weights[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    assert halves == [22.0, 20.0]
    assert merge.output_bounds([0.0] * 8, 4) == [0, 2, 4, 6, 8]  # nothing written: by count


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


def _opened_per_doc(tmp_path: Path, name: str, tasks: int, groups: int, texts: list[str], monkeypatch) -> tuple[float, dict]:
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
            "split": {"target_bytes": 1 << 30, "min_tasks_per_cpu": 0, "group_small_files": False, "shuffle_groups": groups},
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
    # The ranges a group's merge is cut into are a constant (8), not grown with the tasks; at 3 tasks
    # it would be capped at 3, so both sizes here use the same small constant.
    monkeypatch.setattr(merge, "OUTPUT_RANGES", 2)
    # Merged files split by key range (at 128 keys a file, these runs would write one file each).
    monkeypatch.setattr(merge, "KEYS_PER_FILE", 2)
    run_pipeline(load_pipeline(pipeline), output=out, show_progress=False, log=lambda _: None, in_process=True)
    monkeypatch.undo()
    outputs = {kind: sorted(pq.read_table(out / kind, columns=["id"])["id"].to_pylist()) for kind in ("docs", "rejected")}
    outputs["reasons"] = sorted(pq.read_table(out / "rejected", columns=["reason"])["reason"].to_pylist())
    # The MinHash decisions merge's rows per group (its markers): each group's share of the rows.
    per_group: dict[int, int] = {}
    for m in RunFolder(out).markers.read_all(merge_outputs_phase(1)).values():
        per_group[m["group"]] = per_group.get(m["group"], 0) + m["decision_rows"] + m["state_rows"] + m["copies_rows"]
    outputs["group_rows"] = per_group  # type: ignore[assignment]
    return len(opened) / docs, outputs


@pytest.mark.slow
def test_files_opened_per_document_stay_flat_with_merges_and_outputs_do_not_change(tmp_path: Path, monkeypatch) -> None:
    texts = []
    for name in ("zh_wikipedia.jsonl", "en_wikipedia.jsonl"):
        with shared_path("corpus", name).open(encoding="utf-8") as f:
            texts += [t[:1500] for line in f if len(t := json.loads(line)["text"]) > 300][:150]
    small, out_small = _opened_per_doc(tmp_path, "small", 3, 2, texts, monkeypatch)
    large, out_large = _opened_per_doc(tmp_path, "large", 12, 2, texts, monkeypatch)
    plain_small, plain_out_small = _opened_per_doc(tmp_path, "plain-small", 3, 0, texts, monkeypatch)
    plain_large, plain_out_large = _opened_per_doc(tmp_path, "plain-large", 12, 0, texts, monkeypatch)
    # The decisions merge's groups hold about equal rows: MinHash decides in a few of its 25 rounds,
    # and groups cut by output count put them all in one group (main: 0 rows in the other).
    rows = out_large.pop("group_rows")
    assert len(rows) == 2 and min(rows.values()) >= 0.5 * max(rows.values()), rows
    out_small.pop("group_rows")
    plain_out_small.pop("group_rows"), plain_out_large.pop("group_rows")
    assert out_small == plain_out_small and out_large == plain_out_large  # merging changes no output
    assert "near_duplicate" in out_large["reasons"] and "exact_duplicate" in out_large["reasons"]
    assert large / small <= 1.15, (small, large)  # 4x the tasks and partitions: flat per document
    assert plain_large / plain_small > 2, (plain_small, plain_large)  # without merges: all to all


def test_decisions_merge_keeps_the_groups_of_a_run_merged_before_groups_were_cut_by_rows(monkeypatch) -> None:
    from types import SimpleNamespace

    from datapipe.engine import phases
    from datapipe.engine.work_files import partition_key

    # 3 rounds x 4 partitions, rows only in the last round; 2 groups of 1 range.
    monkeypatch.setattr(phases, "output_weights", lambda spec, segment, markers: [0.0] * 8 + [5.0] * 4)
    step = SimpleNamespace(rounds=3, partitions=4)
    listed = phases._output_merge_tasks(None, SimpleNamespace(index=1), step, merge.OutputMerge(2, 1, 4))  # type: ignore[arg-type]

    def folder(earlier: dict) -> SimpleNamespace:
        rounds = {partition_key(p): {"forwarded": 1} for p in range(4)}
        markers = SimpleNamespace(read_all=lambda phase: earlier if phase == merge_outputs_phase(1) else rounds)
        return SimpleNamespace(markers=markers)

    tasks = listed(folder({}))
    assert [t.args[3:] for t in tasks] == [(0, 10), (10, 12)]  # by rows: 10 and 10
    # A merge task's marker from before (no "outputs"): the same groups as it had, by count.
    tasks = listed(folder({partition_key(0): {"group": 0, "decision_rows": 3}}))
    assert [t.args[3:] for t in tasks] == [(0, 6), (6, 12)]
