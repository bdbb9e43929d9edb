"""Chinese web rules: character-based, since Chinese has no spaces to count words by.

Lengths are non-whitespace characters; repetition is Gopher's, over characters instead of
words (``zh_repetition``). Thresholds and where they come from are in ``zh_web.yaml``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from datapipe.stages.quality.gopher import repetition, repetition_filter
from datapipe.stages.quality.rules import Filter, Rule, register
from datapipe.stages.quality.text import Docs, ratio

F32 = pa.float32()
# Line ends that close a sentence or a quotation in Chinese and English text.
ZH_LINE_END = r"[。！？…；.!?;][”’」』）)]*$"
BRACKETS = r"[\[\]{}()（）【】《》〈〉「」『』<>]"
SYMBOLS = r"[\p{S}\p{Co}�]"  # symbols (★ ■ ♥ ©, emoji), private use, replacement char


def _zh(docs: Docs, params: dict[str, Any], batch: pa.Table) -> dict[str, np.ndarray]:
    chars = (docs.n_chars - docs.count(r"\s")).astype(np.float64)
    han = docs.count(r"\p{Han}")
    lines = docs.lines
    n_lines = lines.per_doc()
    return {
        "zh_chars": chars.astype(np.int32),
        "zh_han_ratio": ratio(han, chars),
        "zh_line_punct_ratio": ratio(lines.per_doc(lines.matches(ZH_LINE_END)), n_lines),
        # Sentence ends per 100 Han characters: works for one-line pages, where line ends do not,
        # and counts only the prose of pages with code or formulas.
        "zh_terminal_per_100": 100 * ratio(docs.count(r"[。！？…!?]+"), han),
        "zh_bracket_ratio": ratio(docs.count(BRACKETS), chars),
        "zh_digit_ratio": ratio(docs.count(r"\pN"), chars),
        "zh_symbol_ratio": ratio(docs.count(SYMBOLS), chars),
        "zh_mean_line_len": ratio(chars, n_lines),
    }


register(Filter(
    "zh",
    {"zh_chars": pa.int32(), "zh_han_ratio": F32, "zh_line_punct_ratio": F32, "zh_terminal_per_100": F32,
     "zh_bracket_ratio": F32,
     "zh_digit_ratio": F32, "zh_symbol_ratio": F32, "zh_mean_line_len": F32},
    (Rule("too_short", "zh_chars", "min", "min_chars"), Rule("too_long", "zh_chars", "max", "max_chars"),
     Rule("han_ratio", "zh_han_ratio", "min"), Rule("terminal_punct", "zh_terminal_per_100", "min"),
     Rule("line_punct", "zh_line_punct_ratio", "min"),
     Rule("bracket_ratio", "zh_bracket_ratio", "max"), Rule("digit_ratio", "zh_digit_ratio", "max"),
     Rule("symbol_ratio", "zh_symbol_ratio", "max"), Rule("mean_line_len", "zh_mean_line_len", "min")),
    _zh))


def _char_repetition(docs: Docs, params: dict[str, Any], batch: pa.Table) -> dict[str, np.ndarray]:
    cps, doc = docs.chars
    # N-gram repetition of a long page is judged on its first `ngram_chars` characters: machine
    # repetition shows there too, and hashing every character of 50 kB manuals costs 10x more.
    limit = int(params.get("ngram_chars", 5000))
    starts = np.searchsorted(doc, np.arange(docs.n))
    head = (np.arange(len(doc)) - starts[doc]) < limit
    return repetition(docs, "zh_rep", cps[head].astype(np.int64), doc[head], np.ones(int(head.sum())))


repetition_filter("zh_repetition", "zh_rep", _char_repetition, frozenset({"ngram_chars"}))
