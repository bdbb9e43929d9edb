"""Character classes of CJK text, defined once as code-point ranges.

Every user derives what it needs from these ranges: a regex character class (``regex_class``, valid
in Python ``re`` and in RE2/Arrow), a lookup table over all code points (``table``) for numpy and
numba kernels, or the code points themselves. So langid's script counts, the Chinese quality rules,
dedup shingles and folding, decontamination n-grams, the classifier's featuriser, the tokenizer
trainer's language guess and license-text words agree on what a Han character is.

The classes follow the Unicode Script property (Scripts.txt, 15.1) by whole blocks: a block's
unassigned code points are included (they never occur in real text, and a block bound does not move
when Unicode assigns more), so every class is a superset of RE2's ``\\p{Han}``, ``\\p{Hiragana}`` /
``\\p{Katakana}`` and ``\\p{Hangul}`` restricted to the blocks below (tests/text/test_charclass.py checks
it over all code points). This module imports only numpy: stages, dedup and kernels all import it.
"""

from __future__ import annotations

import re

import numpy as np

Ranges = tuple[tuple[int, int], ...]  # inclusive (first, last) code points, sorted, not overlapping

CODE_POINTS = 0x110000


def union(*classes: Ranges) -> Ranges:
    """One sorted range list covering every code point of ``classes`` (adjacent ranges merged)."""
    out: list[list[int]] = []
    for lo, hi in sorted(r for c in classes for r in c):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


# The CJK unified and compatibility ideograph blocks: Han characters proper, no marks or radicals.
HAN_IDEOGRAPHS: Ranges = (
    (0x3400, 0x4DBF),  # CJK unified ideographs extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0x20000, 0x3FFFF),  # planes 2 and 3: extensions B-I, compatibility supplement (ideographs only)
)
# Han script (Script=Han): the ideographs, the radicals, and the marks and numerals that are Han.
HAN_RADICALS: Ranges = ((0x2E80, 0x2FDF),)  # CJK radicals supplement, Kangxi radicals (NFKC: ideographs)
HAN_MARKS: Ranges = (
    (0x3005, 0x3005),  # 々 ideographic iteration mark
    (0x3007, 0x3007),  # 〇 ideographic zero (二〇一九年)
    (0x3021, 0x3029),  # Hangzhou numerals
    (0x3038, 0x303B),  # Hangzhou numerals 10-30, vertical iteration mark
    (0x16FE2, 0x16FE3),  # Old Chinese hook and iteration marks
    (0x16FF0, 0x16FF1),  # Vietnamese alternate reading marks
)
HAN: Ranges = union(HAN_IDEOGRAPHS, HAN_RADICALS, HAN_MARKS)
# Hiragana and katakana, with the marks of their blocks (ー, ・, voicing marks) and half-width katakana.
KANA: Ranges = (
    (0x3040, 0x309F),  # Hiragana
    (0x30A0, 0x30FF),  # Katakana
    (0x31F0, 0x31FF),  # Katakana phonetic extensions
    (0xFF66, 0xFF9F),  # half-width katakana
    (0x1AFF0, 0x1B16F),  # kana extended A/B, kana supplement (hentaigana), small kana extension
)
HANGUL: Ranges = (
    (0x1100, 0x11FF),  # Hangul jamo
    (0x3130, 0x318F),  # Hangul compatibility jamo
    (0xA960, 0xA97F),  # Hangul jamo extended A
    (0xAC00, 0xD7FF),  # Hangul syllables, jamo extended B
    (0xFFA0, 0xFFDC),  # half-width Hangul
)
BOPOMOFO: Ranges = ((0x3100, 0x312F), (0x31A0, 0x31BF))
# Scripts other than CJK that are written without spaces between words.
THAI_LAO: Ranges = ((0x0E00, 0x0EFF),)
MYANMAR: Ranges = ((0x1000, 0x109F),)
KHMER: Ranges = ((0x1780, 0x17FF),)


def regex_class(ranges: Ranges) -> str:
    """The inside of a ``[...]`` character class for ``ranges``, valid in Python ``re`` and RE2."""

    def one(c: int) -> str:
        return re.escape(chr(c))

    return "".join(one(lo) if lo == hi else f"{one(lo)}-{one(hi)}" for lo, hi in ranges)


def code_points(ranges: Ranges) -> np.ndarray:
    """Every code point of ``ranges``, ascending (int64)."""
    return np.concatenate([np.arange(lo, hi + 1, dtype=np.int64) for lo, hi in ranges]) if ranges else np.empty(0, np.int64)


def mask(ranges: Ranges, size: int = CODE_POINTS) -> np.ndarray:
    """bool per code point below ``size``: in ``ranges``."""
    out = np.zeros(size, np.bool_)
    for lo, hi in ranges:
        out[lo : min(hi, size - 1) + 1] = True
    return out


def table(classes: list[tuple[Ranges, int]], size: int = CODE_POINTS, dtype: type = np.uint8) -> np.ndarray:
    """A lookup table over code points below ``size``: each class's value, 0 elsewhere (later classes win)."""
    out: np.ndarray = np.zeros(size, dtype)
    for ranges, value in classes:
        out[mask(ranges, size)] = value
    return out
