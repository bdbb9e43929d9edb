"""NFKC of an Arrow string array, equal to ``pc.utf8_normalize(text, "NFKC")``, mostly by a per-character map.

utf8proc (Arrow's normalizer) decomposes, reorders and recomposes every character of every text,
though the non-ASCII text exact dedup normalizes is mostly Chinese whose only changes are full-width
punctuation (，→ ,) and the ideographic space. A text whose every character is *simple* is its NFKC
character by character, so a compiled pass over its UTF-8 bytes maps it, many times faster; a text
holding any other character goes to utf8proc as before.

A character is simple when it is a starter that nothing composes with and its NFKC is one such
character (``_build_table``): then the text's decomposition is the concatenation of one character
per character, canonical reordering moves nothing (no combining marks) and composition pairs
nothing (no character can be a pair's second member), so NFKC is the map. Characters that Python's
Unicode database does not assign are never simple: a newer utf8proc may know a decomposition for
them. Unicode's normalization stability policy keeps assigned characters' decompositions and
classes fixed across versions, and tests/text/test_nfkc.py checks every simple character against
utf8proc itself.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datapipe.runtime.jit import arr, lazy_numba
from datapipe.text.unicode_tables import SIZE, cached_table, composing_marks

numba = lazy_numba()

COMPLEX = np.uint32(0xFFFFFFFF)  # not simple: the text goes to utf8proc


@lru_cache(maxsize=1)
def nfkc_table() -> np.ndarray:
    """uint32 per code point: its NFKC when the character is simple (see the module docstring), else COMPLEX."""
    return cached_table("nfkc-simple", 1, np.uint32, _build_table)


def _build_table() -> np.ndarray:
    table = np.arange(SIZE, dtype=np.uint32)
    # Characters that compose with the one before them, combining marks (reordered), and unassigned
    # code points (utf8proc, pyarrow's normaliser, may know a newer Unicode than this Python's
    # unicodedata): a text holding one is not mapped.
    unsafe = composing_marks()
    for c in range(SIZE):
        if unicodedata.category(chr(c)) == "Cn":
            unsafe[c] = True
    unsafe[0xD800:0xE000] = True  # surrogates: never in valid UTF-8
    for c in range(SIZE):
        if unsafe[c]:
            table[c] = COMPLEX
            continue
        ch = chr(c)
        if unicodedata.is_normalized("NFKC", ch):
            continue  # itself
        m = unicodedata.normalize("NFKC", ch)
        table[c] = ord(m) if len(m) == 1 and not unsafe[ord(m)] else COMPLEX
    return table


def nfkc(text: pa.Array) -> pa.Array:
    """``pc.utf8_normalize(text, "NFKC")`` of a string array without nulls (same result, byte for byte)."""
    if len(text) == 0:
        return text
    if not pa.types.is_string(text.type):
        return pc.utf8_normalize(text, "NFKC")
    _, off_buf, data_buf = text.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int32)[text.offset : text.offset + len(text) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    data.flags.writeable = False  # one compiled signature (kernel_warmup), whether Arrow's buffer was mutable or not
    out = np.empty(2 * (int(offsets[-1]) - int(offsets[0])) + 4, dtype=np.uint8)  # a mapped character at most doubles
    out_off = np.zeros(len(text) + 1, dtype=np.int64)
    simple = np.zeros(len(text), dtype=bool)
    _map_kernel(data, offsets.astype(np.int64), nfkc_table(), out, out_off, simple)
    if int(out_off[-1]) >= 2**31:  # more than a string array holds: leave it to utf8proc
        return pc.utf8_normalize(text, "NFKC")
    mapped = pa.StringArray.from_buffers(len(text), pa.py_buffer(out_off.astype(np.int32)), pa.py_buffer(out[: int(out_off[-1])]))
    if simple.all():
        return mapped
    rest = pa.array(~simple)
    return pc.replace_with_mask(mapped, rest, pc.utf8_normalize(pc.filter(text, rest), "NFKC"))


@numba.njit(
    cache=True,
    nogil=True,
    warm=[(arr("uint8", readonly=True), arr("int64"), arr("uint32"), arr("uint8"), arr("int64"), arr("boolean"))],
)
def _map_kernel(data, offsets, table, out, out_off, simple):  # pragma: no cover - compiled
    """UTF-8 in, UTF-8 out through ``table``; a text with a COMPLEX character is written empty, simple[d] False."""
    pos = 0
    for d in range(offsets.shape[0] - 1):
        start = pos
        ok = True
        i = offsets[d]
        end = offsets[d + 1]
        while i < end:
            b = data[i]
            if b < 0x80:
                cp = np.uint32(b)
                i += 1
            elif b < 0xE0:
                cp = (np.uint32(b & 0x1F) << 6) | np.uint32(data[i + 1] & 0x3F)
                i += 2
            elif b < 0xF0:
                cp = (np.uint32(b & 0x0F) << 12) | (np.uint32(data[i + 1] & 0x3F) << 6) | np.uint32(data[i + 2] & 0x3F)
                i += 3
            else:
                cp = (
                    (np.uint32(b & 0x07) << 18)
                    | (np.uint32(data[i + 1] & 0x3F) << 12)
                    | (np.uint32(data[i + 2] & 0x3F) << 6)
                    | np.uint32(data[i + 3] & 0x3F)
                )
                i += 4
            m = table[cp]
            if m == 0xFFFFFFFF:
                ok = False
                break
            if m < 0x80:
                out[pos] = m
                pos += 1
            elif m < 0x800:
                out[pos] = 0xC0 | (m >> 6)
                out[pos + 1] = 0x80 | (m & 0x3F)
                pos += 2
            elif m < 0x10000:
                out[pos] = 0xE0 | (m >> 12)
                out[pos + 1] = 0x80 | ((m >> 6) & 0x3F)
                out[pos + 2] = 0x80 | (m & 0x3F)
                pos += 3
            else:
                out[pos] = 0xF0 | (m >> 18)
                out[pos + 1] = 0x80 | ((m >> 12) & 0x3F)
                out[pos + 2] = 0x80 | ((m >> 6) & 0x3F)
                out[pos + 3] = 0x80 | (m & 0x3F)
                pos += 4
        if ok:
            simple[d] = True
        else:
            pos = start
        out_off[d + 1] = pos
