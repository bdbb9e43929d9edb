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
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datapipe.text import charclass
from datapipe.text.code_points import joined_code_points
from datapipe.text.unicode_tables import cached_table, composing_marks

# numba is the default path; the numpy/Python fallback keeps the package importable. Found, not
# imported: the kernels compile (or load from numba's cache) on first use (runtime/jit.py), so a
# driver that only plans a run never loads numba.
HAVE_NUMBA = importlib.util.find_spec("numba") is not None
if HAVE_NUMBA:
    from datapipe.runtime.jit import arr, lazy_numba

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
TOKEN_RE = re.compile(f"[{_CJK_CLASS}]|[^\\W_{_CJK_CLASS}]+")
_DIGIT_RE = re.compile(r"\d")

# Character classes of the kernel's lookup table.
SEP, WORD, CJK, DIGIT = 0, 1, 2, 3


def normalize(text: str, char_map: Mapping[int, str] | None = None) -> str:
    """NFKC + lower-case + optional character map; digits are folded later (both paths)."""
    text = unicodedata.normalize("NFKC", text).lower()
    return text.translate(char_map) if char_map else text


def tokens(text: str, char_map: Mapping[int, str] | None = None) -> list[str]:
    return TOKEN_RE.findall(_DIGIT_RE.sub("0", normalize(text, char_map)))


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
    """uint8 class per code point (0..0x10FFFF), built from the same rules as ``TOKEN_RE``."""
    return cached_table("shingle-classes", 1, np.uint8, _build_char_classes, depends=repr(CJK_RANGES))


def _build_char_classes() -> np.ndarray:
    table = np.zeros(0x110000, dtype=np.uint8)
    # isalnum / isdecimal over all code points once; the regex defines the same sets.
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


def texts_as_list(texts: Texts) -> list[str]:
    """A batch's texts as a list of str (a missing text as ""), from a list, an Arrow or numpy array."""
    if not isinstance(texts, (list, tuple)):  # pyarrow Array / ChunkedArray, numpy array, ...
        texts = texts.to_pylist() if hasattr(texts, "to_pylist") else list(texts)
    return [t or "" for t in texts]


def _join(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), dtype=np.uint32), offsets


def to_codepoints(texts: Texts, char_map: Mapping[int, str] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Code points of a batch: (read-only uint32 cps, int64 offsets[n+1], bool ``done`` per doc).

    Documents with ``done`` False are raw text that the kernel normalizes through
    ``norm_table``; the others (COMPLEX code points, or any ``char_map``) were normalized here.
    """
    texts = texts_as_list(texts)
    cps, offsets = _join(texts)
    done = np.zeros(len(texts), dtype=bool)
    if char_map:
        done[:] = True
    else:
        _needs_python_jit(cps, offsets, norm_table(), done)
    return _normalized(cps, offsets, done, lambda idx: [texts[i] for i in idx], char_map)


def _arrow_codepoints(text: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``to_codepoints`` of an Arrow string array without nulls, decoded from its UTF-8 in one compiled
    pass (no Python string per text, no join, no UTF-32 copy). Each document's range ends with the
    newline that joins it to the next: a separator, which no token or shingle contains."""
    cps, lengths = joined_code_points(text)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    offsets[-1] = len(cps)  # the last text has no newline after it
    done = np.zeros(len(lengths), dtype=bool)
    _needs_python_jit(cps, offsets, norm_table(), done)
    return _normalized(cps, offsets, done, lambda idx: text.take(pa.array(idx)).to_pylist(), None)


def _normalized(
    cps: np.ndarray,
    offsets: np.ndarray,
    done: np.ndarray,
    texts_at: Callable[[np.ndarray], list[str]],
    char_map: Mapping[int, str] | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The documents marked ``done`` replaced by their Python normalization; the others' code points
    are copied as they are (a few documents per batch need this: no re-encoding of the whole batch)."""
    idx = np.flatnonzero(done)
    if len(idx) == 0:
        return cps, offsets, done
    fixed = [np.frombuffer(normalize(t, char_map).encode("utf-32-le", "surrogatepass"), dtype=np.uint32) for t in texts_at(idx)]
    lengths = np.diff(offsets)
    lengths[idx] = [len(f) for f in fixed]
    pieces: list[np.ndarray] = []
    last = 0  # first document not yet copied
    for i, f in zip(idx.tolist(), fixed):
        pieces += [cps[offsets[last] : offsets[i]], f]
        last = i + 1
    pieces.append(cps[offsets[last] :])
    out = np.concatenate(pieces)
    out.flags.writeable = False  # as the joined buffer is: one compiled signature of the kernels
    new_offsets = np.zeros_like(offsets)
    np.cumsum(lengths, out=new_offsets[1:])
    return out, new_offsets, done


# CRC-32 of a window from prefix CRCs. CRC-32 is linear: for a byte string A followed by B,
# crc0(A + B) = Z_|B|(crc0(A)) ^ crc0(B), where crc0 runs from a zero register and Z_L feeds L zero
# bytes through the register (a linear map of its 32 bits). zlib's CRC of B (register 0xFFFFFFFF,
# result inverted) is then crc0(A + B) ^ Z_|B|(crc0(A) ^ 0xFFFFFFFF) ^ 0xFFFFFFFF. The kernel runs
# the register once over a document's token stream ("tok tok tok", digits folded), noting it at
# each token's start and end, and gets every window's CRC from two notes and one Z_L: each byte is
# read once instead of once per window holding it (n times) and re-encoded to UTF-8 every time.
# Z_L is applied byte by byte of the register: ZERO_SHIFT[L, 256 * j + b] = Z_L(b << 8j).
SHIFT_MAX = 128  # longer windows apply Z_128 as often as needed


def _zero_shift_table() -> np.ndarray:
    table = np.empty((SHIFT_MAX + 1, 1024), dtype=np.uint32)
    cur = np.arange(256, dtype=np.uint32)[None, :] << (np.arange(4, dtype=np.uint32)[:, None] * np.uint32(8))
    cur = cur.reshape(-1)
    table[0] = cur
    for length in range(1, SHIFT_MAX + 1):
        cur = CRC_TABLE[cur & np.uint32(0xFF)] ^ (cur >> np.uint32(8))
        table[length] = cur
    return table


ZERO_SHIFT = _zero_shift_table()


def _shingle_kernel(cps, offsets, done, table, classes, n, crc_table, shift, out_hash, out_off, at_start, at_end, b_start, b_end):
    """Normalize (table), tokenize, then CRC-32 each window of n tokens joined by b" " in UTF-8."""
    n_docs = offsets.shape[0] - 1
    max_len = shift.shape[0] - 1
    pos = 0
    out_off[0] = 0
    for d in range(n_docs):
        # One pass: tokens, and the zero-started CRC register over "tok tok ..." at each token's
        # start (at_start, after the joining space) and end (at_end), with their byte positions.
        nt = 0
        in_word = False
        crc = np.uint32(0)
        nbytes = 0
        for i in range(offsets[d], offsets[d + 1]):
            c = cps[i]
            if not done[d]:
                c = table[c]
            k = classes[c]
            if k == 0:
                in_word = False
                continue
            if k == 2 or not in_word:  # a new token: close the last one, then the joining space
                if nt > 0:
                    at_end[nt - 1] = crc
                    b_end[nt - 1] = nbytes
                    crc = crc_table[(crc ^ np.uint32(32)) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
                    nbytes += 1
                at_start[nt] = crc
                b_start[nt] = nbytes
                nt += 1
                in_word = k != 2
            if k == 3:
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
            nbytes += nb
        if nt == 0:
            out_off[d + 1] = pos
            continue
        at_end[nt - 1] = crc
        b_end[nt - 1] = nbytes
        width = n if nt >= n else nt
        for w in range(nt - width + 1):
            last = w + width - 1
            x = at_start[w] ^ np.uint32(0xFFFFFFFF)
            length = b_end[last] - b_start[w]
            while length > 0:
                step = length if length < max_len else max_len
                x = (
                    shift[step, x & np.uint32(0xFF)]
                    ^ shift[step, 256 + ((x >> np.uint32(8)) & np.uint32(0xFF))]
                    ^ shift[step, 512 + ((x >> np.uint32(16)) & np.uint32(0xFF))]
                    ^ shift[step, 768 + (x >> np.uint32(24))]
                )
                length -= step
            out_hash[pos] = at_end[last] ^ x ^ np.uint32(0xFFFFFFFF)
            pos += 1
        out_off[d + 1] = pos
    return pos


if HAVE_NUMBA:
    _shingle_kernel_jit = numba.njit(
        cache=True,
        nogil=True,
        warm=[
            (
                arr("uint32", readonly=True),
                arr("int64"),
                arr("boolean"),
                arr("uint32"),
                arr("uint8"),
                "int64",
                arr("uint32"),
                arr("uint32", 2),
                arr("uint32"),
                arr("int64"),
                arr("uint32"),
                arr("uint32"),
                arr("int64"),
                arr("int64"),
            )
        ],
    )(_shingle_kernel)
    _needs_python_jit = numba.njit(
        cache=True, nogil=True, warm=[(arr("uint32", readonly=True), arr("int64"), arr("uint32"), arr("boolean"))]
    )(_needs_python_kernel)


def shingle_hashes(texts: Texts, n: int = DEFAULT_N, char_map: Mapping[int, str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Batch path: (uint32 shingle hashes of all docs, int64 offsets[n_docs+1]).

    Equal to ``[shingle_hash(s) for s in shingles(doc)]`` per document.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    if not HAVE_NUMBA:  # slow but equal: the reference per document
        ref = [[shingle_hash(s) for s in shingles(t, n, char_map)] for t in texts_as_list(texts)]
        out_off = np.zeros(len(ref) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in ref], out=out_off[1:])
        return np.array([h for r in ref for h in r], dtype=np.uint32), out_off
    if char_map is None and isinstance(texts, (pa.Array, pa.ChunkedArray)) and texts.type == pa.string():
        text = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
        cps, offsets, done = _arrow_codepoints(pc.fill_null(text, "") if text.null_count else text)
    else:
        cps, offsets, done = to_codepoints(texts, char_map=char_map)
    out_off = np.zeros(len(offsets), dtype=np.int64)
    size = max(len(cps), 1)  # a document has at most one token (and shingle) per code point
    out_hash = np.empty(size, dtype=np.uint32)
    at_start, at_end = np.empty(size, dtype=np.uint32), np.empty(size, dtype=np.uint32)
    b_start, b_end = np.empty(size, dtype=np.int64), np.empty(size, dtype=np.int64)
    used = _shingle_kernel_jit(
        cps,
        offsets,
        done,
        norm_table(),
        char_classes(),
        n,
        CRC_TABLE,
        ZERO_SHIFT,
        out_hash,
        out_off,
        at_start,
        at_end,
        b_start,
        b_end,
    )
    return out_hash[:used].copy(), out_off
