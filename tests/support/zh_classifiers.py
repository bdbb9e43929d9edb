"""Two small fastText quality models trained on real zh text (shared corpus) with different
negatives, for the tests of classify's buckets, ensembles and upsampling."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from datapipe.cli import main
from tests.support.shared_data import shared_path

SMALL = ["--dim", "8", "--epoch", "2", "--bucket", "5000", "--max-per-class", "120", "--heldout-frac", "0.1"]


def train_zh_pair(out: Path) -> Path:
    """qa (Wikipedia against TiDB docs) and qb (Wikipedia against OI-wiki pages), trained into ``out``."""
    corpus = shared_path("corpus")
    for name, negative in (("qa", "zh_pingcap_docs.jsonl"), ("qb", "zh_oiwiki.jsonl")):
        args = ["train-classifier", "--name", name, "--out-dir", str(out), *SMALL]
        args += ["--positive", str(corpus / "zh_wikipedia.jsonl"), "--negative", str(corpus / negative)]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
    return out
