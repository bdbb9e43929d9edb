"""Traditional -> Simplified character folding for dedup (copies across scripts are copies).

A character table, not OpenCC's phrase conversion: dedup needs the same text to fold to the
same characters, not idiomatic Simplified. The table comes from OpenCC's own t2s conversion
of every Han code point (``datapipe.text.charclass.HAN``) one by one (about 5,100 differ), built
once per process (~0.3 s).
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

from datapipe.text import charclass


@lru_cache(maxsize=1)
def t2s_table() -> dict[int, str]:
    import opencc

    # Every assigned Han code point (most of planes 2-3 is unassigned: skipping it halves the
    # time); ~900 of the ~5,100 characters that differ are outside the BMP.
    chars = [chr(c) for c in charclass.code_points(charclass.HAN).tolist() if unicodedata.category(chr(c)) != "Cn"]
    converted = opencc.OpenCC("t2s").convert("\n".join(chars)).split("\n")
    if len(converted) != len(chars):  # a conversion merged characters: fall back to one by one
        cc = opencc.OpenCC("t2s")
        converted = [cc.convert(c) for c in chars]
    return {ord(a): b for a, b in zip(chars, converted) if a != b and len(b) == 1}


def fold_traditional(texts: list[str]) -> list[str]:
    table = t2s_table()
    return [t.translate(table) for t in texts]
