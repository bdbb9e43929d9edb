"""The proxy model of ``datapipe ablate`` and ``datapipe mix-search``: a small decoder-only GPT in
pure torch (pre-norm blocks, causal attention, learned positions, tied embeddings), grown from
``examples/train_tiny.py``, and its named sizes.

A size fixes everything that decides what a run costs and what it can learn: the shape, the
sequence length, the batch, the steps (so the token budget), the learning rate. Candidates of one
ablation are trained at one size, so they see equal tokens.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from datapipe.errors import EXIT_USAGE, DatapipeError


class ModelConfigError(DatapipeError, ValueError):
    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class ModelConfig:
    d_model: int
    layers: int
    heads: int
    seq_len: int
    batch_size: int
    steps: int
    lr: float = 3e-3
    warmup: int = 20
    weight_decay: float = 0.1

    @property
    def tokens(self) -> int:
        """The training token budget: every candidate of an ablation sees exactly this many."""
        return self.steps * self.batch_size * self.seq_len

    def with_overrides(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


# tiny: one candidate x seed in about 1-2 minutes on 2 idle cores (0.77M parameters, 0.40M outside the embeddings with
# the 2,676-token demo vocabulary; 614k tokens); small: ~10M parameters and 20M tokens, for a GPU or a long CPU run.
SIZES: dict[str, ModelConfig] = {
    "micro": ModelConfig(d_model=32, layers=1, heads=2, seq_len=64, batch_size=4, steps=12, warmup=2),
    "tiny": ModelConfig(d_model=128, layers=2, heads=4, seq_len=256, batch_size=8, steps=300, lr=3e-3, warmup=20),
    "small": ModelConfig(d_model=384, layers=6, heads=6, seq_len=512, batch_size=32, steps=1200, lr=1.5e-3, warmup=100),
}


def model_config(size: str) -> ModelConfig:
    """A named size, or a JSON object of ModelConfig fields (a custom size) over ``tiny``'s."""
    if size in SIZES:
        return SIZES[size]
    if size.lstrip().startswith("{"):
        try:
            fields = json.loads(size)
        except json.JSONDecodeError as exc:
            raise ModelConfigError(f"--size: not a JSON object ({exc})") from None
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ModelConfigError(f"--size: unknown fields {unknown}; allowed: {', '.join(sorted(known))}")
        cfg = dataclasses.replace(SIZES["tiny"], **fields)
        if cfg.d_model % cfg.heads:
            raise ModelConfigError(f"--size: d_model {cfg.d_model} is not a multiple of heads {cfg.heads}")
        return cfg
    raise ModelConfigError(f"--size {size!r}: allowed: {', '.join(SIZES)}, or a JSON object of model fields")


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, cfg: ModelConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.heads) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.tok.weight.T  # tied output embedding

    def parameter_counts(self) -> tuple[int, int]:
        """(all parameters, those outside the embeddings): scaling laws count the second."""
        total = sum(p.numel() for p in self.parameters())
        return total, total - self.tok.weight.numel() - self.pos.weight.numel()
