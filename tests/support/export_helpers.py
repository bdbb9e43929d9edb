"""A small real run for export and training-example tests, built once per test process.

Sources ``zh`` and ``en``: the first lines of the shared corpus's zh and en Wikipedia files
(two input files each, so the run has several map shards per source), a length filter, and
tokenization with the repository's demo tokenizer into concat-packed shards (seq_len 128, 10%
val). ``expected_documents`` gives what every export must hold, computed independently of
the export code: the kept documents from ``docs/`` and their tokens re-encoded here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.conftest import write_pipeline
from tests.support.shared_data import PROJECT_ROOT, shared_path

TOKENIZER = PROJECT_ROOT / "tokenizer" / "demo.json"
LINES = {"zh": ("zh_wikipedia.jsonl", 160), "en": ("en_wikipedia.jsonl", 160)}
MIXTURE = {"zh": 0.7, "en": 0.3}
_BUILT: dict[str, Path] = {}


def build_real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if "run" in _BUILT:
        return _BUILT["run"]
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    root = tmp_path_factory.mktemp("real_run")
    data = root / "data"
    data.mkdir()
    for source, (name, n) in LINES.items():
        with shared_path("corpus", name).open(encoding="utf-8") as f:
            lines = [next(f) for _ in range(n)]
        half = n // 2
        for k, chunk in enumerate((lines[:half], lines[half:])):
            # Long articles are cut so that the run stays small; the text is still real.
            rows = [{**json.loads(line), "text": json.loads(line)["text"][:1500]} for line in chunk]
            (data / f"{source}-{k}.jsonl").write_text(
                "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8"
            )
    pipeline = write_pipeline(
        root,
        {
            "name": "export_test",
            "sources": [{"name": s, "kind": "web", "paths": [f"data/{s}-*.jsonl"]} for s in LINES],
            "stages": [{"length": {"min_chars": 40}}, {"dedup": {"exact": True}}],
            "tokenize": {"tokenizer": str(TOKENIZER), "seq_len": 128, "val_fraction": 0.1, "rows_per_shard": 16},
            "mixture": MIXTURE,
        },
    )
    out = root / "run"
    run_pipeline(load_pipeline(pipeline), output=out, num_cpus=2, show_progress=False, log=lambda m: None)
    _BUILT["run"] = out
    return out


def expected_documents(run: Path) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(source, split) -> kept documents in run order with id, text and their tokens (EOS included)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER))
    eos = tok.token_to_id("<|endoftext|>")
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for source in LINES:
        for f in sorted((run / "docs" / source).glob("*.parquet")):
            for row in pq.read_table(f, columns=["id", "text", "split", "n_tokens"]).to_pylist():
                ids = tok.encode(row["text"], add_special_tokens=False).ids + [eos]
                assert len(ids) == row["n_tokens"]
                out.setdefault((source, row["split"]), []).append({**row, "input_ids": ids})
    return out
