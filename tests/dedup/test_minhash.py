"""datapipe MinHash == datasketch MinHash on real Chinese, English and mixed text."""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pytest
from datasketch import LeanMinHash, MinHash, MinHashLSH

from datapipe.dedup import evalset
from datapipe.dedup.minhash import band_keys, empty_mask, lsh_params, signatures, to_lean_minhash
from datapipe.dedup.shingles import shingle_hash, shingle_hashes, shingles, tokens
from tests.support.shared_data import shared_path


def _docs(name: str, count: int) -> list[str]:
    with shared_path("corpus", name).open(encoding="utf-8") as f:
        return [json.loads(line)["text"] for _, line in zip(range(count), f)]


@pytest.fixture(scope="module")
def real_docs() -> dict[str, list[str]]:
    return {
        "zh": _docs("zh_wikipedia.jsonl", 60),
        "en": _docs("en_wikipedia.jsonl", 60),
        "mixed": _docs("zh_pingcap_docs.jsonl", 40),
    }


@pytest.mark.parametrize("lang", ["zh", "en", "mixed"])
@pytest.mark.parametrize(
    "num_perm,seed,scheme", [(128, 1, "affine32"), (64, 42, "affine32"), (256, 7, "affine32"), (128, 1, "legacy")]
)
def test_bit_identical_to_datasketch(real_docs, lang, num_perm, seed, scheme):
    docs = real_docs[lang] + ["", "。，！", "短"]
    sigs = signatures(docs, num_perm=num_perm, seed=seed, scheme=scheme)
    for i, doc in enumerate(docs):
        m = MinHash(num_perm=num_perm, seed=seed, hashfunc=shingle_hash, scheme=scheme)
        m.update_batch(shingles(doc))
        assert sigs.dtype == m.hashvalues.dtype
        assert np.array_equal(sigs[i], m.hashvalues), (lang, i)


def test_batch_hashes_equal_reference_on_many_scripts():
    udhr = sorted(shared_path("web", "html", "udhr").glob("*.html"))
    docs = [evalset.udhr_text(p) for p in udhr[::3]] + _docs("zh_oiwiki.jsonl", 30)
    rng = random.Random(0)
    alphabet = "aΣΑ ＡＢ１２ｶﾞ가각\u0301\u1161e\u0308İﬁ㈱，。 数据३๓" + "".join(
        chr(rng.randrange(0x20, 0x30000)) for _ in range(200)
    )
    docs += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(300)]
    # windows longer than the kernel's one-step shift (128 bytes), and one of exactly 128
    docs += ["x" * 300 + " b c d e f " + "数据" * 90, " ".join(["y" * 24] + ["z" * 25] * 4) + " 𠀀" * 3]
    arrow_docs = pa.array([d for d in docs if not any(0xD800 <= ord(c) < 0xE000 for c in d)])
    for n in (1, 3, 5):
        hashes, offsets = shingle_hashes(docs, n=n)
        for i, doc in enumerate(docs):
            assert hashes[offsets[i] : offsets[i + 1]].tolist() == [shingle_hash(s) for s in shingles(doc, n)]
        # the Arrow path decodes the array's UTF-8 itself; documents Python normalizes are spliced in
        hashes, offsets = shingle_hashes(arrow_docs, n=n)
        for i, doc in enumerate(arrow_docs.to_pylist()):
            assert hashes[offsets[i] : offsets[i + 1]].tolist() == [shingle_hash(s) for s in shingles(doc, n)]


def test_normalization_and_mixed_tokens():
    assert tokens("Ｆｕｌｌ－ｗｉｄｔｈ ＴｉＤＢ，使用2024年") == ["full", "width", "tidb", "使", "用", "0000", "年"]
    assert shingles("The  QUICK, brown fox!", n=5) == [b"the quick brown fox"]  # short doc: one shingle
    assert shingles("!!! ...", n=5) == [] and shingles("", n=5) == []
    sigs = signatures(["", "。。", "a b c d e f"])
    assert empty_mask(sigs).tolist() == [True, True, False]


def test_pyarrow_input_equals_list(real_docs):
    docs = real_docs["zh"][:10] + [None]
    arr = pa.chunked_array([pa.array(docs[:5]), pa.array(docs[5:])])
    assert np.array_equal(signatures(arr), signatures([d or "" for d in docs]))


def test_lean_minhash_and_lsh_interop(real_docs):
    docs = real_docs["zh"][:20] + real_docs["en"][:20]
    edited = [d + " 版权所有 © 2021 某某网" for d in docs[:5]]
    sigs = signatures(docs + edited)
    assert lsh_params(0.7, 128) == (MinHashLSH(0.7, 128).b, MinHashLSH(0.7, 128).r)
    lsh = MinHashLSH(threshold=0.7, num_perm=128)
    for i in range(len(docs)):
        lean = to_lean_minhash(sigs[i])
        assert isinstance(lean, LeanMinHash)
        lsh.insert(i, lean)
    for k in range(5):
        assert k in lsh.query(to_lean_minhash(sigs[len(docs) + k]))
    # serialized LeanMinHash round trip keeps the values
    lean = to_lean_minhash(sigs[3])
    buf = bytearray(lean.bytesize())
    lean.serialize(buf)
    assert np.array_equal(LeanMinHash.deserialize(buf).hashvalues, sigs[3])


def test_band_keys_follow_lsh_bands(real_docs):
    sigs = signatures(real_docs["en"][:10])
    b, r = lsh_params(0.7, 128)
    keys = band_keys(sigs, b, r)
    twin = sigs[1].copy()
    twin[r:] = sigs[2][r:]  # equal to doc 1 on band 0 only
    k2 = band_keys(np.vstack([sigs, twin]), b, r)
    assert k2[-1, 0] == keys[1, 0] and (k2[-1, 1:] != keys[1, 1:]).all()
    with pytest.raises(ValueError):
        band_keys(sigs, 20, 9)


@pytest.mark.parametrize("num_perm,threshold", [(64, 0.05), (128, 0.7), (128, 0.33), (128, 0.9)])
def test_precomputed_lsh_params_are_datasketchs(num_perm, threshold):
    """The shipped table (which spares scipy's import) gives what datasketch computes."""
    from datasketch.lsh import _optimal_param

    from datapipe.dedup.lsh_table import LSH_PARAMS

    assert LSH_PARAMS[(num_perm, threshold)] == tuple(_optimal_param(threshold, num_perm, 0.5, 0.5))
    assert lsh_params(threshold, num_perm) == LSH_PARAMS[(num_perm, threshold)]


def test_lsh_params_outside_the_table_are_computed():
    assert (100, 0.7) not in __import__("datapipe.dedup.lsh_table", fromlist=["x"]).LSH_PARAMS
    assert lsh_params(0.7, 100) == (MinHashLSH(0.7, 100).b, MinHashLSH(0.7, 100).r)
