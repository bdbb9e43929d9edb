"""A small BERT sequence classifier (or regressor, or a bare encoder: ``save_encoder``) built from a config
with seeded random weights, with a WordPiece tokenizer trained here on real zh/en text, saved as a model
folder: no hub, no download.

Used by the classify tests (``tests/classify/test_transformer_classifier.py``) and by
``bench/perf/classify_transformer.py`` (a larger one of the same shape); the encoder by the semantic stage's tests
(``tests/dedup/test_semantic_models.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def corpus_texts(corpus: Path, per_file: int = 200, chars: int = 2000) -> list[str]:
    """The first ``per_file`` documents of zh and en Wikipedia, cut to ``chars``: the tokenizer's training text."""
    texts = []
    for name in ("zh_wikipedia.jsonl", "en_wikipedia.jsonl"):
        with open(corpus / name, encoding="utf-8") as f:
            for _, line in zip(range(per_file), f):
                texts.append(json.loads(line)["text"][:chars])
    return texts


def save_tokenizer(folder: Path, texts: list[str], vocab_size: int = 2000) -> int:
    """A BERT-style WordPiece tokenizer trained on ``texts`` (Han characters split, lower-cased), saved as
    ``tokenizer.json`` with its ``tokenizer_config.json``. Returns its vocabulary size."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIALS))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]"
    )
    fast.save_pretrained(str(folder))
    return int(fast.vocab_size)


def save_model(
    folder: Path,
    texts: list[str],
    labels: list[str] | None,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    max_positions: int = 128,
    init_range: float = 0.02,
) -> Path:
    """A ``BertForSequenceClassification`` with random weights (``seed``) and the tokenizer, in ``folder``.
    ``labels``: the classes (id2label), or None for a regression head (one output). A wide
    ``init_range`` spreads the random model's scores (the default, 0.02, gives every text about 1/n)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification
    from transformers.utils import logging

    logging.disable_progress_bar()  # "Writing model shards" says nothing here
    folder.mkdir(parents=True, exist_ok=True)
    vocab = save_tokenizer(folder, texts)
    head: dict = (
        {"num_labels": 1, "problem_type": "regression"}
        if labels is None
        else {"id2label": dict(enumerate(labels)), "label2id": {lab: i for i, lab in enumerate(labels)}}
    )
    config = BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=max_positions,
        initializer_range=init_range,
        **head,
    )
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(str(folder))
    return folder


def save_encoder(
    folder: Path, texts: list[str], seed: int = 0, hidden: int = 32, layers: int = 2, max_positions: int = 128
) -> Path:
    """A bare ``BertModel`` (an encoder, no head) with random weights (``seed``) and the tokenizer, in
    ``folder``: what the semantic stage reads as a Hugging Face encoder."""
    import torch
    from transformers import BertConfig, BertModel
    from transformers.utils import logging

    logging.disable_progress_bar()
    folder.mkdir(parents=True, exist_ok=True)
    vocab = save_tokenizer(folder, texts)
    config = BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=4 * hidden,
        max_position_embeddings=max_positions,
    )
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(str(folder))
    return folder
