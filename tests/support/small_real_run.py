"""A small real-data run for the "complete means complete" tests (issue 37): English data-juicer
excerpts and Chinese Wikipedia, length and exact dedup (so the run has a shuffle and a second map
segment: intermediates in ``_work/``), tokenized and packed: ~3 s in process on 2 cores.

``real_pipeline`` writes the pipeline file; ``run_in_process`` runs it; ``output_digests`` is
what a user gets (every shard byte, every docs and rejected file, the documents table), to compare
a repaired run with a clean one.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from tests.support.shared_data import PROJECT_ROOT, shared_path


def real_config(output: str | None = None, en: list[str] | None = None) -> dict[str, Any]:
    en_paths = en if en is not None else [str(p) for p in sorted(shared_path("en").glob("datajuicer_*.jsonl"))]
    config: dict[str, Any] = {
        "name": "complete_real",
        "sources": [
            {"name": "en", "kind": "web", "paths": en_paths},
            {"name": "zh", "kind": "web", "paths": [str(shared_path("corpus", "zh_wikipedia.jsonl"))]},
        ],
        "stages": [{"length": {"min_chars": 50}}, {"dedup": {"exact": True}}],
        "tokenize": {"tokenizer": str(PROJECT_ROOT / "tokenizer" / "demo.json"), "seq_len": 256, "rows_per_shard": 64},
    }
    if output is not None:
        config["output"] = output
    return config


def real_pipeline(folder: Path, output: str | None = None, en: list[str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "complete_real.yaml"
    path.write_text(yaml.safe_dump(real_config(output, en), allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def run_in_process(pipeline: Path, output: Path | str | None = None, **kw: Any):
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    return run_pipeline(
        load_pipeline(pipeline), output=output, in_process=True, show_progress=False, log=kw.pop("log", lambda _: None), **kw
    )


def output_digests(root: Path) -> dict[str, Any]:
    """sha256 of every shard, docs and rejected file, the manifest's rows and the documents table."""
    import pyarrow.parquet as pq

    from datapipe.audit.sql import connect as connect_stats

    files = {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for folder in ("shards", "docs", "rejected")
        for p in sorted((root / folder).rglob("*"))
        if p.is_file() and p.name != "manifest.parquet"
    }
    with connect_stats(root) as con:
        table = con.execute("select id, status, stage, reason, n_tokens from documents order by id").fetchall()
    manifest = pq.read_table(root / "shards" / "manifest.parquet").sort_by("path").to_pylist()
    return {"files": files, "documents": table, "manifest": manifest}
