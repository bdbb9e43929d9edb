"""The compiled script-counting pass equals the numpy one, on real text and on edge cases."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from datapipe.stages import cjk
from datapipe.text import code_points
from tests.support.shared_data import shared_path

KEYS = ("han", "kana", "hangul", "latin", "yue")


def numpy_counts(texts: list[str]):
    cps = np.frombuffer("\n".join(texts).encode("utf-32-le"), dtype=np.uint32)
    lengths = np.fromiter((len(t) + 1 for t in texts), dtype=np.int64, count=len(texts))
    n_lines = int(np.count_nonzero(cps == 10)) + 1 if len(cps) else 0
    return cjk._counts_numpy(cps, lengths, len(texts), n_lines)


@pytest.mark.skipif(cjk._count_kernel is None, reason="numba is not installed")
def test_kernel_matches_numpy_on_real_mixed_text() -> None:
    lines = shared_path("corpus", "zh_pingcap_docs.jsonl").read_text(encoding="utf-8").splitlines()[:300]
    texts = [json.loads(x)["text"] for x in lines] + ["", "abc\n\n漢字", "", "佢喺度\nhello 𠀀", "かな\n한국어", ""]
    random.Random(0).shuffle(texts)
    for batch in (texts, ["a\nb", "", "c"], ["", "x"], ["x", ""], ["a\n\nb", "c\n"], [""]):
        per_doc, per_line, line_doc = cjk.line_script_counts(batch)
        ref_doc, ref_line, ref_line_doc = numpy_counts(batch)
        assert np.array_equal(np.stack([per_doc[k] for k in KEYS], 1), ref_doc[:, 1:])
        assert np.array_equal(np.stack([per_line[k] for k in KEYS], 1), ref_line[:, 1:])
        assert np.array_equal(line_doc, ref_line_doc)
        assert np.all(np.diff(line_doc) >= 0)  # lines are in document order (searchsorted relies on it)
    per_doc, _, _ = cjk.line_script_counts(["佢喺度食飯", "かなカナ漢", "한국어", "abc"])
    assert per_doc["yue"].tolist() == [2, 0, 0, 0] and per_doc["kana"].tolist() == [0, 4, 0, 0]
    assert per_doc["hangul"].tolist() == [0, 0, 3, 0] and per_doc["latin"].tolist() == [0, 0, 0, 3]


@pytest.mark.skipif(code_points._decode_kernel is None, reason="numba is not installed")
def test_arrow_input_counts_as_the_strings_do() -> None:
    """langid passes its Arrow array (decoded from UTF-8 in the kernel): the same counts as its strings."""
    import pyarrow as pa

    lines = shared_path("corpus", "zh_pingcap_docs.jsonl").read_text(encoding="utf-8").splitlines()[:200]
    texts = [json.loads(x)["text"] for x in lines] + ["", "abc\n\n漢字", "", "佢喺度\nhello 𠀀 é", "かな\n한국어", ""]
    random.Random(1).shuffle(texts)
    arr = pa.array(texts)
    for batch in (arr, arr.slice(7, 50), pa.array(["", "x"]), pa.array(["x\n", ""]), pa.array([""])):
        got = cjk.line_script_counts(batch)
        ref = cjk.line_script_counts(batch.to_pylist())
        for g, r in zip(got[:2], ref[:2]):
            assert all(np.array_equal(g[k], r[k]) for k in (*KEYS,))
        assert np.array_equal(got[2], ref[2])
