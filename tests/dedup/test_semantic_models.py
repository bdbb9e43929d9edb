"""The semantic stage's model folders: a WordLlama export and a Hugging Face encoder, each checked
against its reference computation (the ``wordllama`` package's own ``embed``; ``transformers`` called
directly with mean pooling), found by their files, refused with the YAML key when a folder is none of
the kinds, and run end to end on real documents. The models are tiny and built here (no download)."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest

from datapipe.audit.sql import connect as connect_stats
from datapipe.dedup.embed import normalise
from datapipe.dedup.embed_models import TransformerEmbedder, WordLlamaEmbedder, load_embedder, model_folder
from datapipe.engine.runner import run_pipeline
from datapipe.pipeline.load import ConfigError, load_pipeline
from tests.dedup.test_semantic import build_static_model, doc_id, paraphrase, write_run
from tests.support.shared_data import shared_path
from tests.support.tiny_transformer import save_encoder

WL_DIM = 64


def real_documents(per_file: int = 10) -> tuple[list[str], list[int]]:
    """The first ``per_file`` documents of 400-3000 characters of English and of Chinese Wikipedia,
    paraphrases of four of them (sentences reordered, some left out, re-punctuated) and exact copies
    of two; the index of each copy's original."""
    texts: list[str] = []
    for name in ("en_wikipedia.jsonl", "zh_wikipedia.jsonl"):
        with open(shared_path("corpus", name), encoding="utf-8") as f:
            found = 0
            for line in f:
                text = json.loads(line)["text"]
                if 400 < len(text) < 3000:
                    texts.append(text)
                    found += 1
                    if found == per_file:
                        break
    rng = random.Random(0)
    originals = [3, 7, per_file + 2, per_file + 5, 1, per_file + 8]
    texts += [paraphrase(texts[i], rng) for i in originals[:4]] + [texts[i] for i in originals[4:]]
    return texts, originals


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return real_documents()[0]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, docs: list[str]) -> Path:
    """The three kinds of folder, built once for the module: m2v/, wl/ (the package's cache layout) and enc/."""
    root = tmp_path_factory.mktemp("models")
    build_static_model(docs, root / "m2v")
    build_wordllama(docs, root / "wl")
    if _has("transformers") and _has("torch"):
        save_encoder(root / "enc", docs)
    return root


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def build_wordllama(texts: list[str], root: Path, name: str = "custom", seed: int = 0, cache_layout: bool = True) -> Path:
    """A WordLlama export as the package stores it: ``weights/<name>_<dim>.safetensors`` (float16
    tensor ``embedding.weight``) and ``tokenizers/<name>_tokenizer_config.json`` (a tokenizers JSON:
    BPE with an ``<unk>`` token and a metaspace, as Llama's), or both files side by side. The matrix
    has fewer rows than the tokenizer has ids, as a trimmed vocabulary does (WordLlama clips those ids)."""
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=1500, special_tokens=["<unk>", "<s>", "</s>"]))
    rows = tok.get_vocab_size() - 5
    emb = np.random.default_rng(seed).standard_normal((rows, WL_DIM)).astype(np.float16)
    weights, tokenizers = (root / "weights", root / "tokenizers") if cache_layout else (root, root)
    weights.mkdir(parents=True, exist_ok=True)
    tokenizers.mkdir(parents=True, exist_ok=True)
    save_file({"embedding.weight": emb}, str(weights / f"{name}_{WL_DIM}.safetensors"))
    tok.save(str(tokenizers / f"{name}_tokenizer_config.json"))
    return root


def test_wordllama_folder_gives_the_packages_vectors(tmp_path: Path, docs: list[str], models: Path) -> None:
    ours = WordLlamaEmbedder(models / "wl").encode(docs)
    flat = build_wordllama(docs, tmp_path / "flat", cache_layout=False)  # the same files side by side
    assert np.array_equal(WordLlamaEmbedder(flat).encode(docs), ours)
    assert np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-6)
    root_logger = logging.getLogger()
    handlers, level = list(root_logger.handlers), root_logger.level
    wordllama = pytest.importorskip("wordllama")  # the reference: the package's own load and embed
    root_logger.handlers[:], root_logger.level = handlers, level  # its import sets up logging at INFO; not ours to keep
    uri = wordllama.ModelURI(
        repo_id="none", available_dims=[WL_DIM], binary_dims=[], tokenizer_config="custom_tokenizer_config.json"
    )
    model = wordllama.WordLlama.load(config=uri, cache_dir=models / "wl", dim=WL_DIM, disable_download=True)
    theirs = model.embed(docs, norm=True)
    assert np.abs(ours - theirs).max() < 1e-5


def test_transformers_encoder_gives_masked_mean_pooling(docs: list[str], models: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = models / "enc"
    ours = TransformerEmbedder(folder, max_tokens=48, batch_size=5).encode(docs)  # batches of unequal lengths, padded
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = transformers.AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
    theirs = []
    with torch.inference_mode():
        for text in docs:  # one text at a time: no padding at all
            enc = tokenizer(text, truncation=True, max_length=48, return_tensors="pt")
            theirs.append(model(**enc).last_hidden_state[0].mean(dim=0).numpy())
    assert np.abs(ours - normalise(np.stack(theirs))).max() < 1e-5
    # truncation matters: the documents are longer than 48 tokens, and more of them changes the vectors
    longer = TransformerEmbedder(folder, max_tokens=96, batch_size=5).encode(docs)
    assert np.abs(longer - ours).max() > 1e-3


def test_a_folder_is_found_by_its_files_or_refused_naming_the_key(tmp_path: Path, models: Path) -> None:
    pytest.importorskip("transformers")
    assert [model_folder(models / n).kind for n in ("m2v", "wl", "enc")] == ["model2vec", "wordllama", "transformers"]
    for name in ("m2v", "wl", "enc"):
        (tmp_path / name).symlink_to(models / name)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "tokenizer.json").write_text("{}")
    (tmp_path / "junk" / "model.safetensors").write_bytes(b"not a safetensors file")
    for options, key, words in (
        ({"model": "junk"}, "model", "it reads model2vec (model.safetensors with tensor 'embeddings'"),
        ({"model": "enc", "model_kind": "wordllama"}, "model", "is not a wordllama model folder"),
        ({"model": "m2v", "max_tokens": 64}, "max_tokens", "is for a transformers model; m2v is a model2vec model"),
        ({"model_kind": "transformers"}, "model_kind", "give model too"),
    ):
        path = write_run(tmp_path, ["a document"], options)
        with pytest.raises(ConfigError) as info:
            load_pipeline(path)
        assert any(p.startswith(f"stages[0].semantic.{key}") and words in p for p in info.value.problems), info.value.problems
    # the same folder with its kind given: accepted
    load_pipeline(write_run(tmp_path, ["a document"], {"model": "enc", "model_kind": "transformers"}))


@pytest.mark.parametrize("kind", ["wordllama", "transformers"])
def test_the_stage_runs_with_each_kind_and_drops_what_the_vectors_say(tmp_path: Path, models: Path, kind: str) -> None:
    """Real documents, exact and paraphrased copies of some of them; one k-means cluster, so every pair
    is compared: the documents dropped are exactly those the embedder's own vectors put at or above
    the threshold from an earlier document that was kept, each for the closest one, with its cosine."""
    if kind == "transformers":
        pytest.importorskip("transformers")
    texts, originals = real_documents()
    (tmp_path / "model").symlink_to(models / ("wl" if kind == "wordllama" else "enc"))
    threshold = 0.99
    path = write_run(tmp_path, texts, {"model": "model", "threshold": threshold, "clusters": 1, "partitions": 2})
    out = tmp_path / "out"
    run_pipeline(load_pipeline(path), output=out, show_progress=False, in_process=True, log=lambda m: None)
    with connect_stats(out) as con:
        dropped = {
            r[0]: (r[1], r[2])
            for r in con.execute(
                "select id, dup_of, semantic_similarity from documents where reason = 'near_semantic'"
            ).fetchall()
        }
    vectors = load_embedder(kind, tmp_path / "model").encode(texts)
    sims = np.round(vectors @ vectors.T, 6)
    n = len(texts)
    kept: list[int] = []  # walked in run order: dropped only for a kept document at or above the threshold
    expected = {}
    for i in range(n):
        close = [j for j in kept if sims[i, j] >= threshold]
        if close:
            expected[doc_id(i, n)] = doc_id(max(close, key=lambda j: (sims[i, j], -j)), n)  # the closest, then the earliest
        else:
            kept.append(i)
    assert {d: s for d, (s, _) in dropped.items()} == expected
    assert {doc_id(n - 2, n), doc_id(n - 1, n)} <= expected.keys()  # the exact copies at least
    for d, (s, sim) in dropped.items():
        i, j = (int(np.flatnonzero([doc_id(k, n) == x for k in range(n)])[0]) for x in (d, s))
        assert sim == pytest.approx(float(vectors[i] @ vectors[j]), abs=1e-4)
