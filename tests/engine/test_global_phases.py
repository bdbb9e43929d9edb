"""Global phases split across tasks equal their single-task results on real text (no Ray: the task
functions run in this process, partition by partition, as Ray would run them in parallel)."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datapipe.engine.pack_plan import pack_ranges
from datapipe.engine.phases import run_here, segment_phases, shard_outputs
from datapipe.engine.plan import RunSpec, Segment, build_stage, make_spec
from datapipe.engine.tasks.map import map_shard
from datapipe.engine.tasks.pack import pack_range, pack_source
from datapipe.engine.work_files import WorkFiles
from datapipe.pipeline.load import load_pipeline
from datapipe.run_folder.layout import RunFolder
from datapipe.stages import PartitionStep
from datapipe.stages.global_stage import step_of
from tests.conftest import write_pipeline
from tests.support.shared_data import shared_path


def _real_texts(n_zh: int, n_en: int) -> list[str]:
    out = []
    for name, n in (("zh_wikipedia.jsonl", n_zh), ("en_wikipedia.jsonl", n_en)):
        with shared_path("corpus", name).open(encoding="utf-8") as f:
            for line in f:
                text = json.loads(line)["text"]
                if len(text) > 40:
                    out.append(text)
                if len(out) >= n + (n_zh if name.startswith("en") else 0):
                    break
    return out


def _corpus_with_planted_copies(folder: Path, n_files: int = 4) -> None:
    """Real articles with planted exact copies (case/width/space variants), URL duplicates (http vs https,
    trailing slash, fragment), and a URL duplicate of a page that is itself an exact duplicate."""
    rng = random.Random(7)
    texts = _real_texts(150, 150)
    docs = [{"text": t, "url": f"https://wiki.example/{i}"} for i, t in enumerate(texts)]
    for _ in range(60):  # exact copies, normalized equal
        src = rng.randrange(len(texts))
        t = texts[src]
        variant = rng.choice([t.upper(), "  " + t.replace(" ", "   ") + "\n", t])
        docs.append({"text": variant, "url": f"https://mirror.example/{rng.randrange(10**6)}"})
    for _ in range(40):  # same page under another spelling of its URL, with other text
        src = rng.randrange(len(texts))
        url = rng.choice([f"http://WIKI.example/{src}/", f"https://wiki.example/{src}#top", f"https://wiki.example:443/{src}"])
        docs.append({"text": texts[rng.randrange(len(texts))][::-1] + f" v{rng.random()}", "url": url})
    for _ in range(20):  # an exact copy under a fresh URL, then a page reusing that URL: kept (no chains)
        src = rng.randrange(len(texts))
        u = f"https://copy.example/{rng.randrange(10**9)}"
        docs.append({"text": texts[src], "url": u})
        docs.append({"text": f"other page {rng.random()}", "url": u})
    docs += [{"text": f"no url page {i}", "url": None} for i in range(5)]
    rng.shuffle(docs)
    (folder / "data").mkdir()
    for f in range(n_files):
        part = docs[f::n_files]
        (folder / "data" / f"part-{f}.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in part))


def _single_task_reference(folder: RunFolder, spec: RunSpec, exact: bool, url: bool) -> list[tuple]:
    """The single-task reduce datapipe used before partitioning (one DuckDB query over every map output)."""
    present = [
        (s.ordinal, str(WorkFiles(folder).map_output(0, s.key)))
        for s in spec.shards
        if WorkFiles(folder).map_output(0, s.key).exists()
    ]
    text_rank = "row_number() OVER (PARTITION BY text_hash ORDER BY shard, row)" if exact else "1"
    text_survivor = "first_value(id) OVER (PARTITION BY text_hash ORDER BY shard, row)" if exact else "id"
    url_column = "f.url_key" if url else "NULL::VARCHAR AS url_key"
    query = f"""
        WITH docs AS (
            SELECT f.id, f.text_hash, {url_column}, s.shard, f.file_row_number AS row
            FROM read_parquet($files, filename=true, file_row_number=true, union_by_name=true) f
            JOIN shard_files s USING (filename)
        ), by_text AS (
            SELECT *, {text_rank} AS text_rank, {text_survivor} AS text_survivor FROM docs
        ), by_url AS (
            SELECT *,
                   CASE WHEN text_rank = 1 AND url_key IS NOT NULL THEN
                        row_number() OVER (PARTITION BY (text_rank = 1), url_key ORDER BY shard, row) END AS url_rank,
                   CASE WHEN text_rank = 1 AND url_key IS NOT NULL THEN
                        first_value(id) OVER (PARTITION BY (text_rank = 1), url_key ORDER BY shard, row) END
                        AS url_survivor
            FROM by_text
        )
        SELECT id, shard,
               CASE WHEN text_rank > 1 THEN 'exact_duplicate' ELSE 'duplicate_url' END AS reason,
               CASE WHEN text_rank > 1 THEN 'same normalized text as ' || text_survivor
                    ELSE 'same URL as ' || url_survivor END AS detail,
               CASE WHEN text_rank > 1 THEN text_survivor ELSE url_survivor END AS dup_of
        FROM by_url WHERE text_rank > 1 OR url_rank > 1
    """
    con = duckdb.connect()
    con.register(
        "shard_files", pa.table({"filename": [p for _, p in present], "shard": pa.array([o for o, _ in present], pa.int32())})
    )
    rows = con.sql(query, params={"files": [p for _, p in present]}).fetchall()
    con.close()
    return sorted(rows)


@pytest.mark.parametrize(
    ("exact", "url", "partitions", "fan_in", "rows"),
    [
        (True, True, 5, 256, 40),
        (True, False, 3, 256, 10**6),
        (False, True, 4, 256, 25),
        (True, True, 1, 256, 40),
        (True, True, 5, 2, 30),
    ],
)
def test_partitioned_exact_dedup_equals_the_single_task_reduce(
    tmp_path: Path, exact: bool, url: bool, partitions: int, fan_in: int, rows: int
) -> None:
    _corpus_with_planted_copies(tmp_path)
    pipeline = load_pipeline(
        write_pipeline(
            tmp_path,
            {
                "name": "xd",
                "sources": [{"name": "web", "kind": "web", "paths": ["data/*.jsonl"]}],
                "stages": [{"dedup": {"exact": exact, "url": url, "partitions": partitions}}],
                "split": {"shuffle_fan_in": fan_in, "partition_rows": rows},
            },
        )
    )
    spec = make_spec(pipeline, tmp_path / "out", tmp_path / "cache")
    folder = RunFolder(tmp_path / "out")
    map0, map1 = spec.segments
    run_here(spec, segment_phases(spec, map0))  # the map tasks, each round's merges and partition tasks
    docs_in = sum(m["docs_in"] for m in folder.markers.read_all("map0").values())
    stage = build_stage(spec, 1)
    step = step_of(stage, PartitionStep)
    assert step is not None and step.rounds == int(exact) + int(url)
    got = []
    for s in spec.shards:
        table = shard_outputs(spec, map0, s.ordinal)  # what its next map task reads
        if table is not None:
            got += [(r["id"], r["shard"], r["reason"], r["detail"], r["dup_of"]) for r in table.to_pylist()]
    expected = _single_task_reference(folder, spec, exact, url)
    assert sorted(got) == expected
    reasons = {r[2] for r in expected}
    assert ("exact_duplicate" in reasons) == exact and ("duplicate_url" in reasons) == url
    # The map phase after it applies exactly those decisions: kept + rejected = read, dup_of carried.
    run_here(spec, segment_phases(spec, map1))
    assert sum(m["kept"] for m in folder.markers.read_all("map1").values()) == docs_in - len(expected)
    rejected = pq.read_table(tmp_path / "out" / "rejected").to_pylist()
    assert sorted((r["id"], r["reason"], r["dup_of"]) for r in rejected) == sorted((e[0], e[2], e[4]) for e in expected)


TOKENIZER = Path(__file__).resolve().parents[2] / "tokenizer" / "demo.json"


def _tokenized_run(folder: Path, packing: str, labels: bool) -> tuple[RunSpec, RunFolder]:
    """Real zh/en articles in five input files (one empty of val documents is likely), mapped and
    tokenized with the demo tokenizer: the token files both packers read."""
    texts = _real_texts(80, 80)
    (folder / "data").mkdir()
    for f in range(5):
        (folder / "data" / f"part-{f}.jsonl").write_text(
            "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts[f::5])
        )
    shutil.copy(TOKENIZER, folder / "tok.json")
    pipeline = load_pipeline(
        write_pipeline(
            folder,
            {
                "name": "pk",
                "sources": [{"name": "zh_en", "kind": "text", "paths": ["data/*.jsonl"]}],
                "tokenize": {
                    "tokenizer": "tok.json",
                    "seq_len": 96,
                    "labels": labels,
                    "val_fraction": 0.1,
                    "rows_per_shard": 7,
                    "packing": packing,
                    "bestfit_window": 16,
                },
            },
        )
    )
    spec = make_spec(pipeline, folder / "single", folder / "cache")
    run = RunFolder(folder / "single")
    for s in spec.shards:  # the markers as the runner records them: packing is planned from them
        run.markers.write("map0", s.key, map_shard(spec, s, spec.segments[-1]))
    return spec, run


@pytest.mark.parametrize(
    ("packing", "labels", "files_per_task"),
    [("concat", False, 1), ("concat", True, 3), ("concat", False, 1000), ("bestfit", True, 2)],
)
def test_parallel_packing_writes_the_single_task_packers_bytes(
    tmp_path: Path, packing: str, labels: bool, files_per_task: int
) -> None:
    spec, single = _tokenized_run(tmp_path, packing, labels)
    shutil.copytree(single.root, tmp_path / "ranged")
    ranged_spec = dataclasses.replace(spec, root=str(tmp_path / "ranged"))
    expected = pack_source(spec, "zh_en")["shards"]
    ranges = pack_ranges(RunFolder(tmp_path / "ranged"), ranged_spec, files_per_task=files_per_task)
    assert ranges is not None
    got = [row for r in ranges for row in pack_range(ranged_spec, r)["shards"]]
    assert got == expected  # manifest rows: paths, counts and sha256 of every file, in order
    files = sorted(p.relative_to(single.shards_dir) for p in single.shards_dir.rglob("*.arrow"))
    assert files == sorted(
        p.relative_to(tmp_path / "ranged" / "shards") for p in (tmp_path / "ranged" / "shards").rglob("*.arrow")
    )
    for f in files:
        assert (single.shards_dir / f).read_bytes() == (tmp_path / "ranged" / "shards" / f).read_bytes()
    n_train = sum(1 for row in expected if row["split"] == "train")
    assert n_train > 3 and len(expected) > n_train  # several files per split, and a val split
    if packing == "concat":
        assert len(ranges) == sum(-(-n // files_per_task) for n in (n_train, len(expected) - n_train))
    else:  # bestfit: one task per (source, split)
        assert len(ranges) == 2 and all(r.n_files is None for r in ranges)


def _edited(text: str, rng: random.Random) -> str:
    """A near-duplicate: a few characters replaced, a sentence dropped or a phrase added."""
    chars = list(text)
    for _ in range(max(1, len(chars) // 200)):
        chars[rng.randrange(len(chars))] = rng.choice("的了是在和 the of and")
    text = "".join(chars)
    cut = rng.randrange(len(text))
    return rng.choice([text[:cut] + text[cut + 20 :], text + " 转载请注明出处 reposted", text])


@pytest.mark.parametrize(("survivor", "partitions"), [("earliest", 6), ("longest", 3), ("earliest", 1)])
def test_partitioned_minhash_clusters_equal_the_in_memory_clustering(tmp_path: Path, survivor: str, partitions: int) -> None:
    from datapipe.dedup.cluster import cluster_duplicates
    from datapipe.dedup.minhash import band_keys, empty_mask
    from datapipe.stages.minhash import SIG_COLUMN, _sig_matrix

    rng = random.Random(11)
    texts = [t for t in _real_texts(120, 120) if len(t) > 200]
    docs = list(texts)
    for _ in range(90):  # edited copies, some of earlier copies (chains across partitions)
        docs.append(_edited(rng.choice(docs), rng))
    docs += ["", "   "]  # no shingles: never clustered together
    rng.shuffle(docs)
    (tmp_path / "data").mkdir()
    for f in range(4):
        (tmp_path / "data" / f"part-{f}.jsonl").write_text(
            "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in docs[f::4])
        )
    pipeline = load_pipeline(
        write_pipeline(
            tmp_path,
            {
                "name": "mh",
                "sources": [{"name": "t", "kind": "text", "paths": ["data/*.jsonl"]}],
                "stages": [{"minhash": {"threshold": 0.7, "partitions": partitions, "survivor": survivor}}],
                # Rounds cut into tasks of a few parts each (a part is reduced on its own either way).
                "split": {"partition_rows": 300, "shuffle_fan_in": 3},
            },
        )
    )
    spec = make_spec(pipeline, tmp_path / "out", tmp_path / "cache")
    folder = RunFolder(tmp_path / "out")
    map0 = spec.segments[0]
    got = {r["id"]: (r["dup_of"], r["dup_cluster"]) for r in minhash_decisions(spec, folder, map0)}

    # The in-memory clustering over the whole corpus at once, in run order.
    table = pa.concat_tables([pq.read_table(WorkFiles(folder).map_output(0, s.key)) for s in spec.shards])
    stage = build_stage(spec, 1)
    sigs = _sig_matrix(table[SIG_COLUMN], stage.options.num_perm)
    bands, rows = stage.band_params()
    res = cluster_duplicates(
        band_keys(sigs, bands, rows),
        len(sigs),
        valid=~empty_mask(sigs),
        sigs=sigs,
        verify_threshold=0.7,
        rule=survivor,
        lengths=table["n_chars"].to_numpy(),
    )
    ids = table["id"].to_pylist()
    expected = {ids[i]: (ids[res.survivor[i]], ids[res.cluster[i]]) for i in np.flatnonzero(res.duplicate)}
    assert got == expected
    assert len(expected) >= 60  # the planted copies are found (most of 90)


def minhash_decisions(spec: RunSpec, folder: RunFolder, segment: Segment) -> list[dict]:
    """The segment's map tasks and every round of its minhash stage's partition step (in this process),
    then its combine step: the decisions of every shard, as the map phase after it reads them
    (partitions' and combine's)."""
    run_here(spec, segment_phases(spec, segment))
    rows = []
    for s in spec.shards:
        table = shard_outputs(spec, segment, s.ordinal)
        rows += table.to_pylist() if table is not None else []
        path = WorkFiles(folder).decisions_file(segment.index, s.key)
        rows += pq.read_table(path).to_pylist() if path.exists() else []
    return rows


def test_spanning_forest_keeps_connectivity_with_one_edge_per_member() -> None:
    from datapipe.dedup.cluster import UnionFind, spanning_forest

    rng = np.random.default_rng(3)
    ids = rng.choice(10**12, 400, replace=False).astype(np.int64)  # sparse row keys, not 0..n-1
    u, v = ids[rng.integers(0, 400, 600)], ids[rng.integers(0, 400, 600)]
    roots, members = spanning_forest(u, v)
    assert len(np.unique(members)) == len(members)  # one edge per member

    def components(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        uf = UnionFind(len(ids))
        order = np.argsort(ids)
        pos = order[np.searchsorted(ids[order], a)], order[np.searchsorted(ids[order], b)]
        uf.union(*pos)
        return uf.roots()

    assert np.array_equal(components(u, v), components(roots, members))
    assert np.all(roots < members)  # the root is the component's lowest row key: run order
