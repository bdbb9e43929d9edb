"""Script rules for CJK text that a character n-gram model gets wrong on short or kanji-heavy text.

fastText lid.176 confuses Chinese and Japanese on short strings (on the lingua two-character
pairs it labels 29% of Chinese pairs ``ja`` and 27% ``en``) and calls written Cantonese ``zh``.
Scripts settle these: Japanese prose always carries kana, Korean carries hangul, and written
Cantonese uses a handful of characters Mandarin does not (嘅 咗 喺 冇 哋 ...).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pyarrow as pa

from datapipe.runtime.process_cache import process_cache
from datapipe.text import charclass
from datapipe.text.code_points import joined_code_points

# Written-Cantonese particles and pronouns that standard written Chinese does not use.
# 係 and 唔 are left out: 係 is common in Traditional Mandarin (關係), 唔 in onomatopoeia.
YUE_MARKERS = "[嘅咗喺冇哋嘢啲佢乜嚟睇冚揾嗰咁哂]"

# Kana share of the CJK letters (kana / (Han + kana)) from which text is Japanese. Measured on
# ../shared/data: Japanese UDHR pages (jpn, jpn_osaka, jpn_tokyo) are 0.51-0.52 kana, and their
# most kanji-heavy sentence (a 55-line page's legal clauses) still 0.32; Chinese Wikipedia
# articles that quote Japanese titles (31 of 1,168 carry kana) reach at most 0.138
# (cmrc2018#DEV_271), the top five 0.06-0.14. 0.25 sits between the two with margin both ways.
MIN_KANA_SHARE = 0.25
# Where a Chinese text quotes Japanese, the quote is a clause: brackets, quotes and sentence
# punctuation bound it. Lines are cut here into such segments for language shares.
SEGMENT_BREAKS = r"[。！？；：，、《》〈〉「」『』【】（）()\[\]\"“”]+"

SCRIPT_SAMPLE_CHARS = 400  # OpenCC is the langid stage's largest cost after fastText itself


# Script class of every code point (Han, kana and hangul as ``datapipe.text.charclass`` defines
# them; Latin letters as langid weighs them), for counting with one lookup per character.
_OTHER, _HAN, _KANA, _HANGUL, _LATIN = range(5)
_LATIN_LETTERS = ((0x41, 0x5A), (0x61, 0x7A), (0xC0, 0x24F), (0x1E00, 0x1EFF))
_TABLE8 = charclass.table([(_LATIN_LETTERS, _LATIN), (charclass.HAN, _HAN), (charclass.KANA, _KANA), (charclass.HANGUL, _HANGUL)])
_YUE = np.array([ord(c) for c in YUE_MARKERS.strip("[]")], dtype=np.uint32)
NAMES = ("han", "kana", "hangul", "latin")
_YUE_TABLE = np.zeros(0x10000, dtype=np.uint8)
_YUE_TABLE[_YUE] = 1

try:  # numba (a datapipe dependency) compiles the counting loop; numpy is the fallback
    from datapipe.runtime.jit import arr, lazy_numba

    numba: ModuleType | None = lazy_numba()  # the kernel compiles (or loads) on its first call
except ImportError:  # pragma: no cover
    numba = None


def line_script_counts(
    texts: list[str] | pa.Array,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """Script counts (han, kana, hangul, latin, yue) per document and per line, in one pass.

    Returns (per document, per line, document of each line). Lines are numbered across the
    batch in order; every document starts a new line. ``texts``: Python strings, or an Arrow
    string array without nulls (read from its UTF-8 buffers, not converted to strings).
    """
    n = len(texts)
    cps, lengths = joined_code_points(texts)
    n_lines = int(np.count_nonzero(cps == 10)) + 1 if len(cps) else 0
    if _count_kernel is not None:  # one compiled pass instead of the numpy version's many
        per_doc = np.zeros((n, 6), np.int64)
        per_line = np.zeros((n_lines, 6), np.int64)
        line_doc = np.zeros(n_lines, np.int64)
        _count_kernel(cps, lengths, _TABLE8, _YUE_TABLE, per_doc, per_line, line_doc)
    else:
        per_doc, per_line, line_doc = _counts_numpy(cps, lengths, n, n_lines)
    d = {k: per_doc[:, j + 1] for j, k in enumerate(NAMES)}
    d["yue"] = per_doc[:, 5]
    ln = {k: per_line[:, j + 1] for j, k in enumerate(NAMES)}
    ln["yue"] = per_line[:, 5]
    return d, ln, line_doc


def _counts_numpy(cps: np.ndarray, lengths: np.ndarray, n: int, n_lines: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    doc = np.repeat(np.arange(n), lengths)[: len(cps)]
    line = np.cumsum(cps == 10) - (cps == 10)  # a newline counts on the line it ends
    cls = _TABLE8[cps].astype(np.int64)
    yue = np.isin(cps, _YUE)
    per_doc = np.zeros((n, 6), np.int64)
    per_line = np.zeros((n_lines, 6), np.int64)
    per_doc[:, :5] = np.bincount(doc * 5 + cls, minlength=n * 5).reshape(n, 5)
    per_line[:, :5] = np.bincount(line * 5 + cls, minlength=n_lines * 5).reshape(n_lines, 5)
    per_doc[:, 5] = np.bincount(doc, yue, minlength=n)
    per_line[:, 5] = np.bincount(line, yue, minlength=n_lines)
    # Every line but the last ends with a newline, which belongs to that line's document; the
    # last line starts the last document (which may be empty).
    line_doc = np.zeros(n_lines, dtype=np.int64)
    ends = np.flatnonzero(cps == 10)
    line_doc[: len(ends)] = doc[ends]
    if n_lines:
        line_doc[-1] = n - 1
    return per_doc, per_line, line_doc


def _count_loop(cps, lengths, table, yue_table, per_doc, per_line, line_doc):  # pragma: no cover - compiled
    doc, left, line = 0, lengths[0] if len(lengths) else 0, 0
    for i in range(cps.shape[0]):
        while left == 0:  # the separator after a document belongs to it; empty documents are skipped
            doc += 1
            left = lengths[doc]
        c = cps[i]
        left -= 1
        if c == 10:
            line_doc[line] = doc
            line += 1
            continue
        k = table[c]
        y = yue_table[c] if c < 0x10000 else 0
        per_doc[doc, k] += 1
        per_line[line, k] += 1
        if y:
            per_doc[doc, 5] += 1
            per_line[line, 5] += 1
    if line < line_doc.shape[0]:
        line_doc[line] = lengths.shape[0] - 1  # the last line starts the last document (maybe empty)


def script_language(
    c: dict[str, np.ndarray],
    yue: np.ndarray | None = None,
    min_kana: float = MIN_KANA_SHARE,
    min_hangul: float = 0.3,
    min_yue: float = 0.02,
) -> np.ndarray:
    """The language the scripts imply (object array; None where Latin letters dominate or no CJK).

    Kana decides ``ja`` only as a real share of the CJK letters (``min_kana``): a Chinese
    article quoting a Japanese title carries some kana and stays ``zh``.
    """
    yue = c["yue"] if yue is None else yue
    cjk = c["han"] + c["kana"] + c["hangul"]
    # A Han character carries about a word; compare it with an average word of ~5 Latin letters.
    dominant = (cjk > 0) & (cjk * 5 >= c["latin"])
    with np.errstate(divide="ignore", invalid="ignore"):
        hangul_frac = np.where(cjk > 0, c["hangul"] / np.maximum(cjk, 1), 0.0)
        kana_frac = c["kana"] / np.maximum(c["han"] + c["kana"], 1)
        yue_frac = yue / np.maximum(c["han"], 1)
    out = np.full(len(cjk), None, dtype=object)
    out[dominant] = "zh"
    out[dominant & (yue_frac >= min_yue)] = "yue"
    out[dominant & (kana_frac >= min_kana)] = "ja"
    out[dominant & (hangul_frac >= min_hangul)] = "ko"
    return out


_SHARED_DETECTOR: dict[str, ScriptDetector] = process_cache({})


class ScriptDetector:
    """Traditional vs Simplified from OpenCC conversion deltas.

    Converting Traditional text to Simplified changes the characters that differ between the
    scripts, and converting Simplified text to Traditional changes the same set the other
    way round. Whichever direction changes *less* names the script the text is already in.
    """

    def __init__(self) -> None:
        import opencc  # the official binding; loaded per worker

        self._t2s = opencc.OpenCC("t2s")
        self._s2t = opencc.OpenCC("s2t")

    @staticmethod
    def shared() -> ScriptDetector:
        """One detector per process (loading OpenCC's two dictionaries costs ~0.1 s of CPU): the
        driver's check and every task of a worker use the same one; conversion keeps no state."""
        if "detector" not in _SHARED_DETECTOR:
            _SHARED_DETECTOR["detector"] = ScriptDetector()
        return _SHARED_DETECTOR["detector"]

    def to_simplified(self, text: str) -> str:
        return self._t2s.convert(text)

    def detect(self, texts: list[str]) -> tuple[list[str | None], np.ndarray]:
        """Per text: ``hant``, ``hans`` or None (no character that differs), and the Traditional share."""
        scripts: list[str | None] = []
        trad = np.full(len(texts), np.nan, dtype=np.float32)
        for i, t in enumerate(texts):
            t = t[:SCRIPT_SAMPLE_CHARS]  # the script shows in a few hundred characters; converting 50 kB is waste
            to_s = _changed(t, self._t2s.convert(t))  # Traditional characters present
            to_t = _changed(t, self._s2t.convert(t))  # Simplified characters present
            if to_s + to_t == 0:
                scripts.append(None)
                continue
            trad[i] = to_s / (to_s + to_t)
            scripts.append("hant" if to_s > to_t else "hans")
        return scripts, trad


def _changed(a: str, b: str) -> int:
    # OpenCC t2s/s2t map character for character on almost all text; phrase rules that change
    # the length are rare, and there a length difference still counts as change.
    if len(a) != len(b):
        return abs(len(a) - len(b)) + sum(x != y for x, y in zip(a, b))
    ua = np.frombuffer(a.encode("utf-32-le"), dtype=np.uint32)
    return int(np.count_nonzero(ua != np.frombuffer(b.encode("utf-32-le"), dtype=np.uint32)))


_count_kernel = (
    numba.njit(
        cache=True,
        nogil=True,
        warm=[
            (
                arr("uint32", readonly=True),
                arr("int64"),
                arr("uint8"),
                arr("uint8"),
                arr("int64", 2),
                arr("int64", 2),
                arr("int64"),
            )
        ],
    )(_count_loop)
    if numba is not None
    else None
)
