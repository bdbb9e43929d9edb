"""The named sizes of the proxy model (``datapipe ablate --size``, ``datapipe mix-search``).

A size fixes everything that decides what a run costs and what it can learn: the shape, the
sequence length, the batch, the steps (so the token budget), the learning rate. Candidates of one
ablation are trained at one size, so they see equal tokens. Plain data: reading a size needs no torch
(``model.py`` builds the network from it).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

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


# micro: for tests; tiny: one candidate x seed in minutes on two CPU cores; small: ~10M parameters and
# 20M tokens, for a GPU or a long CPU run.
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
