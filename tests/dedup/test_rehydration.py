"""Rehydration weights: minhash keeps each survivor's cluster size (dup_count) on the real UDHR pages,
whose variants (German 1901/1996 spelling, Romanian 1953/1993/2006, Simplified/Traditional Chinese)
are natural near-duplicates. Runs the engine's tasks in process (no Ray)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from datapipe.engine.phases import plan_phases, run_here
from datapipe.engine.plan import make_spec
from datapipe.pipeline.load import load_pipeline
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
    # The map tasks, round 0 pairing the pages, the star rounds settling the clusters, the merges, the
    # combine step, and the map tasks after them, as the engine runs them (in this process).
    run_here(spec, plan_phases(spec))
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
