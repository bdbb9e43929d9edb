"""`datapipe train-tokenizer`: sampling by mix, special tokens, round trip, chars/token on held-out text."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from datapipe.cli import main
from datapipe.pipeline.load import TokenizeConfig
from datapipe.tokens.encode import load_tokenizer_info
from datapipe.train.tokenizer import (
    Doc,
    TrainOptions,
    docs_from_files,
    docs_from_run,
    parse_mix,
    sample,
    train_tokenizer,
)
from tests.support.shared_data import PROJECT_ROOT, shared_path


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
        return [
            "train-tokenizer",
            "--files",
            str(corpus / "*.jsonl"),
            str(PROJECT_ROOT / "datapipe" / "**" / "*.py"),
            "--output",
            str(out),
            "--vocab-size",
            "2000",
            "--sample-chars",
            "300000",
            "--heldout-frac",
            "0.1",
            "--special",
            "<|user|>",
            "--special",
            "<|assistant|>",
        ]

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
    for text in (
        "维基百科是一个自由的百科全书。",
        "The quick brown fox 🦊 jumps.",
        "def f(x):\n\treturn x ** 2\n",
        "混合 mixed テキスト Ω ∑ \x00 end",
    ):
        assert tok.decode(tok.encode(text).ids) == text
    # Any pipeline accepts it: EOS and PAD are found by name; the vocabulary fits uint16.
    info = load_tokenizer_info(out, TokenizeConfig(tokenizer=str(out), bos_token="<|bos|>"))
    assert (info.eos_id, info.pad_id, info.bos_id, info.dtype) == (0, 1, 2, "uint16")

    again = tmp_path / "again.json"
    assert CliRunner().invoke(main, args(again)).exit_code == 0
    assert again.read_bytes() == out.read_bytes()  # same inputs, same tokenizer


def test_cli_prints_progress_lines_while_it_samples_and_trains(corpus: Path, tmp_path: Path) -> None:
    """Sampling and training a real vocabulary take minutes: progress lines on stderr at an interval
    (0.02 s here, so a second of work has some), never in the result on stdout."""
    args = ["train-tokenizer", "--files", str(corpus / "*.jsonl"), "--output", str(tmp_path / "t.json")]
    args += ["--vocab-size", "1000", "--sample-chars", "200000", "--mix", "zh=0.5,en=0.5"]
    result = CliRunner().invoke(main, args, env={"DATAPIPE_PROGRESS_INTERVAL": "0.02"})
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("train-tokenizer:")]
    step = r"(sampling|training on \S+ chars of them|measuring chars per token on the held-out documents)"
    assert lines and all(
        re.fullmatch(rf"train-tokenizer: [\d,]+ documents \(\S+ chars\) read; {step}, \d+s elapsed", x) for x in lines
    )
    assert "train-tokenizer:" not in result.stdout


def test_sampling_follows_the_mix_and_holds_back_documents() -> None:
    docs = (
        [Doc(f"zh{i}", "zh", f"{i:05d}" + "中" * 95) for i in range(2000)]
        + [Doc(f"en{i}", "en", f"{i:05d}" + "e" * 95) for i in range(2000)]
        + [Doc(f"fr{i}", "fr", "f" * 100) for i in range(50)]
    )
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
    pq.write_table(
        pa.table(
            {
                "id": ["a", "b", "c", "d"],
                "kind": ["web", "web", "code", "web"],
                "lang": ["zh", "en", None, None],
                "text": ["中文", "english", "x = 1", "汉字汉字"],
            }
        ),
        folder / "s.parquet",
    )
    assert [(d.id, d.group) for d in docs_from_run(tmp_path / "run")] == [("a", "zh"), ("b", "en"), ("c", "code"), ("d", "zh")]


def test_bad_mix_and_empty_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="GROUP=WEIGHT"):
        parse_mix("zh:0.5")
    with pytest.raises(ValueError, match="no documents"):
        train_tokenizer(iter([Doc("x", "fr", "bonjour")]), tmp_path / "t.json", TrainOptions(mix={"zh": 1.0}))
    result = CliRunner().invoke(main, ["train-tokenizer", "--output", str(tmp_path / "t.json")])
    assert result.exit_code == 2 and "exactly one of --run" in result.output


def test_mix_a_group_cannot_fill_warns_and_records_what_was_used(tmp_path: Path) -> None:
    """zh=0.5,en=0.5 over all of the real zh Wikipedia file (~0.93M characters) and 2,000 en articles:
    zh cannot fill its 1.2M share; the output and NAME.train.json say what each group got."""
    import json

    zh = shared_path("corpus", "zh_wikipedia.jsonl")
    with shared_path("corpus", "en_wikipedia.jsonl").open(encoding="utf-8") as f:
        (tmp_path / "en.jsonl").write_text("".join(next(f) for _ in range(2000)), encoding="utf-8")
    out = tmp_path / "tok" / "zh_en.json"
    result = CliRunner().invoke(
        main,
        [
            "train-tokenizer",
            "--files",
            str(zh),
            str(tmp_path / "en.jsonl"),
            "--output",
            str(out),
            "--vocab-size",
            "400",
            "--mix",
            "zh=0.5,en=0.5",
            "--sample-chars",
            "2400000",
        ],
    )
    assert result.exit_code == 0, result.output
    info = json.loads(out.with_suffix(".train.json").read_text())
    groups = {g["group"]: g for g in info["groups"]}
    assert groups["zh"]["target_chars"] == groups["en"]["target_chars"] == 1_200_000
    assert not groups["zh"]["filled"] and groups["en"]["filled"]
    assert 800_000 < groups["zh"]["train_chars"] < 1_000_000 and groups["en"]["train_chars"] >= 1_200_000
    assert info["train_chars"] == groups["zh"]["train_chars"] + groups["en"]["train_chars"]
    assert groups["zh"]["share"] == pytest.approx(groups["zh"]["train_chars"] / info["train_chars"])
    assert groups["zh"]["share"] < 0.45 and groups["zh"]["share"] + groups["en"]["share"] == pytest.approx(1.0)
    zh_chars = groups["zh"]["train_chars"]
    assert (
        f"warning: group zh: only {zh_chars:,} characters ({groups['zh']['train_docs']:,} documents) to train on, "
        f"short of its share 0.50 x 2,400,000 = 1,200,000"
    ) in result.stderr
    shares = f"zh {groups['zh']['share']:.2f}, en {groups['en']['share']:.2f}"
    assert f"warning: trained on shares {shares} instead of zh 0.50, en 0.50" in result.stderr
    assert info["warnings"] and all(w in result.stderr for w in info["warnings"])
    row = next(line for line in result.stdout.splitlines() if line.startswith("zh "))
    assert f"{zh_chars:,}" in row and f"{groups['zh']['share']:.2f}" in row
    # The advice holds: at the suggested sample size both groups fill their half.
    advice = re.search(r"lower --sample-chars to ([\d,]+)", result.stderr)
    assert advice, result.stderr
    fits = int(advice.group(1).replace(",", ""))
    docs = docs_from_files([str(zh), str(tmp_path / "en.jsonl")])
    train, _ = sample(docs, TrainOptions(mix={"zh": 0.5, "en": 0.5}, sample_chars=fits))
    chars = {g: sum(map(len, t)) for g, t in train.items()}
    assert chars["zh"] >= fits // 2 and chars["en"] >= fits // 2


def test_mix_that_fills_has_no_warning(corpus: Path, tmp_path: Path) -> None:
    docs = list(docs_from_files([str(corpus / "*.jsonl")]))
    out = tmp_path / "t.json"
    result = train_tokenizer(iter(docs), out, TrainOptions(vocab_size=300, mix={"zh": 0.5, "en": 0.5}, sample_chars=100_000))
    assert result.warnings == [] and all(g.filled for g in result.groups)
    assert sum(g.share for g in result.groups) == pytest.approx(1.0)
