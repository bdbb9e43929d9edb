"""Digests of two complete runs, so a refactor can prove it changed nothing a user sees.

The demo pipeline (project data) and a real-data pipeline (Common Crawl WARC and WET, UDHR pages,
Chinese Wikipedia, the real LaTeX paper; every stage the product has, best-fit packing) run in
process; what is compared is every byte of every token shard and every value of the ``documents``
table in ``stats.duckdb`` (ordered by id), one digest per shard file and per column, so a
mismatch names the file or column that moved.

    python -m tests.support.golden_outputs --write   # record, at a commit whose outputs are known good

``tests/data/golden_outputs.json`` also records the library versions it was made with: Arrow and
the tokenizer own the bytes, so a different pyarrow or tokenizers may change them legitimately
(the test says so when it fails under other versions).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden_outputs.json"
VERSIONED = ("pyarrow", "tokenizers", "duckdb", "fasttext-numpy2", "datasketch", "numpy")


def real_data_pipeline(shared: Path, folder: Path) -> Path:
    """A pipeline over real shared data with every stage, written into ``folder``."""
    udhr = shared / "web" / "html" / "udhr"
    config = {
        "name": "golden_real",
        "sources": [
            {
                "name": "cc",
                "kind": "web",
                "paths": [
                    str(shared / "web" / "warc" / "whirlwind_whirlwind.warc.gz"),
                    str(shared / "web" / "warc" / "whirlwind_whirlwind.warc.wet.gz"),
                ],
            },
            {
                "name": "udhr",
                "kind": "web",
                "paths": [
                    str(udhr / f"{n}.html")
                    for n in ("cmn_hans", "cmn_hans_beijing", "cmn_hans_tianjin", "cmn_hant", "eng", "jpn", "kor", "yue")
                ],
            },
            {"name": "zh_wiki", "kind": "web", "paths": [str(shared / "corpus" / "zh_wikipedia.jsonl")]},
            {"name": "paper", "kind": "paper", "paths": [str(shared / "papers" / "conv_arithmetic" / "conv_arithmetic.tex")]},
        ],
        "stages": [
            {"langid": {"keep": ["zh", "en"], "min_score": 0.5}},
            {"length": {"min_chars": 20}},
            {"quality": {"rules": "auto"}},
            {"pii": {}},
            {"dedup": {"exact": True}},
            {"minhash": {"threshold": 0.7, "fold_script": True}},
            {"license": {"policy": {"web": {"deny": ["non_commercial", "no_derivatives"]}}}},
        ],
        "tokenize": {
            "tokenizer": str(ROOT / "tokenizer" / "demo.json"),
            "seq_len": 256,
            "val_fraction": 0.05,
            "rows_per_shard": 128,
            "packing": "bestfit",
            "bestfit_window": 64,
        },
    }
    path = folder / "golden_real.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def run_digests(pipeline_file: Path, output: Path) -> dict[str, Any]:
    """Run ``pipeline_file`` in process into ``output``; the digests of its shards and documents."""
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    run_pipeline(load_pipeline(pipeline_file), output=output, show_progress=False, log=lambda _: None, in_process=True)
    return output_digests(output)


def output_digests(output: Path) -> dict[str, Any]:
    """The digests of a finished run folder's shards and documents table, however it was run."""
    from datapipe.audit.sql import connect as connect_stats

    shards = {
        p.relative_to(output).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((output / "shards").rglob("*"))
        if p.is_file()
    }
    with connect_stats(output) as con:
        table = con.sql("SELECT * FROM documents ORDER BY id").to_arrow_table()
    columns = {
        name: hashlib.sha256(
            json.dumps(table.column(name).to_pylist(), ensure_ascii=False, sort_keys=True, default=str).encode()
        ).hexdigest()
        for name in table.column_names
    }
    return {"documents": table.num_rows, "shards": shards, "columns": columns}


def versions() -> dict[str, str]:
    return {name: metadata.version(name) for name in VERSIONED}


def all_digests(shared: Path, work: Path) -> dict[str, Any]:
    out = {"demo": run_digests(ROOT / "pipelines" / "demo.yaml", work / "demo")}
    out["real"] = run_digests(real_data_pipeline(shared, work), work / "real")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"record the digests in {GOLDEN}")
    args = parser.parse_args(argv)
    shared = ROOT.parent / "shared" / "data"
    if not shared.is_dir():
        print(f"error: the shared data folder {shared} is missing", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
        digests = {"versions": versions(), **all_digests(shared, Path(tmp))}
    text = json.dumps(digests, indent=1, sort_keys=True) + "\n"
    if args.write:
        GOLDEN.write_text(text, encoding="utf-8")
        print(f"wrote {GOLDEN}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
