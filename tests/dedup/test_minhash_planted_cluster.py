"""A planted cluster of thousands of near-copies (a real Wikipedia paragraph, a few words changed in
each copy) among real zh/en documents: the stage's rounds, run by the engine's task functions in this
process, keep and drop exactly what a brute-force reference says, and no task of any round gathers
the cluster: a task holds at most a row per holder (partition) and band about any one document or
band key. Before, one task paired a band key's every copy with its head, one held the finished star
(the head and every member's edge) and one settled the cluster from every member's signature.

The reference shares nothing with the stage but the shingles: datasketch's MinHash over
``shingles(text)``, LSH buckets as dicts of band tuples, each bucket's documents paired with its
earliest one and kept where datasketch's Jaccard reaches the threshold, then a union-find."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from datasketch import MinHash

from datapipe.dedup.minhash import DEFAULT_SEED, lsh_params
from datapipe.dedup.shingles import shingle_hash, shingles
from datapipe.engine.phases import run_here, segment_phases, shard_outputs
from datapipe.engine.plan import build_stage, make_spec
from datapipe.engine.work_files import WorkFiles
from datapipe.pipeline.load import load_pipeline
from datapipe.run_folder.layout import RunFolder
from datapipe.stages import PartitionStep
from datapipe.stages.global_stage import step_of
from datapipe.stages.minhash import EDGE, HEAD, LEFT, MinHashDedup
from datapipe.stages.row_keys import row_keys
from tests.conftest import write_pipeline
from tests.support.shared_data import shared_path

COPIES = 1500
PARTITIONS = 8
FILES = 8  # map tasks (one per file), so the owners share the members


def _corpus() -> tuple[list[str], int]:
    """Real documents and the planted copies, shuffled; and how many copies were planted."""
    docs = []
    for name, n in (("en_wikipedia.jsonl", 150), ("zh_wikipedia.jsonl", 150)):
        with shared_path("corpus", name).open(encoding="utf-8") as f:
            texts = [json.loads(line)["text"] for line in f]
        docs += [t for t in texts if len(t) > 300][:n]
    base = next(t for t in docs if len(t.split()) >= 200).split()[:200]
    vocab = sorted({w for t in docs[:150] for w in t.split()})
    rng = random.Random(7)
    for _ in range(COPIES):  # two words changed: Jaccard ~0.9 to the page, ~0.8 between copies
        words = list(base)
        for i in rng.sample(range(len(words)), 2):
            words[i] = rng.choice(vocab)
        docs.append(" ".join(words))
    rng.shuffle(docs)
    return docs, COPIES


def _reference(ids: list[str], texts: list[str], threshold: float = 0.7, num_perm: int = 128) -> tuple[dict, dict]:
    """Brute force in run order: {dropped id: (survivor id, cluster id)} and {survivor id: size}."""
    sigs = []
    permutations = MinHash(num_perm=num_perm, seed=DEFAULT_SEED).permutations  # drawn once, not per document
    for text in texts:
        m = MinHash(num_perm=num_perm, seed=DEFAULT_SEED, hashfunc=shingle_hash, permutations=permutations, scheme="affine32")
        grams = shingles(text)
        m.update_batch(grams)
        sigs.append(m if grams else None)
    bands, rows = lsh_params(threshold, num_perm)
    parent = list(range(len(texts)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for b in range(bands):
        buckets: dict[tuple, list[int]] = {}
        for i, m in enumerate(sigs):
            if m is not None:
                buckets.setdefault(tuple(m.hashvalues[b * rows : (b + 1) * rows]), []).append(i)
        for members in buckets.values():
            head = members[0]  # run order: the earliest document of the bucket
            for i in members[1:]:
                if sigs[i].jaccard(sigs[head]) >= threshold:
                    a, c = find(i), find(head)
                    parent[max(a, c)] = min(a, c)
    clusters: dict[int, list[int]] = {}
    for i in range(len(texts)):
        clusters.setdefault(find(i), []).append(i)
    dropped, sizes = {}, {}
    for root, members in clusters.items():
        if len(members) > 1:
            sizes[ids[root]] = len(members)  # earliest survives: the root, the lowest index
            dropped |= {ids[i]: (ids[root], ids[root]) for i in members if i != root}
    return dropped, sizes


def test_a_planted_cluster_is_settled_as_brute_force_says_with_no_task_holding_it(tmp_path: Path, monkeypatch) -> None:
    docs, copies = _corpus()
    most = {"band key": 0, "document": 0}  # the most rows about one band key, or one document, in one task's input
    reduce = MinHashDedup.reduce_partition

    def counting(self, rows, round=0, inputs=None):  # noqa: A002 (the contract's name)
        if round == 0:
            most["band key"] = max(most["band key"], int(np.unique(rows["key"].to_numpy(), return_counts=True)[1].max()))
        else:  # a row is about its node; an edge about its higher end (a holder holds its members' edges)
            kind = rows["kind"].to_numpy()
            about = np.where(np.isin(kind, [EDGE, LEFT]), rows["nbr"].to_numpy(), rows["node"].to_numpy())
            about = np.where(kind == HEAD, rows["aux"].to_numpy(), about)  # a head's row is about a band key
            pairs = np.stack([kind.astype(np.int64), about])
            most["document"] = max(most["document"], int(np.unique(pairs, axis=1, return_counts=True)[1].max()))
        return reduce(self, rows, round, inputs)

    monkeypatch.setattr(MinHashDedup, "reduce_partition", counting)
    (tmp_path / "data").mkdir()
    for f in range(FILES):
        (tmp_path / "data" / f"part-{f}.jsonl").write_text(
            "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in docs[f::FILES]), encoding="utf-8"
        )
    pipeline = write_pipeline(
        tmp_path,
        {
            "name": "planted",
            "sources": [{"name": "w", "kind": "text", "paths": ["data/*.jsonl"]}],
            "stages": [{"minhash": {"threshold": 0.7, "partitions": PARTITIONS}}],
            "split": {"group_small_files": False},
        },
    )
    spec = make_spec(load_pipeline(pipeline), tmp_path / "out", tmp_path / "cache")
    segment = spec.segments[0]
    folder = RunFolder(Path(spec.root))
    stage = build_stage(spec, segment.compute_global)
    step = step_of(stage, PartitionStep)
    assert step is not None
    run_here(spec, segment_phases(spec, segment))  # its map tasks, every round's merges and partitions, the combine step

    got, sizes = {}, {}
    ids, texts, keys = [], [], []
    for s in spec.shards:
        decided = shard_outputs(spec, segment, s.ordinal)
        for row in decided.to_pylist() if decided is not None else []:
            got[row["id"]] = (row["dup_of"], row["dup_cluster"])
        state = shard_outputs(spec, segment, s.ordinal, "state")
        sizes |= dict(zip(state["row_key"].to_pylist(), state["dup_count"].to_pylist())) if state is not None else {}
        table = pq.read_table(WorkFiles(folder).map_output(segment.index, s.key), columns=["id", "text"])
        ids += table["id"].to_pylist()
        texts += table["text"].to_pylist()
        keys.append(row_keys(s.ordinal, 0, table.num_rows))
    assert not (WorkFiles(folder).decisions_file(segment.index, spec.shards[0].key)).exists()  # the combine step had nothing left
    id_of = dict(zip(np.concatenate(keys).tolist(), ids))
    expected, expected_sizes = _reference(ids, texts)
    assert got == expected
    assert {id_of[k]: n for k, n in sizes.items()} == expected_sizes
    largest = max(expected_sizes.values())
    assert largest >= 0.9 * copies  # the planted copies are one cluster
    # No task gathered the cluster: a band key is a row per map output holding it, a document a row
    # per holder and band at most (a head asked for by each owner of its members, once per band).
    bands, _ = lsh_params(0.7, 128)
    assert most["band key"] <= FILES and most["document"] <= bands * PARTITIONS < largest / 10, most
