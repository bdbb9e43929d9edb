"""Rehydration weights: minhash keeps each survivor's cluster size (dup_count) on the real UDHR pages,
whose variants (German 1901/1996 spelling, Romanian 1953/1993/2006, Simplified/Traditional Chinese)
are natural near-duplicates. Runs the engine's tasks in process (no Ray)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from datapipe.engine.plan import build_stage, make_spec
from datapipe.engine.tasks.map import map_shard
from datapipe.engine.tasks.merge import merge_all_outputs, merge_round
from datapipe.engine.tasks.reduce import reduce_partition, reduce_stage
from datapipe.pipeline.load import load_pipeline
from datapipe.stages import PartitionStep
from datapipe.stages.global_stage import step_of
from tests.conftest import write_pipeline
from tests.support.shared_data import shared_path

PAGES = ["deu_1901", "deu_1996", "eng", "ron_1953", "ron_1993", "ron_2006", "fra", "cmn_hans", "cmn_hant"]


def test_survivors_carry_their_cluster_size_on_real_udhr_variants(tmp_path: Path) -> None:
    udhr = shared_path("web", "html", "udhr")
    pipeline = write_pipeline(
        tmp_path,
        {
            "name": "rehydrate",
            "sources": [{"name": "udhr", "kind": "web", "format": "html", "paths": [str(udhr / f"{p}.html") for p in PAGES]}],
            "stages": [{"minhash": {"threshold": 0.7, "fold_script": True, "partitions": 2}}],
        },
    )
    spec = make_spec(load_pipeline(pipeline), tmp_path / "out", tmp_path / "cache")
    first, last = spec.segments
    for shard in spec.shards:
        map_shard(spec, shard, first)
    step = step_of(build_stage(spec, first.compute_global), PartitionStep)
    assert step is not None
    for r in range(step.rounds):  # round 0 pairs the pages, then the star rounds settle the clusters
        merge_round(spec, first, r)
        for p in range(2):
            reduce_partition(spec, first, p, r)
    reduce_stage(spec, first)
    merge_all_outputs(spec, first)  # the engine's merge phase before the next map tasks
    for shard in spec.shards:
        map_shard(spec, shard, last)
    kept = {
        r["path"].removesuffix(".html"): r["dup_count"]
        for f in (tmp_path / "out" / "docs").glob("**/*.parquet")
        for r in pq.read_table(f).to_pylist()
    }
    rejected = {
        r["path"].removesuffix(".html"): r["dup_of"]
        for f in (tmp_path / "out" / "rejected").glob("**/*.parquet")
        for r in pq.read_table(f).to_pylist()
    }
    assert set(kept) | set(rejected) == set(PAGES) and not set(kept) & set(rejected)
    assert kept == {"deu_1901": 2, "eng": 1, "ron_1953": 3, "fra": 1, "cmn_hans": 2}, (kept, rejected)
    assert sum(kept.values()) == len(PAGES)  # upsampling by dup_count gives back every page's weight
