"""Gopher quality and repetition rules (Rae et al. 2021, "Scaling Language Models", App. A.1.1).

Words are whitespace tokens, as in the paper. Thresholds live in the rule sets.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datapipe.stages.quality.rules import Filter, Rule, register
from datapipe.stages.quality.text import Docs, duplicates, ngram_repetition, ratio, to_np

try:  # numba is a dependency; the regex path keeps the package importable without it
    from datapipe.stages.quality.charclass import CharClasses
except ImportError:  # pragma: no cover - only where numba is absent
    CharClasses = None  # type: ignore[assignment,misc]

STOP_WORDS = pa.array(["the", "be", "to", "of", "and", "that", "have", "with"])  # the paper's list
F32 = pa.float32()


# Words with a letter, and with a letter or digit: one compiled pass over the words instead of a
# regex scan each (charclass.py; the classes are still these RE2 patterns, so results are equal).
_WORD_CLASSES = CharClasses((r"\pL", r"[\pL\pN]"), (False, False)) if CharClasses is not None else None


def word_classes(words: pa.Array, reference: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(has a letter, has a letter or digit) per word."""
    if _WORD_CLASSES is None or reference:
        return (
            to_np(pc.match_substring_regex(words, r"\pL")).astype(bool),
            to_np(pc.match_substring_regex(words, r"[\pL\pN]")).astype(bool),
        )
    counts = _WORD_CLASSES.counts(words)
    return counts[0] > 0, counts[1] > 0


def _quality(docs: Docs, params: dict[str, Any], batch: pa.Table) -> dict[str, np.ndarray]:
    words, lines = docs.words, docs.lines
    n_words = words.per_doc()
    # What depends on the word alone is computed per distinct word, then looked up for every word.
    ids, distinct = docs.word_ids
    # Mean word length over words with a letter or digit: punctuation tokens are not words.
    alpha, wordish = (c[ids] for c in word_classes(distinct))
    stop = to_np(pc.is_in(pc.utf8_lower(distinct), STOP_WORDS)).astype(np.float64)[ids]
    symbols = docs.byte_counts("#") + docs.count(r"\.\.\.|…")
    n_lines = lines.per_doc()
    return {
        "gopher_words": n_words.astype(np.int32),
        "gopher_mean_word_len": ratio(words.per_doc(docs.word_lengths * wordish), words.per_doc(wordish)),
        "gopher_symbol_ratio": ratio(symbols, n_words),
        "gopher_bullet_lines_frac": ratio(lines.per_doc(lines.matches(r"^[•‣◦▪\-*–·]")), n_lines),
        "gopher_ellipsis_lines_frac": ratio(lines.per_doc(lines.matches(r"(\.\.\.|…)$")), n_lines),
        "gopher_alpha_words_frac": ratio(words.per_doc(alpha), n_words),
        "gopher_stop_words": words.per_doc(stop).astype(np.int32),
    }


register(
    Filter(
        "gopher_quality",
        {
            "gopher_words": pa.int32(),
            "gopher_mean_word_len": F32,
            "gopher_symbol_ratio": F32,
            "gopher_bullet_lines_frac": F32,
            "gopher_ellipsis_lines_frac": F32,
            "gopher_alpha_words_frac": F32,
            "gopher_stop_words": pa.int32(),
        },
        (
            Rule("min_words", "gopher_words", "min"),
            Rule("max_words", "gopher_words", "max"),
            Rule("min_mean_word_len", "gopher_mean_word_len", "min"),
            Rule("max_mean_word_len", "gopher_mean_word_len", "max"),
            Rule("symbol_ratio", "gopher_symbol_ratio", "max"),
            Rule("bullet_lines", "gopher_bullet_lines_frac", "max"),
            Rule("ellipsis_lines", "gopher_ellipsis_lines_frac", "max"),
            Rule("alpha_words", "gopher_alpha_words_frac", "min"),
            Rule("stop_words", "gopher_stop_words", "min"),
        ),
        _quality,
    )
)

TOP_NS = (2, 3, 4)
DUP_NS = (5, 6, 7, 8, 9, 10)


def repetition(docs: Docs, prefix: str, ids: np.ndarray, doc: np.ndarray, weight: np.ndarray) -> dict[str, np.ndarray]:
    """Line, paragraph and n-gram repetition signals over the given tokens (words or characters)."""
    out: dict[str, np.ndarray] = {}
    for unit, pieces in (("line", docs.lines), ("para", docs.paragraphs)):
        dup_n, dup_chars = duplicates(pieces)
        out[f"{prefix}_dup_{unit}_frac"] = ratio(dup_n, pieces.per_doc())
        out[f"{prefix}_dup_{unit}_char_frac"] = ratio(dup_chars, pieces.per_doc(pieces.lengths))
    grams = ngram_repetition(ids, doc, weight, docs.n, TOP_NS, DUP_NS)
    out.update({f"{prefix}_{k}_frac": v for k, v in grams.items()})
    return out


def repetition_filter(
    name: str, prefix: str, compute: Any, settings: frozenset[str] = frozenset(), flags: frozenset[str] = frozenset()
) -> Filter:
    signals = {f"{prefix}_dup_{u}_{w}": F32 for u in ("line", "para") for w in ("frac", "char_frac")}
    signals.update({f"{prefix}_top{n}_frac": F32 for n in TOP_NS})
    signals.update({f"{prefix}_dup{n}_frac": F32 for n in DUP_NS})
    rules = [Rule(k[len(prefix) + 1 :], k, "max") for k in signals]
    return register(Filter(name, signals, tuple(rules), compute, settings | flags, flags))


def _word_repetition(docs: Docs, params: dict[str, Any], batch: pa.Table) -> dict[str, np.ndarray]:
    w = docs.words
    return repetition(docs, "gopher", docs.word_ids[0], w.doc, docs.word_lengths.astype(np.float64))


repetition_filter("gopher_repetition", "gopher", _word_repetition)
