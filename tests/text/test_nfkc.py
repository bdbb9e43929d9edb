"""datapipe.text.nfkc: the per-character NFKC equals utf8proc's (pc.utf8_normalize) byte for byte."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datapipe.text.nfkc import COMPLEX, nfkc, nfkc_table
from tests.support.shared_data import shared_path


def test_every_simple_character_maps_as_utf8proc_does():
    table = nfkc_table()
    simple = np.flatnonzero(table != COMPLEX)
    assert 200_000 < len(simple) < 0x110000  # assigned, non-combining characters; not everything
    got = pa.array([chr(table[c]) for c in simple])
    assert got.equals(pc.utf8_normalize(pa.array([chr(c) for c in simple]), "NFKC"))


def test_texts_that_need_utf8proc_still_get_its_result():
    texts = [
        "ＡＢＣ，全角：１２３　空格",  # simple: full-width forms and the ideographic space
        "Ａ\u0301 full-width A then a combining acute (composes to Á)",
        "e\u0301\u0323 marks to reorder",
        "\u1100\u1161\u11a8 conjoining jamo, \uffa1\uffc2 half-width jamo",
        "ﬁ ligature, ㍿ square, ½ fraction",  # expansions
        "",
        "plain ascii",
        "\U0001f600 emoji and 中文",
        "\u0378 unassigned here",
    ]
    arr = pa.array(texts)
    assert nfkc(arr).equals(pc.utf8_normalize(arr, "NFKC"))
    sliced = arr.slice(1, 6)  # an array with an offset into its buffers
    assert nfkc(sliced).equals(pc.utf8_normalize(sliced, "NFKC"))


def test_real_chinese_and_english_text():
    texts = []
    for name in ("zh_wikipedia.jsonl", "zh_pingcap_docs.jsonl", "en_wikipedia.jsonl"):
        with open(shared_path("corpus", name), encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for _, line in zip(range(300), f)]
    arr = pa.array(texts)
    ref = pc.utf8_normalize(arr, "NFKC")
    assert nfkc(arr).equals(ref)
    assert not ref.equals(arr)  # the sample does change under NFKC
