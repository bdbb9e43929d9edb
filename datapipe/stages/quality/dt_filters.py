"""datatrove 0.10.1's English quality filters as datapipe filters: ``datatrove_gopher_repetition``,
``datatrove_gopher_quality``, ``datatrove_c4`` and ``datatrove_fineweb``.

Each computes the quantities datatrove's filter compares (``dt_view.py`` says how words, lines
and C4's rewritten text are made) as float64 signals, so a threshold from the rule set compares
exactly as datatrove's Python floats do. Rules are listed in the order datatrove checks them, so
the first failing rule names the reason datatrove gives. The preset
``filters/quality/presets/fineweb_datatrove.yaml`` sets datatrove's defaults; the quality stage
page lists how these rules differ from datapipe's own ``gopher_*``, ``c4`` and ``fineweb``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from datapipe.stages.quality.dt_view import (
    PUNCTUATION_SET,
    STOP_WORDS,
    TERMINAL_PUNCTUATION,
    find_duplicates,
    view,
)
from datapipe.stages.quality.rules import Filter, Rule, register
from datapipe.stages.quality.text import Docs

F64 = pa.float64()


def _div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den in float64; 0 where den is 0 (datatrove would divide by zero: an earlier rule drops those)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)


# --- GopherRepetitionFilter -------------------------------------------------------------------

_REP_TEXT = ("dup_para_frac", "dup_para_char_frac", "dup_line_frac", "dup_line_char_frac")
_TOP = (2, 3, 4)
_DUP = (5, 6, 7, 8, 9, 10)


def _repetition(docs: Docs, params: dict[str, Any], batch: pa.Table) -> dict[str, np.ndarray]:
    from datapipe.stages.quality.dt_view import _LINE, _PARAGRAPH

    v = view(docs)
    text_len = v.text_lengths
    rows = []
    for text in v.texts:
        paragraphs = _PARAGRAPH.split(text.strip())
        pd, pc = find_duplicates(paragraphs)
        lines = _LINE.split(text)
        ld, lc = find_duplicates(lines)
        rows.append((pd / len(paragraphs), pc, ld / len(lines), lc))
    a = np.array(rows, np.float64).reshape(-1, 4)
    out = {
        "dt_empty": np.array([not t for t in v.texts], bool),
        "dt_dup_para_frac": a[:, 0],
        "dt_dup_para_char_frac": _div(a[:, 1], text_len),
        "dt_dup_line_frac": a[:, 2],
        "dt_dup_line_char_frac": _div(a[:, 3], text_len),
    }
    top, dup = v.ngrams
    for i, n in enumerate(_TOP):
        out[f"dt_top{n}_frac"] = _div(top[i].astype(np.float64), text_len)
    for i, n in enumerate(_DUP):
        out[f"dt_dup{n}_frac"] = _div(dup[i].astype(np.float64), text_len)
    return out


register(
    Filter(
        "datatrove_gopher_repetition",
        {"dt_empty": pa.bool_()}
        | {f"dt_{k}": F64 for k in _REP_TEXT}
        | {f"dt_top{n}_frac": F64 for n in _TOP}
        | {f"dt_dup{n}_frac": F64 for n in _DUP},
        (
            (Rule("empty", "dt_empty", "true"),)
            + tuple(Rule(k, f"dt_{k}", "max") for k in _REP_TEXT)
            + tuple(Rule(f"top_{n}_gram", f"dt_top{n}_frac", "max") for n in _TOP)
            + tuple(Rule(f"duplicated_{n}_n_grams", f"dt_dup{n}_frac", "max") for n in _DUP)
        ),
        _repetition,
    )
)


# --- GopherQualityFilter ----------------------------------------------------------------------


def _has_non_punctuation(word: str) -> bool:
    return any(ch not in PUNCTUATION_SET for ch in word)


def _has_alpha(word: str) -> bool:
    return any(c.isalpha() for c in word)


def _quality(docs: Docs, params: dict[str, Any], batch: pa.Table) -> dict[str, np.ndarray]:
    v = view(docs)
    ids, _, vocab = v.words
    n_words = v.n_words
    non_symbol = v.word_flags(_has_non_punctuation)
    n_non_symbol = v.per_doc(non_symbol)
    hashes, ellipses, bullets, end_ellipses, n_lines = [], [], [], [], []
    for text in v.texts:
        hashes.append(text.count("#"))
        ellipses.append(text.count("...") + text.count("…"))
        lines = text.splitlines()
        bullets.append(sum(s.lstrip().startswith("•") or s.lstrip().startswith("-") for s in lines))
        end_ellipses.append(sum(s.rstrip().endswith("...") or s.rstrip().endswith("…") for s in lines))
        n_lines.append(len(lines))
    stop = v.word_flags(lambda w: w in STOP_WORDS)
    # distinct stop words per document: (document, word id) pairs
    pairs = np.unique(v.word_doc[stop] * max(len(vocab), 1) + ids[stop])
    n_stop = np.bincount(pairs // max(len(vocab), 1), minlength=v.n).astype(np.float64)
    with np.errstate(invalid="ignore"):
        mean_len = v.per_doc(v.word_lengths * non_symbol) / n_non_symbol  # NaN without words: no rule fails
    return {
        "dt_non_symbol_words": n_non_symbol,
        "dt_mean_word_len": mean_len,
        "dt_hash_ratio": _div(np.array(hashes, np.float64), n_words),
        "dt_ellipsis_ratio": _div(np.array(ellipses, np.float64), n_words),
        "dt_bullet_lines_frac": _div(np.array(bullets, np.float64), np.array(n_lines, np.float64)),
        "dt_end_ellipsis_lines_frac": _div(np.array(end_ellipses, np.float64), np.array(n_lines, np.float64)),
        "dt_alpha_words_frac": _div(v.per_doc(v.word_flags(_has_alpha)), n_words),
        "dt_stop_words": n_stop,
    }


register(
    Filter(
        "datatrove_gopher_quality",
        {
            "dt_non_symbol_words": F64,
            "dt_mean_word_len": F64,
            "dt_hash_ratio": F64,
            "dt_ellipsis_ratio": F64,
            "dt_bullet_lines_frac": F64,
            "dt_end_ellipsis_lines_frac": F64,
            "dt_alpha_words_frac": F64,
            "dt_stop_words": F64,
        },
        (
            Rule("short_doc", "dt_non_symbol_words", "min", "min_doc_words"),
            Rule("long_doc", "dt_non_symbol_words", "max", "max_doc_words"),
            Rule("below_avg_threshold", "dt_mean_word_len", "min", "min_avg_word_length"),
            Rule("above_avg_threshold", "dt_mean_word_len", "max", "max_avg_word_length"),
            Rule("too_many_hashes", "dt_hash_ratio", "max", "max_hash_word_ratio"),
            Rule("too_many_ellipsis", "dt_ellipsis_ratio", "max", "max_ellipsis_word_ratio"),
            Rule("too_many_bullets", "dt_bullet_lines_frac", "max", "max_bullet_lines_ratio"),
            Rule("too_many_end_ellipsis", "dt_end_ellipsis_lines_frac", "max", "max_ellipsis_lines_ratio"),
            Rule("below_alpha_threshold", "dt_alpha_words_frac", "min", "min_alpha_words_ratio"),
            Rule("enough_stop_words", "dt_stop_words", "min", "min_stop_words"),
        ),
        _quality,
    )
)


# --- C4QualityFilter ----------------------------------------------------------------------------


def _c4(docs: Docs, params: dict[str, Any], batch: pa.Table) -> dict[str, np.ndarray]:
    passes = view(docs).c4
    return {
        "dt_c4_lorem_ipsum": np.array([p.lorem_ipsum for p in passes], bool),
        "dt_c4_curly_bracket": np.array([p.curly_bracket for p in passes], bool),
        "dt_c4_sentences": np.array([p.sentences for p in passes], np.float64),
    }


register(
    Filter(
        "datatrove_c4",
        {"dt_c4_lorem_ipsum": pa.bool_(), "dt_c4_curly_bracket": pa.bool_(), "dt_c4_sentences": F64},
        (
            Rule("lorem_ipsum", "dt_c4_lorem_ipsum", "true", "filter_lorem_ipsum"),
            Rule("curly_bracket", "dt_c4_curly_bracket", "true", "filter_curly_bracket"),
            Rule("too_few_sentences", "dt_c4_sentences", "min", "min_num_sentences"),
        ),
        _c4,
    )
)


# --- FineWebQualityFilter -------------------------------------------------------------------------


def _fineweb(docs: Docs, params: dict[str, Any], batch: pa.Table) -> dict[str, np.ndarray]:
    """On the text C4QualityFilter leaves (its kept lines), as FineWeb runs after C4 in datatrove's chain."""
    v = view(docs)
    short = params.get("short_line_length", 30)
    rows = []
    for p in v.c4:
        text = "\n".join(p.kept).strip()
        lines = [line for line in text.split("\n") if line.strip() != ""]
        n = len(lines)
        punct = sum(1 for line in lines if line.endswith(TERMINAL_PUNCTUATION))
        n_short = sum(1 for line in lines if len(line) <= short)
        dup_chars = find_duplicates(lines)[1]
        n_words = p.words  # the kept lines' words are the words of "\n".join(kept)
        rows.append(
            (
                n == 0,
                punct / n if n else 0.0,
                n_short / n if n else 0.0,
                dup_chars,
                len(text) - text.count("\n"),
                text.count("\n"),
                n_words,
            )
        )
    a = np.array([r[1:] for r in rows], np.float64).reshape(-1, 6)
    return {
        "dt_fw_empty": np.array([r[0] for r in rows], bool),
        "dt_fw_line_punct_ratio": a[:, 0],
        "dt_fw_short_line_ratio": a[:, 1],
        "dt_fw_char_dup_ratio": _div(a[:, 2], a[:, 3]),
        "dt_fw_newline_ratio": _div(a[:, 4], a[:, 5]),
    }


register(
    Filter(
        "datatrove_fineweb",
        {
            "dt_fw_empty": pa.bool_(),
            "dt_fw_line_punct_ratio": F64,
            "dt_fw_short_line_ratio": F64,
            "dt_fw_char_dup_ratio": F64,
            "dt_fw_newline_ratio": F64,
        },
        (
            Rule("empty", "dt_fw_empty", "true"),
            Rule("line_punct_ratio", "dt_fw_line_punct_ratio", "min", "line_punct_thr"),
            Rule("short_line_ratio", "dt_fw_short_line_ratio", "max", "short_line_thr"),
            Rule("char_dup_ratio", "dt_fw_char_dup_ratio", "max", "char_duplicates_ratio"),
            Rule("list_ratio", "dt_fw_newline_ratio", "max", "new_line_ratio"),
        ),
        _fineweb,
        frozenset({"short_line_length"}),
    )
)
