"""One definition of the CJK character classes (datapipe.text.charclass), checked against Unicode's
Script property as RE2 knows it, and the users that derive their tables and regexes from it."""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from datapipe.text import charclass


@lru_cache(maxsize=1)
def every_char() -> tuple[np.ndarray, pa.Array]:
    """Every code point but the surrogates, and as one-character strings (for RE2 and Python re)."""
    cps = np.array([c for c in range(charclass.CODE_POINTS) if not 0xD800 <= c < 0xE000])
    return cps, pa.array([chr(c) for c in cps.tolist()], pa.string())


# Assigned in RE2's Unicode: in some general category (RE2 has no \p{Cn}).
_ASSIGNED = r"[\p{L}\p{M}\p{N}\p{P}\p{S}\p{Z}\p{Cc}\p{Cf}\p{Co}]"


def re2(pattern: str) -> np.ndarray:
    """The code points RE2 matches with ``pattern`` (one character each)."""
    cps, chars = every_char()
    return cps[pc.match_substring_regex(chars, pattern).to_numpy(zero_copy_only=False).astype(bool)]


@pytest.fixture(scope="module")
def assigned() -> np.ndarray:
    return charclass.mask(tuple((int(c), int(c)) for c in re2(_ASSIGNED)))


@pytest.mark.parametrize(
    "name, script, outside",
    [
        ("HAN", r"\p{Han}", ()),
        # Enclosed and squared katakana (㋐, ㌀) are symbols; 🈀 is an emoji.
        ("KANA", r"\p{Hiragana}|\p{Katakana}", ((0x32D0, 0x32FE), (0x3300, 0x3357), (0x1F200, 0x1F200))),
        # Enclosed hangul (㈀, ㉠) are symbols; 〮〯 are tone marks of old texts.
        ("HANGUL", r"\p{Hangul}", ((0x302E, 0x302F), (0x3200, 0x321E), (0x3260, 0x327E))),
    ],
)
def test_classes_are_the_unicode_scripts_by_block(
    name: str, script: str, outside: charclass.Ranges, assigned: np.ndarray
) -> None:
    ours = charclass.mask(getattr(charclass, name))
    theirs = charclass.mask(tuple((int(c), int(c)) for c in re2(script)))
    missing = np.flatnonzero(theirs & ~ours & ~charclass.mask(outside))
    assert missing.size == 0, [hex(c) for c in missing[:20]]
    # What a block adds beyond the script: unassigned code points, and for kana the marks that
    # Unicode files as Common or Inherited (゛゜ ・ ー and their half-width forms).
    extra = np.flatnonzero(ours & ~theirs & assigned)
    if name == "KANA":
        assert set(extra.tolist()) == {0x3099, 0x309A, 0x309B, 0x309C, 0x30A0, 0x30FB, 0x30FC, 0xFF70, 0xFF9E, 0xFF9F}, [
            hex(c) for c in extra
        ]
    else:
        assert extra.size == 0, [hex(c) for c in extra[:20]]


def test_regex_class_matches_the_ranges_in_re2_and_python_re() -> None:
    ranges = charclass.union(charclass.HAN, charclass.KANA, charclass.HANGUL, ((0x2D, 0x2D), (0x5D, 0x5E)))
    cps, chars = every_char()
    want = charclass.mask(ranges)[cps]
    got_re2 = pc.match_substring_regex(chars, f"[{charclass.regex_class(ranges)}]").to_numpy(zero_copy_only=False)
    assert np.array_equal(got_re2.astype(bool), want)
    py = re.compile(f"[{charclass.regex_class(ranges)}]")
    got_py = np.fromiter((py.match(chr(c)) is not None for c in cps.tolist()), bool, count=len(cps))
    assert np.array_equal(got_py, want)


def test_union_merges_and_table_assigns() -> None:
    assert charclass.union(((5, 9),), ((1, 3), (4, 4)), ((8, 12),)) == ((1, 12),)
    assert charclass.union(((1, 2),), ((4, 5),)) == ((1, 2), (4, 5))
    t = charclass.table([(((2, 4),), 1), (((4, 5),), 2)], size=8)
    assert t.tolist() == [0, 0, 1, 1, 2, 2, 0, 0]
    assert charclass.code_points(((3, 5), (9, 9))).tolist() == [3, 4, 5, 9]


TEXT = "二〇〇八年，人々は𠀀字カナｶﾅ한국어ㄱ abc ⺀"


def test_every_user_counts_the_same_han() -> None:
    """langid's script counts, the Chinese quality rules' Han count, the tokenizer trainer and
    license-text words all see the same Han characters, 〇 々 and extension B included."""
    from datapipe.license import textmatch
    from datapipe.stages import cjk
    from datapipe.stages.quality import zh
    from datapipe.train import tokenizer as tokenizer_train

    han = int(charclass.mask(charclass.HAN)[[ord(c) for c in TEXT]].sum())
    assert han == 10  # 二〇〇八年 人々 𠀀字 ⺀
    counts, _, _ = cjk.line_script_counts([TEXT])
    assert (counts["han"][0], counts["kana"][0], counts["hangul"][0]) == (han, 5, 4)  # は カナ ｶﾅ, 한국어ㄱ
    assert zh.class_counts(pa.array([TEXT]))[zh._HAN][0] == han
    assert zh.class_counts(pa.array([TEXT]), reference=True)[zh._HAN][0] == han
    assert len(tokenizer_train._HAN.findall(TEXT)) == han
    assert textmatch.normalize("人々 abc").split() == ["人", "々", "abc"]


def test_dedup_tokens_each_han_and_kana_character() -> None:
    from datapipe.dedup import shingles

    assert charclass.mask(shingles.CJK_RANGES)[charclass.mask(charclass.union(charclass.HAN, charclass.KANA))].all()
    assert shingles.tokens("二〇〇八年カナ abc") == ["二", "〇", "〇", "八", "年", "カ", "ナ", "abc"]
    classes = shingles.char_classes()
    assert (classes[charclass.mask(charclass.HAN) & (classes != shingles.DIGIT)] == shingles.CJK).all()


def test_classifier_featuriser_keeps_its_v1_tokens() -> None:
    """cjk-v1 splits ideographs and kana, not the Han marks, as the models trained with it saw."""
    from datapipe.classify.features import cjk_v1

    assert cjk_v1("二〇〇八年𠀀カナabc") == "二 〇〇 八 年 𠀀 カ ナ abc"


def test_pii_address_letters_hold_no_cjk() -> None:
    """PII's claim: Han, kana and hangul never join an address or number, before or after it."""
    from datapipe.stages import pii

    letters = set(re.findall(".", "".join(chr(c) for c in range(0x10000) if re.fullmatch(f"[{pii._ADDR}]", chr(c)))))
    cjk = charclass.mask(charclass.union(charclass.HAN, charclass.KANA, charclass.HANGUL))
    assert not any(cjk[ord(c)] for c in letters)
    for text, pattern, found in [
        ("请发邮件至zhang.wei@example.cn谢谢", pii.EMAIL, "zhang.wei@example.cn"),
        ("电话415-555-0123转人工", pii.PHONE, "415-555-0123"),
        ("地址2001:db8:85a3::8a2e:370:7334上线", pii.IPV6, "2001:db8:85a3::8a2e:370:7334"),
    ]:
        assert [m.group() for m in pattern.finditer(text)] == [found], text
    # Latin letters and "_" still continue a word: no address, no number inside one.
    for text, pattern in [
        ("a@b.com_x", pii.EMAIL),
        ("a@b.comx1", pii.EMAIL),
        ("x415-555-0123", pii.PHONE),
        ("id2001:db8:85a3::8a2e:370:7334", pii.IPV6),
    ]:
        assert not pattern.search(text), text
