"""MinHash clusters found across partitions in star rounds (no task holds the corpus's clusters) equal
the in-memory clustering: on real near-duplicates (UDHR page variants, edited zh/en Wikipedia copies)
with 1, 3 and 16 partitions and every survivor rule, on a constructed chain of copies that needs
many rounds, and when the rounds run out (the combine step finishes the open clusters). The engine's
task functions run in this process (no Ray)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datapipe.dedup.cluster import cluster_duplicates, union_of
from datapipe.dedup.components import both_ways, large_star, node_partition, small_star
from datapipe.dedup.minhash import band_keys, empty_mask
from datapipe.engine.plan import RunSpec, Segment, build_stage, make_spec
from datapipe.engine.tasks.map import map_shard
from datapipe.engine.tasks.merge import merge_round
from datapipe.engine.tasks.reduce import partition_decisions, partition_state, reduce_partition, reduce_stage
from datapipe.engine.work_files import WorkFiles
from datapipe.pipeline.load import load_pipeline
from datapipe.run_folder.layout import RunFolder
from datapipe.stages import PartitionStep
from datapipe.stages.global_stage import step_of
from datapipe.stages.minhash import SIG_COLUMN, MinHashDedup, _sig_matrix
from datapipe.stages.row_keys import ROW_KEY_SHIFT, row_keys
from tests.conftest import write_pipeline
from tests.engine.test_global_phases import _edited
from tests.support.shared_data import shared_path


def star_rounds(
    u: np.ndarray, v: np.ndarray, partitions: int, pairs: int
) -> tuple[dict[int, int], tuple[np.ndarray, np.ndarray], int]:
    """The star rounds as the stage runs them, each partition seeing only its nodes' rows: the
    settled {node: root}, the edges left after the last round, and the last round that had rows."""
    node, nbr = both_ways(u, v)
    kind = np.zeros(len(node), np.int8)
    settled: dict[int, int] = {}
    busy = 0
    for r in range(1, 2 * pairs + 1):
        part = node_partition(node, partitions)
        out_node, out_nbr, out_kind = [], [], []
        for p in range(partitions):
            mine = part == p
            n, b, edge = node[mine], nbr[mine], kind[mine] == 0
            if r % 2:
                (eu, ev), (centre, leaf) = small_star(n[edge], b[edge])
                out_node.append(centre), out_nbr.append(leaf), out_kind.append(np.ones(len(centre), np.int8))
            else:
                (eu, ev), (roots, members) = large_star(n[edge], b[edge], (n[~edge], b[~edge]))
                for root, member in zip(roots.tolist(), members.tolist()):
                    assert member not in settled  # a node is settled once
                    settled[member] = settled[root] = root
            a, c = both_ways(eu, ev)
            out_node.append(a), out_nbr.append(c), out_kind.append(np.zeros(len(a), np.int8))
        node, nbr, kind = np.concatenate(out_node), np.concatenate(out_nbr), np.concatenate(out_kind)
        busy = r if len(node) else busy
    return settled, (node[kind == 0], nbr[kind == 0]), busy


def _components(u: np.ndarray, v: np.ndarray) -> dict[int, int]:
    ids, uf = union_of(u, v)
    return dict(zip(ids.tolist(), ids[uf.roots()].tolist())) if len(ids) else {}


@pytest.mark.parametrize("seed", range(6))
def test_star_rounds_find_every_component_of_random_graphs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 3000))
    m = int(rng.integers(n // 4, 2 * n))
    # Sparse row keys (shard << 32 | row), as the stage sees them.
    u = rng.integers(0, 6, m).astype(np.int64) << ROW_KEY_SHIFT | rng.integers(0, n, m)
    v = rng.integers(0, 6, m).astype(np.int64) << ROW_KEY_SHIFT | rng.integers(0, n, m)
    keep = u != v
    settled, (left_u, _), busy = star_rounds(u[keep], v[keep], int(rng.integers(1, 17)), pairs=8)
    assert settled == _components(u[keep], v[keep]) and len(left_u) == 0
    assert busy >= 3  # pairs of copies settle in round 2; these graphs needed more


@pytest.mark.parametrize(("length", "pairs"), [(2, 1), (60, 8), (500, 10), (300, 3), (1000, 2)])
def test_a_chain_needs_rounds_and_what_they_leave_is_finished_by_union_find(length: int, pairs: int) -> None:
    """A chain of copies in run order (the slowest case for star rounds): with enough rounds every
    cluster is settled by the partitions; with too few, the settled part and the union-find over the
    edges left (what the combine step does) together still give exactly the components."""
    chain = np.arange(length, dtype=np.int64) * 7 + 3
    settled, (left_u, left_v), busy = star_rounds(chain[:-1], chain[1:], partitions=5, pairs=pairs)
    left = _components(left_u, left_v)
    assert not set(settled) & set(left)
    assert {**settled, **left} == {int(x): 3 for x in chain}
    if length == 2:
        assert busy == 1  # settled in round 2: round 3 and later receive nothing
    if pairs >= 8:
        assert busy >= 12 and not left  # many rounds, all of them needed and enough
    if pairs < 4 and length >= 300:
        assert len(left_u) > 0  # not enough rounds: the combine step has work


def _wiki_docs(n: int) -> list[str]:
    out = []
    for name in ("zh_wikipedia.jsonl", "en_wikipedia.jsonl"):
        with shared_path("corpus", name).open(encoding="utf-8") as f:
            got = 0
            for line in f:
                text = json.loads(line)["text"]
                if len(text) > 200:
                    out.append(text)
                    got += 1
                if got >= n:
                    break
    rng = random.Random(5)
    docs = list(out)
    for _ in range(len(out) // 2):  # edited copies, some of copies: chains across partitions
        docs.append(_edited(rng.choice(docs), rng))
    rng.shuffle(docs)
    return docs


def _udhr_variants() -> list[str]:
    """UDHR pages with more than one version (spelling reforms, scripts, dialects): natural near-duplicates."""
    udhr = shared_path("web", "html", "udhr")
    names = sorted(p.stem for p in udhr.glob("*.html"))
    base = [n.split("_")[0] for n in names]
    return [str(udhr / f"{n}.html") for n, b in zip(names, base) if base.count(b) > 1]


def _pipeline(folder: Path, partitions: int, survivor: str) -> RunSpec:
    minhash = {"threshold": 0.7, "fold_script": True, "partitions": partitions, "survivor": survivor}
    if survivor == "best":
        minhash["score_column"] = "lang_score"
    pipeline = write_pipeline(
        folder,
        {
            "name": "mhr",
            "sources": [
                {"name": "udhr", "kind": "web", "format": "html", "paths": _udhr_variants()},
                {"name": "wiki", "kind": "text", "paths": ["data/*.jsonl"]},
            ],
            "stages": [{"langid": {"min_score": 0.0}}, {"minhash": minhash}],
        },
    )
    return make_spec(load_pipeline(pipeline), folder / "out", folder / "cache")


def _global_step(spec: RunSpec, segment: Segment) -> tuple[dict, dict, list[int]]:
    """Every round and the combine step; the decisions {id: (dup_of, dup_cluster, detail)}, the
    survivors' {row_key: dup_count} the map tasks after it read, and rows in per round."""
    folder = RunFolder(Path(spec.root))
    stage = build_stage(spec, segment.compute_global)
    step = step_of(stage, PartitionStep)
    assert step is not None
    rows_in = []
    for r in range(step.rounds):
        merge_round(spec, segment, r)  # as the engine's merge phase does, where the round has many input files
        rows_in.append(sum(reduce_partition(spec, segment, p, r)["rows_in"] for p in range(step.partitions)))
    reduce_stage(spec, segment)
    decisions, sizes = {}, {}
    for s in spec.shards:
        for table in (
            partition_decisions(folder, segment.index, stage, s.ordinal),
            pq.read_table(p) if (p := WorkFiles(folder).decisions_file(segment.index, s.key)).exists() else None,
        ):
            for r in table.to_pylist() if table is not None else []:
                assert r["id"] not in decisions  # one decision per document
                decisions[r["id"]] = (r["dup_of"], r["dup_cluster"], r["detail"])
        for table in (
            partition_state(folder, segment.index, stage, s.ordinal),
            pq.read_table(WorkFiles(folder).state_file(segment.index), filters=[("shard", "=", s.ordinal)])
            if WorkFiles(folder).state_file(segment.index).exists()
            else None,
        ):
            for r in table.to_pylist() if table is not None else []:
                assert r["row_key"] not in sizes
                sizes[r["row_key"]] = r["dup_count"]
    return decisions, sizes, rows_in


def _in_memory(spec: RunSpec, segment: Segment, survivor: str) -> tuple[dict, dict]:
    """``cluster_duplicates`` over the whole corpus at once, in run order (row-key order)."""
    folder = RunFolder(Path(spec.root))
    present = [s for s in spec.shards if WorkFiles(folder).map_output(segment.index, s.key).exists()]
    tables = [pq.read_table(WorkFiles(folder).map_output(segment.index, s.key)) for s in present]
    keys = np.concatenate([row_keys(s.ordinal, 0, t.num_rows) for s, t in zip(present, tables)])
    table = pa.concat_tables(tables, promote_options="permissive")  # sources differ in nullability
    order = np.argsort(keys)
    keys, table = keys[order], table.take(pa.array(order))
    stage = build_stage(spec, segment.compute_global)
    sigs = _sig_matrix(table[SIG_COLUMN], stage.options.num_perm)
    res = cluster_duplicates(
        band_keys(sigs, *stage.band_params()),
        len(sigs),
        valid=~empty_mask(sigs),
        sigs=sigs,
        verify_threshold=0.7,
        rule=survivor,
        lengths=table["n_chars"].to_numpy(),
        scores=table["lang_score"].to_numpy(zero_copy_only=False) if "lang_score" in table.column_names else None,
    )
    ids = table["id"].to_pylist()
    decisions = {}
    for i in np.flatnonzero(res.duplicate):
        s = res.survivor[i]
        j = (sigs[i] == sigs[s]).mean()
        decisions[ids[i]] = (
            ids[s],
            ids[res.cluster[i]],
            f"near-duplicate of {ids[s]} (cluster of {res.size[i]}, estimated Jaccard {j:.2f})",
        )
    kept = np.flatnonzero(res.kept)
    return decisions, dict(zip(keys[kept].tolist(), res.size[kept].tolist()))


@pytest.mark.slow
@pytest.mark.parametrize("partitions", [1, 3, 16])
def test_star_rounds_equal_the_in_memory_clustering_on_real_near_duplicates(tmp_path: Path, partitions: int) -> None:
    (tmp_path / "data").mkdir()
    docs = _wiki_docs(60)
    for f in range(3):
        (tmp_path / "data" / f"part-{f}.jsonl").write_text(
            "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in docs[f::3])
        )
    spec = _pipeline(tmp_path, partitions, "earliest")
    segment = spec.segments[0]
    for s in spec.shards:
        map_shard(spec, s, segment)
    udhr_ids = set()
    for survivor in ("earliest", "longest", "best"):  # the map outputs do not depend on the rule
        spec = _pipeline(tmp_path, partitions, survivor)
        got, sizes, rows_in = _global_step(spec, spec.segments[0])
        expected, expected_sizes = _in_memory(spec, spec.segments[0], survivor)
        assert got == expected  # same dropped documents, survivors, cluster ids and detail text
        assert sizes == expected_sizes  # every survivor's dup_count, from the partitions
        assert not _left_open(spec)  # the combine step had nothing to finish
        assert rows_in[1] > 0 and rows_in[-1] == 0  # star rounds ran, and ended before the last one
        udhr_ids |= {i for i in got if i.startswith("udhr/")}
    assert len(expected) >= 40 and len(udhr_ids) >= 10  # planted copies and real UDHR variants were found


def _left_open(spec: RunSpec) -> bool:
    """Whether the last round forwarded rows: clusters left for the combine step."""
    folder = RunFolder(Path(spec.root))
    step = step_of(build_stage(spec, spec.segments[0].compute_global), PartitionStep)
    assert step is not None
    return any(WorkFiles(folder).forward_file(0, step.rounds - 1, p).exists() for p in range(step.partitions))


def _chain(folder: Path, length: int) -> None:
    """A chain of windows over one long article, each shifted a twentieth of its width from the one
    before, in run order: windows up to three apart are near-duplicates (Jaccard ~0.9, 0.82, 0.74),
    four apart not (~0.67): a long thin cluster, one end far from the other."""
    with shared_path("corpus", "zh_wikipedia.jsonl").open(encoding="utf-8") as f:
        text = max((json.loads(line)["text"] for line in f), key=len)
    width, step = 600, 30
    assert len(text) >= width + step * length
    windows = [text[i * step : i * step + width] for i in range(length)]
    (folder / "data").mkdir()
    for f in range(4):  # consecutive windows in consecutive files: the chain crosses every shard
        (folder / "data" / f"part-{f}.jsonl").write_text(
            "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in windows[f * length // 4 : (f + 1) * length // 4])
        )


@pytest.mark.parametrize(("star_pairs", "survivor"), [(10, "longest"), (1, "earliest"), (2, "longest")])
def test_a_chain_of_copies_settles_in_rounds_or_in_the_combine_step(
    tmp_path: Path, monkeypatch, star_pairs: int, survivor: str
) -> None:
    monkeypatch.setattr(MinHashDedup, "star_pairs", star_pairs)
    _chain(tmp_path, 80)
    pipeline = write_pipeline(
        tmp_path,
        {
            "name": "chain",
            "sources": [{"name": "w", "kind": "text", "paths": ["data/*.jsonl"]}],
            "stages": [{"minhash": {"threshold": 0.7, "partitions": 4, "survivor": survivor}}],
        },
    )
    spec = make_spec(load_pipeline(pipeline), tmp_path / "out", tmp_path / "cache")
    segment = spec.segments[0]
    for s in spec.shards:
        map_shard(spec, s, segment)
    got, sizes, rows_in = _global_step(spec, segment)
    expected, expected_sizes = _in_memory(spec, segment, survivor)
    assert got == expected and sizes == expected_sizes
    assert max(expected_sizes.values()) >= 60  # a long cluster: the chain held together
    left_open = _left_open(spec)
    if star_pairs == 10:
        assert sum(1 for n in rows_in if n) >= 6 and not left_open  # several rounds, then settled by them
    else:
        assert rows_in[-1] > 0 and left_open  # still open after the last round: finished by the combine step


def test_a_run_plans_every_round_but_runs_only_those_with_work(tmp_path: Path) -> None:
    """In a real run (in process) the clusters of the UDHR variants settle within a few rounds: the
    rounds after the last with work have no tasks and no markers, and a rerun finds nothing to do."""
    from datapipe.engine.runner import run_pipeline

    udhr = shared_path("web", "html", "udhr")
    pages = ["deu_1901", "deu_1996", "eng", "ron_1953", "ron_1993", "ron_2006", "fra", "cmn_hans", "cmn_hant"]
    pipeline = load_pipeline(
        write_pipeline(
            tmp_path,
            {
                "name": "plan",
                "sources": [{"name": "udhr", "kind": "web", "format": "html", "paths": [str(udhr / f"{p}.html") for p in pages]}],
                "stages": [{"minhash": {"threshold": 0.7, "fold_script": True, "partitions": 3}}],
            },
        )
    )
    out = tmp_path / "out"
    result = run_pipeline(pipeline, output=out, show_progress=False, log=lambda _: None, in_process=True)
    tasks_of = {p["phase"]: p["tasks"] for p in result.phases}
    rounds = MinHashDedup.rounds()
    ran = [tasks_of.get(f"shuffle0r{r}" if r else "shuffle0", 0) for r in range(rounds)]
    busy = sum(1 for n in ran if n)
    assert 3 <= busy < rounds and ran == [3] * busy + [0] * (rounds - busy)  # a prefix of the rounds, then none
    assert sorted(p.name for p in (out / "_work" / "markers").iterdir() if p.name.startswith("shuffle")) == sorted(
        ["shuffle0"] + [f"shuffle0r{r}" for r in range(1, busy)]
    )
    kept = {r["path"].removesuffix(".html"): r["dup_count"] for r in pq.read_table(out / "docs").to_pylist()}
    assert kept == {"deu_1901": 2, "eng": 1, "ron_1953": 3, "fra": 1, "cmn_hans": 2}  # sizes from the partitions
    again = run_pipeline(pipeline, output=out, show_progress=False, log=lambda _: None, in_process=True)
    assert again.executed_tasks == 0
