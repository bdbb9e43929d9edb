"""Script rules for CJK text that a character n-gram model gets wrong on short or kanji-heavy text.

fastText lid.176 confuses Chinese and Japanese on short strings (on the lingua two-character
pairs it labels 29% of Chinese pairs ``ja`` and 27% ``en``) and calls written Cantonese ``zh``.
Scripts settle these: Japanese prose always carries kana, Korean carries hangul, and written
Cantonese uses a handful of characters Mandarin does not (嘅 咗 喺 冇 哋 ...).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

HAN = r"\p{Han}"
KANA = r"[\p{Hiragana}\p{Katakana}]"
HANGUL = r"\p{Hangul}"
LATIN = r"\p{Latin}"
# Written-Cantonese particles and pronouns that standard written Chinese does not use.
# 係 and 唔 are left out: 係 is common in Traditional Mandarin (關係), 唔 in onomatopoeia.
YUE_MARKERS = "[嘅咗喺冇哋嘢啲佢乜嚟睇冚揾嗰咁哂]"

CJK_LANGS = frozenset({"zh", "ja", "ko", "yue", "wuu"})


def count(text: pa.Array, pattern: str) -> np.ndarray:
    return pc.count_substring_regex(text, pattern).to_numpy(zero_copy_only=False).astype(np.int64)


def script_counts(text: pa.Array) -> dict[str, np.ndarray]:
    """Characters per script in each document (one RE2 pass per script, over the whole batch)."""
    return {"han": count(text, HAN), "kana": count(text, KANA), "hangul": count(text, HANGUL),
            "latin": count(text, LATIN)}


def script_language(c: dict[str, np.ndarray], yue: np.ndarray, min_kana: float = 0.05,
                    min_hangul: float = 0.3, min_yue: float = 0.02) -> np.ndarray:
    """The language the scripts imply (object array; None where Latin letters dominate or no CJK)."""
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

    def to_simplified(self, text: str) -> str:
        return self._t2s.convert(text)

    def detect(self, texts: list[str]) -> tuple[list[str | None], np.ndarray]:
        """Per text: ``hant``, ``hans`` or None (no character that differs), and the Traditional share."""
        scripts: list[str | None] = []
        trad = np.full(len(texts), np.nan, dtype=np.float32)
        for i, t in enumerate(texts):
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
