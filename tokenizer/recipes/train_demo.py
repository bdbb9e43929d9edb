"""Train tokenizer/demo.json: a small byte-level BPE for the demo pipeline.

Trained on the demo's own sample inputs (pipelines/demo/data), so it is tiny and
reproducible offline. Byte-level: any UTF-8 text encodes, no unknown tokens.

    python tokenizer/recipes/train_demo.py
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parents[2]
SPECIAL = ["<|endoftext|>", "<|pad|>"]


def texts():
    for path in sorted((ROOT / "pipelines" / "demo" / "data").glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                text = json.loads(line).get("text")
            except ValueError:
                continue
            if isinstance(text, str):
                yield text


def main() -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts(), trainer)
    tok.save(str(ROOT / "tokenizer" / "demo.json"))


if __name__ == "__main__":
    main()
