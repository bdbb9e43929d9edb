"""Traditional -> Simplified character folding for dedup (copies across scripts are copies).

A character table, not OpenCC's phrase conversion: dedup needs the same text to fold to the
same characters, not idiomatic Simplified. The table comes from OpenCC's own t2s conversion
of every Han code point one by one (about 4,000 differ), built once per process (~15 ms).
"""

from __future__ import annotations

from functools import lru_cache

_HAN_BLOCKS = ((0x3400, 0x4DC0), (0x4E00, 0xA000), (0xF900, 0xFB00))


@lru_cache(maxsize=1)
def t2s_table() -> dict[int, str]:
    import opencc

    chars = [chr(c) for lo, hi in _HAN_BLOCKS for c in range(lo, hi)]
    converted = opencc.OpenCC("t2s").convert("\n".join(chars)).split("\n")
    if len(converted) != len(chars):  # a conversion merged characters: fall back to one by one
        cc = opencc.OpenCC("t2s")
        converted = [cc.convert(c) for c in chars]
    return {ord(a): b for a, b in zip(chars, converted) if a != b and len(b) == 1}


def fold_traditional(texts: list[str]) -> list[str]:
    table = t2s_table()
    return [t.translate(table) for t in texts]
