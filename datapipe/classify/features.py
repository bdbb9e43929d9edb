"""The one featuriser a datapipe-trained classifier sees, at training and at scoring time.

fastText splits on whitespace only, so a Chinese sentence would be one giant token that
never recurs. ``cjk`` makes every Han (and kana) character its own token and puts spaces
around punctuation, after NFKC and lower-casing; Latin words stay words. Models are
trained with ``wordNgrams=2``, so fastText itself adds character bigrams for Chinese and
word bigrams for English from these tokens (and applies the same n-grams at prediction,
since they are a property of the model).

``plain`` is what a model trained elsewhere (DCLM, FineWeb-Edu-style fastText classifiers)
expects: the text as it is, newlines turned into spaces (fastText reads one line).

The featuriser a model was trained with is recorded in its ``NAME.meta.json``; a model
without one gets ``plain``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

from datapipe.text import charclass

CJK_V1 = "cjk-v1"
PLAIN = "plain"

# Han ideographs and kana (datapipe.text.charclass). cjk-v1 keeps the ideographs only, not the Han
# marks: 〇 and 々 stay word characters, as the models trained with it saw them ("二〇〇八" has the
# token "〇〇").
_HAN = charclass.regex_class(charclass.union(charclass.HAN_IDEOGRAPHS, charclass.KANA))
# A token: one Han/kana character, a run of other word characters (a Latin word, a number), or
# one character that is neither word nor space (punctuation, symbols, full-width forms after NFKC).
_TOKEN = re.compile(rf"[{_HAN}]|[^\W{_HAN}]+|[^\w\s]")


def plain(text: str) -> str:
    """One line, otherwise unchanged: fastText's own split (on spaces, tabs, \\r, \\v, \\f, NUL) decides
    the tokens; only a newline, which ends fastText's line, must go."""
    return text.replace("\n", " ")


def cjk_v1(text: str) -> str:
    """NFKC, lower case, one token per Han/kana character and per punctuation mark, space-separated."""
    # findall + join: half the time of a regex substitution that pads each match with spaces.
    return " ".join(_TOKEN.findall(unicodedata.normalize("NFKC", text).lower()))


FEATURISERS: dict[str, Callable[[str], str]] = {PLAIN: plain, CJK_V1: cjk_v1}


def featuriser(name: str) -> Callable[[str], str]:
    try:
        return FEATURISERS[name]
    except KeyError:
        raise ValueError(f"unknown featuriser {name!r}; known: {', '.join(FEATURISERS)}") from None
