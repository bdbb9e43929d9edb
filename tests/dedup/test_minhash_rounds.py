"""MinHash clusters found across partitions in star rounds (no task holds the corpus's clusters) equal
the in-memory clustering: on real near-duplicates (UDHR page variants, edited zh/en Wikipedia copies)
with 1, 3 and 16 partitions and every survivor rule, on a constructed chain of copies that needs
many rounds, and when the rounds run out (the combine step finishes the open clusters). The engine's
task functions run in this process (no Ray)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datapipe.dedup.cluster import cluster_duplicates, union_of
from datapipe.dedup.components import (
    Aggregates,
    combine_partials,
    first_small_star,
    neighbour_partials,
    node_partition,
    star_checks,
    star_step,
)
from datapipe.dedup.components import settled as settled_centres
from datapipe.dedup.minhash import band_keys, empty_mask
from datapipe.engine.phases import run_here, segment_phases, shard_outputs
from datapipe.engine.plan import RunSpec, Segment, build_stage, make_spec
from datapipe.engine.work_files import WorkFiles, shuffle_phase
from datapipe.pipeline.load import load_pipeline
from datapipe.run_folder.layout import RunFolder
from datapipe.stages import PartitionStep
from datapipe.stages.global_stage import step_of
from datapipe.stages.minhash import SIG_COLUMN, MinHashDedup, _sig_matrix
from datapipe.stages.row_keys import ROW_KEY_SHIFT, row_keys
from tests.conftest import write_pipeline
from tests.engine.test_global_phases import _edited
from tests.support.shared_data import shared_path


def star_steps(
    u: np.ndarray, v: np.ndarray, partitions: int, steps: int
) -> tuple[dict[int, int], tuple[np.ndarray, np.ndarray], int, int]:
    """The star steps as the stage runs them: each edge stays with its holder (at first the partition
    of its higher end, as an owner holds its members' edges), each node is a row from each holder
    combined in its own partition, and a holder settles a star only when told about a centre it
    reported. Returns the settled {node: root}, the edges left, the last step with edges, and the
    most rows one node's partition received for it in a round."""
    lo, hi = np.minimum(u, v), np.maximum(u, v)
    holder = node_partition(hi, partitions)
    zero = np.zeros(len(lo))
    # The first step where the edges are made: each holder has every lower edge of its nodes.
    held = {
        p: first_small_star(lo[holder == p], hi[holder == p], zero[holder == p], zero[holder == p]) for p in range(partitions)
    }
    reported: dict[int, tuple] = {}  # holder -> its checks of the step before
    settled: dict[int, int] = {}
    when: dict[int, int] = {}  # the step each node was settled in
    busy = most = 0
    left: list[tuple[np.ndarray, np.ndarray]] = []
    for j in range(1, steps + 2):  # the edges after step j, as the stage's even round 2j + 2 holds them
        partials = [neighbour_partials(*e) for e in held.values()]
        node = np.concatenate([x[0] for x in partials])
        if len(node):
            most = max(most, int(np.unique(node, return_counts=True)[1].max()))  # rows per node: one per holder
            busy = j
        agg = Aggregates(*combine_partials(*(np.concatenate([x[i] for x in partials]) for i in range(4))))
        whole = survivor = np.empty(0, np.int64)
        if reported:
            whole, survivor = settled_centres(*(np.concatenate([c[i] for c in reported.values()]) for i in range(4)))
        now: dict[int, tuple] = {}
        for p, (low, high, rl, rh) in held.items():
            told = np.intersect1d(whole, reported[p][0]) if p in reported else whole[:0]  # the centres it reported
            done = np.isin(low, told)
            assert not np.isin(low[~done], whole).any()  # every holder of a settled star's edges is told
            for c, m in zip(low[done].tolist(), high[done].tolist()):
                root = int(survivor[np.searchsorted(whole, c)])
                # A leaf may be held by two holders, but it is settled in one step, in one star.
                assert settled.setdefault(m, root) == root and when.setdefault(m, j) == j
                settled[c] = root
            low, high, rl, rh = low[~done], high[~done], rl[~done], rh[~done]
            if j > steps:
                left.append((low, high))
                held[p] = (low[:0], high[:0], rl[:0], rh[:0])
                continue
            now[p] = star_checks(low, high, rl, rh, agg)
            held[p] = (low, high, rl, rh) if j == steps else star_step(low, high, rl, rh, agg, large=j % 2 == 1)
        reported = now
    left_u = np.concatenate([x[0] for x in left]) if left else np.empty(0, np.int64)
    left_v = np.concatenate([x[1] for x in left]) if left else np.empty(0, np.int64)
    return settled, (left_u, left_v), busy, most


def _components(u: np.ndarray, v: np.ndarray) -> dict[int, int]:
    ids, uf = union_of(u, v)
    return dict(zip(ids.tolist(), ids[uf.roots()].tolist())) if len(ids) else {}


@pytest.mark.parametrize("seed", range(6))
def test_star_steps_find_every_component_of_random_graphs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 3000))
    m = int(rng.integers(n // 4, 2 * n))
    # Sparse row keys (shard << 32 | row), as the stage sees them.
    u = rng.integers(0, 6, m).astype(np.int64) << ROW_KEY_SHIFT | rng.integers(0, n, m)
    v = rng.integers(0, 6, m).astype(np.int64) << ROW_KEY_SHIFT | rng.integers(0, n, m)
    keep = u != v
    partitions = int(rng.integers(1, 17))
    settled, (left_u, _), busy, most = star_steps(u[keep], v[keep], partitions, steps=16)
    assert settled == _components(u[keep], v[keep]) and len(left_u) == 0
    assert busy >= 3 and most <= partitions  # several steps; a node is at most a row per holder


def test_a_node_of_many_edges_is_a_row_per_holder() -> None:
    """A boilerplate page's cluster: 20,000 copies under one head, and a second head, across 8
    holders. The textbook steps gather the head's 20,000 edges in one task; here its partition gets
    a row from each holder, and the cluster still settles whole."""
    head, other = 5, 9
    copies = np.arange(100, 20_100, dtype=np.int64)
    u = np.concatenate([np.full(len(copies), head), np.full(50, other), [head]])
    v = np.concatenate([copies, copies[:50], [other]])
    settled, (left_u, _), busy, most = star_steps(u, v, partitions=8, steps=8)
    assert not len(left_u) and set(settled.values()) == {head} and len(settled) == len(copies) + 2
    assert most <= 8


@pytest.mark.parametrize(("length", "steps"), [(2, 2), (60, 16), (500, 20), (300, 6), (1000, 4)])
def test_a_chain_needs_steps_and_what_they_leave_is_finished_by_union_find(length: int, steps: int) -> None:
    """A chain of copies in run order (the slowest case for star steps): with enough steps every
    cluster is settled by the partitions; with too few, the settled part and the union-find over the
    edges left (what the combine step does) together still give exactly the components."""
    chain = np.arange(length, dtype=np.int64) * 7 + 3
    settled, (left_u, left_v), busy, _ = star_steps(chain[:-1], chain[1:], partitions=5, steps=steps)
    left = _components(left_u, left_v)
    assert not set(settled) & set(left)
    assert {**settled, **left} == {int(x): 3 for x in chain}
    if length == 2:
        assert busy == 2  # one edge: a star at once, known whole after one step
    if steps >= 16:
        assert busy >= 12 and not left  # many steps, all of them needed and enough
    if steps < 8 and length >= 300:
        assert len(left_u) > 0  # not enough steps: the combine step has work


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


def map_tasks(spec: RunSpec, segment: Segment) -> None:
    """The segment's map tasks, in this process, with their markers (the rounds are planned from them)."""
    run_here(spec, segment_phases(spec, segment)[:1])


def _global_step(spec: RunSpec, segment: Segment) -> tuple[dict, dict, list[int]]:
    """Every round (its merges and partition tasks, as the engine runs them) and the combine step; the
    decisions {id: (dup_of, dup_cluster, detail)}, the survivors' {row_key: dup_count} the map tasks
    after it read, and rows in per round. Run again with another spec (a survivor rule), it starts over
    from the map outputs."""
    markers = Path(spec.root) / "_work" / "markers"
    for done in markers.iterdir() if markers.is_dir() else ():
        if not done.name.startswith("map"):
            shutil.rmtree(done)
    run_here(spec, segment_phases(spec, segment, map_phase_too=False))
    folder = RunFolder(Path(spec.root))
    step = step_of(build_stage(spec, segment.compute_global), PartitionStep)
    assert step is not None
    rows_in = [
        sum(m["rows_in"] for m in folder.markers.read_all(shuffle_phase(segment.index, r)).values()) for r in range(step.rounds)
    ]
    decisions, sizes = {}, {}
    for s in spec.shards:
        for table in (
            shard_outputs(spec, segment, s.ordinal),
            pq.read_table(p) if (p := WorkFiles(folder).decisions_file(segment.index, s.key)).exists() else None,
        ):
            for r in table.to_pylist() if table is not None else []:
                assert r["id"] not in decisions  # one decision per document
                decisions[r["id"]] = (r["dup_of"], r["dup_cluster"], r["detail"])
        for table in (
            shard_outputs(spec, segment, s.ordinal, "state"),
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
    map_tasks(spec, segment)
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
    return any(WorkFiles(folder).forward_file(0, step.rounds - 1, 0).parent.glob("*.parquet"))


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


@pytest.mark.parametrize(("star_steps", "survivor"), [(24, "longest"), (2, "earliest"), (4, "longest")])
def test_a_chain_of_copies_settles_in_rounds_or_in_the_combine_step(
    tmp_path: Path, monkeypatch, star_steps: int, survivor: str
) -> None:
    monkeypatch.setattr(MinHashDedup, "star_steps", star_steps)
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
    map_tasks(spec, segment)
    got, sizes, rows_in = _global_step(spec, segment)
    expected, expected_sizes = _in_memory(spec, segment, survivor)
    assert got == expected and sizes == expected_sizes
    assert max(expected_sizes.values()) >= 60  # a long cluster: the chain held together
    left_open = _left_open(spec)
    if star_steps == 24:
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
    assert 3 <= busy < rounds and all(ran[:busy]) and not any(ran[busy:])  # a prefix of the rounds, then none
    assert sorted(p.name for p in (out / "_work" / "markers").iterdir() if p.name.startswith("shuffle")) == sorted(
        ["shuffle0"] + [f"shuffle0r{r}" for r in range(1, busy)]
    )
    kept = {r["path"].removesuffix(".html"): r["dup_count"] for r in pq.read_table(out / "docs").to_pylist()}
    assert kept == {"deu_1901": 2, "eng": 1, "ron_1953": 3, "fra": 1, "cmn_hans": 2}  # sizes from the partitions
    again = run_pipeline(pipeline, output=out, show_progress=False, log=lambda _: None, in_process=True)
    assert again.executed_tasks == 0
