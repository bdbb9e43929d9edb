"""The benchmarks' tokenizer: a 32k byte-level BPE trained on the shared corpus, trained once and kept.

``tokenizer/demo.json`` (2.7k tokens, trained on the demo inputs) is no tokenizer anyone trains with:
encoding with it is slower per character than with a real vocabulary, and tiktoken-style engines gain
differently. The benchmarks use this one instead, on both sides.

    python -m bench._support.bench_tokenizer        # train (about 1-3 CPU minutes) or print the kept one

It is the recipe of ``datapipe train-tokenizer`` without its sampling (the whole corpus, all four files):
``pre_tokenizers.ByteLevel(add_prefix_space=False)``, the 256-byte initial alphabet, ``min_frequency 2``,
special tokens ``<|endoftext|>`` and ``<|pad|>``. The file is kept under the cache folder
(``$DATAPIPE_CACHE_DIR/bench/``, named by the corpus files' sizes and the vocabulary size).
"""

from __future__ import annotations

import json
from pathlib import Path

from bench._support.corpus import CORPUS, FILES
from bench._support.paths import ROOT

SPECIAL = ["<|endoftext|>", "<|pad|>"]


def bench_tokenizer(vocab_size: int = 32000) -> Path:
    """The kept tokenizer file, trained first when absent."""
    from datapipe.storage.cache import cache_dir

    sizes = "-".join(str((CORPUS / f).stat().st_size) for f in FILES)
    path = Path(cache_dir()) / "bench" / f"bpe{vocab_size // 1000}k-corpus-{sizes}.json"
    if path.exists():
        return path
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def texts():
        for name in FILES:
            with open(CORPUS / name, encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        yield json.loads(line)["text"]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts(), trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tok.save(str(tmp))
    tmp.replace(path)
    return path


def resolve(name: str) -> Path:
    """``--tokenizer`` of the bench scripts: "bpe32k" (default: trained or reused), "demo", or a tokenizer.json path."""
    if name == "bpe32k":
        return bench_tokenizer(32000)
    if name == "demo":
        return ROOT / "tokenizer" / "demo.json"
    return Path(name)


if __name__ == "__main__":
    print(bench_tokenizer())
