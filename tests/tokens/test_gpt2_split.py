"""GPT-2's split without its lookahead (datapipe/tokens/gpt2_split.py) gives the lookahead pattern's ids.

The whitespace set is checked against Unicode's White_Space property (what the Rust regex crate's
``\\s`` is, in tiktoken), the marking against a plain-Python reference, and the encoder on real text
against tiktoken run with the lookahead pattern itself, texts built to hit each case included.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import regex

from datapipe.tokens.fast_bpe import FastEncoder, load_plan, probe_text
from datapipe.tokens.gpt2_split import GPT2_PATTERN, SENTINEL, WHITESPACE, WHITESPACE_CHARS, mark_runs
from tests.support.bpe_variants import SPECIAL, train_bpe, with_special_tokens
from tests.support.shared_data import shared_path

_WS = re.escape(WHITESPACE_CHARS)
_REFERENCE = re.compile(f"([{_WS}]+)(?=[{_WS}][^{_WS}])")


def _texts() -> list[str]:
    out = []
    for name in ("zh_wikipedia", "zh_pingcap_docs", "en_wikipedia"):
        with open(shared_path(f"corpus/{name}.jsonl"), encoding="utf-8") as f:
            out += [json.loads(line)["text"][:4000] for line, _ in zip(f, range(150))]
    return out


# Every whitespace character in runs of 1-3 before a word, a digit, punctuation, a Han character,
# another whitespace character, an added token and the end; spaces around code and after newlines.
CASES = [
    f"a{w * k}{nxt}" for w in WHITESPACE_CHARS for k in (1, 2, 3) for nxt in ("b", "7", "!", "中", " b", "\n\nc", SPECIAL[0], "")
] + [
    "def f():\n    return  1\n\n\n\tx",
    "  leading",
    "trailing  ",
    "a \u3000 b\u2028\u2029c",
    f"holds the sentinel {SENTINEL} itself  x",
    f"a  {SENTINEL}b",
    "",
]


def test_the_whitespace_set_is_unicode_white_space() -> None:
    every = "".join(chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c < 0xE000)
    want = set(regex.findall(r"\p{White_Space}", every))
    assert set(WHITESPACE_CHARS) == want
    chars = pa.array(list(every))
    hits = pc.match_substring_regex(chars, f"^[{WHITESPACE}]$").to_numpy(zero_copy_only=False)
    assert set(np.array(list(every))[hits]) == want  # the RE2 class is the same set


def test_marking_equals_the_reference() -> None:
    texts = _texts() + CASES
    assert mark_runs(pa.array(texts)).to_pylist() == [_REFERENCE.sub(r"\1" + SENTINEL, t) for t in texts]
    assert mark_runs(pa.array(["a  b", "x"]).slice(1)).to_pylist() == ["x"]  # a sliced array


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> FastEncoder:
    texts = _texts()
    path = train_bpe(tmp_path_factory.mktemp("tok") / "tok.json", texts[::2], 3000, "bytelevel", SPECIAL[:2])
    plan = load_plan(str(path))
    assert not isinstance(plan, str) and plan.pattern == GPT2_PATTERN
    return FastEncoder(plan)


def test_the_marked_split_gives_the_lookahead_patterns_ids(encoder: FastEncoder) -> None:
    texts = with_special_tokens(_texts()) + CASES + [probe_text()]
    assert encoder._marked_enc is not None
    marked = encoder._marked(texts, None)
    assert marked is not None and sum(m != t for m, t in zip(marked, texts)) > len(texts) // 4  # the path is taken
    # the same plan, read by tiktoken with the lookahead
    want = [encoder._enc.encode_to_numpy(t, allowed_special=frozenset(encoder.plan.added), disallowed_special=()) for t in texts]
    for got in (
        encoder.encode_batch(texts),
        encoder.encode_batch(texts, threads=3),
        encoder.encode_batch(texts, arrow=pa.array(texts)),
    ):
        assert len(got) == len(want)
        for g, w, t in zip(got, want, texts):
            assert g is not None and np.array_equal(g, w), t[:80]


def test_a_batch_with_a_lone_surrogate_takes_the_lookahead_pattern(encoder: FastEncoder) -> None:
    texts = ["ok  then", "bad \ud800  x"]
    assert encoder._marked(texts, None) is None
    got = encoder.encode_batch(texts)
    assert got[1] is None  # as before: tokenizers encodes it
    assert np.array_equal(got[0], encoder._enc.encode_to_numpy(texts[0], disallowed_special=()))


def test_the_demo_tokenizer_takes_the_marked_split() -> None:
    plan = load_plan(str(Path(__file__).resolve().parents[2] / "tokenizer" / "demo.json"))
    assert not isinstance(plan, str)
    assert (FastEncoder(plan)._marked_enc is not None) == (plan.pattern == GPT2_PATTERN and not plan.prefix_space)
