"""`datapipe train-tokenizer`: sampling by mix, special tokens, round trip, chars/token on held-out text."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from datapipe.cli import main
from datapipe.config import TokenizeConfig
from datapipe.tokenize import load_tokenizer_info
from datapipe.tokenizer_train import Doc, TrainOptions, docs_from_run, parse_mix, sample, train_tokenizer
from tests.shared_data import PROJECT_ROOT, shared_path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first documents of the real zh and en Wikipedia files (enough for a small vocabulary, fast)."""
    folder = tmp_path_factory.mktemp("corpus")
    for name, n in (("zh_wikipedia.jsonl", 400), ("en_wikipedia.jsonl", 600)):
        with shared_path("corpus", name).open(encoding="utf-8") as f:
            (folder / name).write_text("".join(next(f) for _ in range(n)), encoding="utf-8")
    return folder


def test_cli_trains_and_reports_chars_per_token(corpus: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    def args(out: Path) -> list[str]:
        return ["train-tokenizer", "--files", str(corpus / "*.jsonl"), str(PROJECT_ROOT / "datapipe" / "**" / "*.py"),
                "--output", str(out), "--vocab-size", "2000", "--sample-chars", "300000", "--heldout-frac", "0.1",
                "--special", "<|user|>", "--special", "<|assistant|>"]

    out = tmp_path / "tok" / "small.json"
    result = CliRunner().invoke(main, args(out))
    assert result.exit_code == 0, result.output
    cpt = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(zh|en|code)\s.*?\s([0-9.]+)$", result.output, re.M)}
    assert set(cpt) == {"zh", "en", "code"}, result.output
    # Byte-level BPE: a Han character is 3 bytes, so Chinese gets fewer characters per token than English.
    assert 0.3 < cpt["zh"] < cpt["en"] and cpt["en"] > 2.0 and cpt["code"] > 1.5

    tok = Tokenizer.from_file(str(out))
    specials = ["<|endoftext|>", "<|pad|>", "<|bos|>", "<|user|>", "<|assistant|>"]
    assert [tok.token_to_id(s) for s in specials] == [0, 1, 2, 3, 4]
    assert tok.encode("<|user|>你好 hello<|endoftext|>").ids[0] == 3
    assert tok.encode("<|user|>你好 hello<|endoftext|>").ids[-1] == 0
    for text in ("维基百科是一个自由的百科全书。", "The quick brown fox 🦊 jumps.", "def f(x):\n\treturn x ** 2\n",
                 "混合 mixed テキスト Ω ∑ \x00 end"):
        assert tok.decode(tok.encode(text).ids) == text
    # Any pipeline accepts it: EOS and PAD are found by name; the vocabulary fits uint16.
    info = load_tokenizer_info(out, TokenizeConfig(tokenizer=str(out), bos_token="<|bos|>"))
    assert (info.eos_id, info.pad_id, info.bos_id, info.dtype) == (0, 1, 2, "uint16")

    again = tmp_path / "again.json"
    assert CliRunner().invoke(main, args(again)).exit_code == 0
    assert again.read_bytes() == out.read_bytes()  # same inputs, same tokenizer


def test_sampling_follows_the_mix_and_holds_back_documents() -> None:
    docs = [Doc(f"zh{i}", "zh", f"{i:05d}" + "中" * 95) for i in range(2000)] + \
           [Doc(f"en{i}", "en", f"{i:05d}" + "e" * 95) for i in range(2000)] + \
           [Doc(f"fr{i}", "fr", "f" * 100) for i in range(50)]
    options = TrainOptions(mix=parse_mix("zh=3,en=1"), sample_chars=80_000, heldout_frac=0.05)
    train, held = sample(iter(docs), options)
    assert set(train) == {"zh", "en"}
    chars = {g: sum(map(len, t)) for g, t in train.items()}
    assert chars["zh"] == 60_000 and chars["en"] == 20_000
    # Held back and trained on are chosen by id hash: disjoint, about 5% held, stable under reordering.
    for g in ("zh", "en"):
        assert held[g] and not set(held[g]) & set(train[g])
    n_held = sum(1 for d in docs[:4000] if d.text in set(held["zh"]) | set(held["en"]))
    assert n_held == len(held["zh"]) + len(held["en"])
    train2, held2 = sample(reversed(docs), options)
    assert train2 == train and held2 == held


def test_docs_from_run_groups_by_lang_and_code_kind(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "docs" / "src"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"id": ["a", "b", "c", "d"], "kind": ["web", "web", "code", "web"],
                             "lang": ["zh", "en", None, None], "text": ["中文", "english", "x = 1", "汉字汉字"]}),
                   folder / "s.parquet")
    assert [(d.id, d.group) for d in docs_from_run(tmp_path / "run")] == \
        [("a", "zh"), ("b", "en"), ("c", "code"), ("d", "zh")]


def test_bad_mix_and_empty_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="GROUP=WEIGHT"):
        parse_mix("zh:0.5")
    with pytest.raises(ValueError, match="no documents"):
        train_tokenizer(iter([Doc("x", "fr", "bonjour")]), tmp_path / "t.json", TrainOptions(mix={"zh": 1.0}))
    result = CliRunner().invoke(main, ["train-tokenizer", "--output", str(tmp_path / "t.json")])
    assert result.exit_code == 2 and "exactly one of --run" in result.output
