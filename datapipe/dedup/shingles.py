"""Normalization and shingling for Chinese, English and mixed text.

Tokens: every character of a script written without spaces (Han, kana, bopomofo, Thai, Lao,
Khmer, Myanmar; ``CJK`` below) is one token; every run of other alphanumeric characters
(``str.isalnum``: Latin, Cyrillic, Hangul, digits, ...) is one token; everything else
(punctuation, symbols, spaces) only separates tokens. A shingle is ``n`` consecutive tokens
joined by one space, so a Chinese run yields character n-grams, a Latin run word n-grams and
mixed text ("使用TiDB数据库") mixes both with no special case at the script boundary.

Normalization (both paths): NFKC (full-width forms, compatibility characters), ``str.lower``,
every Unicode decimal digit -> "0" (numbers that differ between copies do not count), and an
optional character map (e.g. Traditional -> Simplified, see ``datapipe.dedup.t2s``).

Documents with fewer than ``n`` tokens yield one shingle (all their tokens), so a short
document only matches another with identical normalized tokens; documents with no token
(empty, only punctuation) yield no shingle, keep datasketch's empty signature and are left
out of clustering (they can only be removed by exact dedup).

``shingles``/``shingle_hash`` are the plain-Python reference (datasketch is fed with them in
tests and benchmarks); ``shingle_hashes`` is the batch path: one numba kernel over the
code-point array of the whole batch produces the same 32-bit hashes.
"""

from __future__ import annotations

import importlib.util
import re
import unicodedata
import zlib
from collections.abc import Iterable, Mapping
from functools import lru_cache

import numpy as np

from datapipe.text import charclass
from datapipe.text.unicode_tables import cached_table, composing_marks

# numba is the default path; the numpy/Python fallback keeps the package importable. Found, not
# imported: the kernels compile (or load from numba's cache) on first use (runtime/jit.py), so a
# driver that only plans a run never loads numba.
HAVE_NUMBA = importlib.util.find_spec("numba") is not None
if HAVE_NUMBA:
    from datapipe.runtime.jit import lazy_numba

    numba = lazy_numba()

DEFAULT_N = 5
# A batch of texts: a list or tuple of str, a pyarrow string Array / ChunkedArray, a numpy array of str
# (a null or None is read as "").
Texts = Iterable[str | None]

# Scripts tokenized per character (inclusive code-point ranges, ``datapipe.text.charclass``), and
# 〆 and the CJK strokes, which only occur among Han characters.
CJK_RANGES: charclass.Ranges = charclass.union(
    charclass.HAN,
    charclass.KANA,
    charclass.BOPOMOFO,
    charclass.THAI_LAO,
    charclass.MYANMAR,
    charclass.KHMER,
    ((0x3006, 0x3006), (0x31C0, 0x31EF)),
)
_CJK_CLASS = charclass.regex_class(CJK_RANGES)
# A CJK character, or a run of alphanumerics that are not CJK (\w minus "_" minus CJK).
_TOKEN_RE = re.compile(f"[{_CJK_CLASS}]|[^\\W_{_CJK_CLASS}]+")
_DIGIT_RE = re.compile(r"\d")

# Character classes of the kernel's lookup table.
SEP, WORD, CJK, DIGIT = 0, 1, 2, 3


def normalize(text: str, char_map: Mapping[int, str] | None = None) -> str:
    """NFKC + lower-case + optional character map; digits are folded later (both paths)."""
    text = unicodedata.normalize("NFKC", text).lower()
    return text.translate(char_map) if char_map else text


def tokens(text: str, char_map: Mapping[int, str] | None = None) -> list[str]:
    return _TOKEN_RE.findall(_DIGIT_RE.sub("0", normalize(text, char_map)))


def shingles(text: str, n: int = DEFAULT_N, char_map: Mapping[int, str] | None = None) -> list[bytes]:
    """Reference shingles of one document, UTF-8 bytes (lone surrogates pass through)."""
    toks = tokens(text, char_map)
    if not toks:
        return []
    if len(toks) < n:
        return [" ".join(toks).encode("utf-8", "surrogatepass")]
    return [" ".join(toks[i : i + n]).encode("utf-8", "surrogatepass") for i in range(len(toks) - n + 1)]


def shingle_hash(b: bytes) -> int:
    """H: the 32-bit shingle hash (CRC-32, zlib's), a plain function for datasketch's ``hashfunc``.

    CRC-32 is C-speed from Python (so datasketch fed with H is not slowed by H) and a byte
    loop in the kernel; datasketch's affine schemes pre-mix it with the Murmur3 finalizer.
    """
    return zlib.crc32(b)


@lru_cache(maxsize=1)
def char_classes() -> np.ndarray:
    """uint8 class per code point (0..0x10FFFF), built from the same rules as ``_TOKEN_RE``."""
    return cached_table("shingle-classes", 1, np.uint8, _build_char_classes, depends=repr(CJK_RANGES))


def _build_char_classes() -> np.ndarray:
    table = np.zeros(0x110000, dtype=np.uint8)
    # isalnum / isdecimal over all code points once (~0.3 s); the regex defines the same sets.
    alnum = np.fromiter((chr(c).isalnum() for c in range(0x110000)), dtype=bool, count=0x110000)
    dec = np.fromiter((chr(c).isdecimal() for c in range(0x110000)), dtype=bool, count=0x110000)
    table[alnum] = WORD
    table[charclass.mask(CJK_RANGES)] = CJK
    table[dec] = DIGIT  # after CJK: Thai/Khmer/Myanmar digits become "0" before tokenizing too
    return table


COMPLEX = np.uint32(0xFFFFFFFF)


@lru_cache(maxsize=1)
def norm_table() -> np.ndarray:
    """uint32 per code point: lower(NFKC(c)) when that is one code point and NFKC of a text is
    then the per-character map (no composition with neighbours), else COMPLEX.

    A document holding any COMPLEX code point (combining marks, characters that compose with
    the previous one, expansions such as ligatures, final-sigma capital) is normalized by
    ``unicodedata`` instead; tests check both give ``normalize``'s result.
    """
    return cached_table("shingle-norm", 1, np.uint32, _build_norm_table)


def _build_norm_table() -> np.ndarray:
    cp = np.arange(0x110000, dtype=np.uint32)
    table = cp.copy()
    # Combining marks and second members of canonical pairs: mapped by the real normaliser only.
    unsafe = composing_marks()
    unsafe[0x03A3] = True  # str.lower maps capital sigma by context
    for c in range(0x110000):
        if 0xD800 <= c < 0xE000:
            continue
        ch = chr(c)
        if unicodedata.is_normalized("NFKC", ch) and ch.lower() == ch and not unsafe[c]:
            continue  # identity (most code points)
        m = unicodedata.normalize("NFKC", ch).lower()
        if unsafe[c] or len(m) != 1 or unsafe[ord(m)]:
            table[c] = COMPLEX
        else:
            table[c] = ord(m)
    return table


def _needs_python_kernel(cps, offsets, table, out):
    for d in range(offsets.shape[0] - 1):
        for i in range(offsets[d], offsets[d + 1]):
            if table[cps[i]] == 0xFFFFFFFF:
                out[d] = True
                break


def _crc_table() -> np.ndarray:
    t = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        t[i] = c
    return t


CRC_TABLE = _crc_table()


def _as_list(texts: Texts) -> list[str]:
    if not isinstance(texts, (list, tuple)):  # pyarrow Array / ChunkedArray, numpy array, ...
        texts = texts.to_pylist() if hasattr(texts, "to_pylist") else list(texts)
    return [t or "" for t in texts]


def _join(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), dtype=np.uint32), offsets


def to_codepoints(texts: Texts, char_map: Mapping[int, str] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Code points of a batch: (uint32 cps, int64 offsets[n+1], bool ``done`` per doc).

    Documents with ``done`` False are raw text that the kernel normalizes through
    ``norm_table``; the others (COMPLEX code points, or any ``char_map``) were normalized here.
    """
    texts = _as_list(texts)
    table = norm_table()
    cps, offsets = _join(texts)
    done = np.zeros(len(texts), dtype=bool)
    if char_map:
        done[:] = True
    else:
        _needs_python_jit(cps, offsets, table, done)
    if done.any():
        for i in np.flatnonzero(done):
            texts[i] = normalize(texts[i], char_map)
        cps, offsets = _join(texts)
    return cps, offsets, done


def _shingle_kernel(cps, offsets, done, table, classes, n, crc_table, out_hash, out_off, tok_s, tok_e):
    """Normalize (table), tokenize, then CRC-32 each window of n tokens joined by b" " in UTF-8."""
    n_docs = offsets.shape[0] - 1
    pos = 0
    out_off[0] = 0
    for d in range(n_docs):
        if not done[d]:
            for i in range(offsets[d], offsets[d + 1]):
                cps[i] = table[cps[i]]
        # tokens of doc d as [start, end) into cps
        nt = 0
        in_word = False
        for i in range(offsets[d], offsets[d + 1]):
            k = classes[cps[i]]
            if k == 1 or k == 3:
                if not in_word:
                    tok_s[nt] = i
                    nt += 1
                    in_word = True
                tok_e[nt - 1] = i + 1
            elif k == 2:
                tok_s[nt] = i
                tok_e[nt] = i + 1
                nt += 1
                in_word = False
            else:
                in_word = False
        if nt == 0:
            out_off[d + 1] = pos
            continue
        width = n if nt >= n else nt
        for w in range(nt - width + 1):
            crc = np.uint32(0xFFFFFFFF)
            for t in range(w, w + width):
                if t > w:  # the joining space
                    crc = crc_table[(crc ^ np.uint32(32)) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
                for i in range(tok_s[t], tok_e[t]):
                    c = cps[i]
                    if classes[c] == 3:
                        c = np.uint32(48)  # every decimal digit -> "0"
                    # UTF-8 encode c byte by byte into the running CRC
                    if c < 0x80:
                        nb = 1
                        b0 = c
                    elif c < 0x800:
                        nb = 2
                        b0 = np.uint32(0xC0) | (c >> np.uint32(6))
                    elif c < 0x10000:
                        nb = 3
                        b0 = np.uint32(0xE0) | (c >> np.uint32(12))
                    else:
                        nb = 4
                        b0 = np.uint32(0xF0) | (c >> np.uint32(18))
                    crc = crc_table[(crc ^ b0) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
                    for j in range(nb - 2, -1, -1):
                        bj = np.uint32(0x80) | ((c >> np.uint32(6 * j)) & np.uint32(0x3F))
                        crc = crc_table[(crc ^ bj) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
            out_hash[pos] = crc ^ np.uint32(0xFFFFFFFF)
            pos += 1
        out_off[d + 1] = pos
    return pos


if HAVE_NUMBA:
    _shingle_kernel_jit = numba.njit(cache=True, nogil=True)(_shingle_kernel)
    _needs_python_jit = numba.njit(cache=True, nogil=True)(_needs_python_kernel)


def shingle_hashes(texts: Texts, n: int = DEFAULT_N, char_map: Mapping[int, str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Batch path: (uint32 shingle hashes of all docs, int64 offsets[n_docs+1]).

    Equal to ``[shingle_hash(s) for s in shingles(doc)]`` per document.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    if not HAVE_NUMBA:  # slow but equal: the reference per document
        ref = [[shingle_hash(s) for s in shingles(t, n, char_map)] for t in _as_list(texts)]
        out_off = np.zeros(len(ref) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in ref], out=out_off[1:])
        return np.array([h for r in ref for h in r], dtype=np.uint32), out_off
    cps, offsets, done = to_codepoints(texts, char_map=char_map)
    cps = cps.copy()  # frombuffer is read-only; the kernel normalizes in place
    out_off = np.zeros(len(offsets), dtype=np.int64)
    size = max(len(cps), 1)  # a document has at most one shingle per code point
    out_hash = np.empty(size, dtype=np.uint32)
    tok_s = np.empty(size, dtype=np.int64)
    tok_e = np.empty(size, dtype=np.int64)
    used = _shingle_kernel_jit(cps, offsets, done, norm_table(), char_classes(), n, CRC_TABLE, out_hash, out_off, tok_s, tok_e)
    return out_hash[:used].copy(), out_off
