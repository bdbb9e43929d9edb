"""Byte-level BPE tokenizers in the configurations the fast encoder must reproduce, trained on given text.

Used by tests/tokens/test_fast_bpe.py (small vocabularies on a corpus sample) and bench/perf/fast_encoder.py
(the whole corpus).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

# Llama 3's split: case-insensitive contractions, digits in runs of at most three, a space-or-punctuation prefix
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]


def train_bpe(path: Path, texts: list[str], vocab: int, pre: str, special: list[str], ignore_merges: bool = False) -> Path:
    """``pre``: "bytelevel" (GPT-2 split), "prefix" (the same with add_prefix_space) or "llama3" (Split + ByteLevel)."""
    tok = Tokenizer(models.BPE())
    if pre == "llama3":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=pre == "prefix")
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=special, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer)
    data = json.loads(tok.to_str())
    data["model"]["ignore_merges"] = ignore_merges
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def with_special_tokens(texts: list[str]) -> list[str]:
    """Every third text with added tokens inside, at the start and end, and glued to words; plus edge cases."""
    out = []
    for i, t in enumerate(texts):
        if i % 3 == 0:
            mid = len(t) // 2
            t = f"{SPECIAL[i % 4]}{t[:mid]}{SPECIAL[(i + 1) % 4]} {t[mid:]}x{SPECIAL[0]}{SPECIAL[2]}\n{SPECIAL[3]}"
        out.append(t)
    return out + [SPECIAL[0], "", " ", SPECIAL[1] + SPECIAL[1], "a" + SPECIAL[2] + "b"]
