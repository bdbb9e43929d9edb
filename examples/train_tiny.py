"""Train a tiny causal language model on a datapipe run: raw pages to falling loss on a CPU.

    datapipe run pipelines/demo.yaml                        # packed token shards in out/demo
    python examples/train_tiny.py --run out/demo --steps 300 --out out/train_tiny
    python examples/train_tiny.py --run out/demo --steps 400 --out out/train_tiny \\
        --resume out/train_tiny/ckpt-000300.pt               # continues on the very next sample

The model is `datapipe ablate`'s small GPT (datapipe/ablate/model.py: pre-norm transformer blocks,
causal attention, tied embeddings; 2.4M parameters with the defaults and the demo's 2,676-token
vocabulary), pure torch. Batches
come from ``datapipe.loader.PackedDataset(...).dataloader()`` with the run's mixture weights:
``labels`` are the next tokens, -100 where there is no target (the end of a row, padding).
A checkpoint holds the model, the optimizer, the step and the loader's ``state_dict()`` (about
500 bytes), so a resumed run reads exactly the batches an uninterrupted run would have read.
``--log FILE`` writes per step the loss and a sha256 of the batch's input_ids.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import datapipe.loader
from datapipe.ablate.model import ModelConfig, TinyGPT  # the model `datapipe ablate` trains


def vocab_size(run: Path) -> int:
    """The tokenizer's vocabulary, from the metadata every shard carries."""
    import pyarrow.parquet as pq

    from datapipe.tokens.shard_format import open_shard

    first = pq.read_table(run / "shards" / "manifest.parquet")["path"][0].as_py()
    return open_shard(run / first)[1].vocab_size


def mixture_of(run: Path) -> dict[str, float] | None:
    weights = (json.loads((run / "run.json").read_text()).get("config") or {}).get("mixture")
    return dict(weights) if weights else None


def save(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # a kill while saving leaves the previous checkpoint intact


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=Path, default=Path("out/demo"), help="run folder with shards/ (datapipe run output)")
    p.add_argument("--out", type=Path, default=Path("out/train_tiny"), help="checkpoints and the log go here")
    p.add_argument("--steps", type=int, default=300, help="train until this step (also when resuming)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--d-model", type=int, default=192)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--resume", type=Path, help="a checkpoint file written by this script")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--log", type=Path, help="write per-step loss and batch sha256 as JSON here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)

    # The loader: the run's train split at its mixture weights, one global batch per step.
    ds = datapipe.loader.PackedDataset(
        args.run,
        split="train",
        batch_size=args.batch_size,
        mixture=mixture_of(args.run),
        seed=args.seed,
        fields=("input_ids", "labels"),
        ignore_index=-100,
    )
    shape = ModelConfig(
        d_model=args.d_model,
        layers=args.layers,
        heads=args.heads,
        seq_len=ds.seq_len,
        batch_size=args.batch_size,
        steps=args.steps,
    )
    model = TinyGPT(vocab_size(args.run), shape)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    n_params = sum(t.numel() for t in model.parameters())
    step = 0
    if args.resume is not None:
        ckpt = torch.load(args.resume, weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        ds.load_state_dict(ckpt["loader"])  # the next batch is the one after the checkpoint's last
        step = ckpt["step"]
    print(
        f"train_tiny: {n_params / 1e6:.2f}M parameters, seq_len {ds.seq_len}, batch {args.batch_size}, "
        f"{ds.batches_per_epoch} batches per epoch, from step {step} to {args.steps}"
    )

    def lr_at(s: int) -> float:  # linear warmup, cosine decay to 10%
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        frac = min(1.0, (s - args.warmup) / max(1, args.steps - args.warmup))
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    loader = ds.dataloader(num_workers=args.workers)
    log: dict[str, Any] = {"params": n_params, "start_step": step, "steps": {}}
    started = time.perf_counter()
    model.train()
    while step < args.steps:
        for batch in loader:  # one pass is the rest of the current epoch; the loop starts the next
            ids = batch["input_ids"].long()
            labels = batch["labels"].long()
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            logits = model(ids)
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            digest = hashlib.sha256(batch["input_ids"].numpy().tobytes()).hexdigest()[:16]
            log["steps"][step] = {"loss": loss.item(), "batch": digest}
            if step % 10 == 0 or step == args.steps:
                print(f"step {step:5d}  loss {loss.item():.4f}  lr {lr_at(step - 1):.2e}  {time.perf_counter() - started:.1f}s")
            if step % args.save_every == 0 or step == args.steps:
                save(
                    args.out / f"ckpt-{step:06d}.pt",
                    {
                        "model": model.state_dict(),
                        "optimizer": opt.state_dict(),
                        "loader": ds.state_dict(),
                        "step": step,
                        "args": vars(args),
                    },
                )
            if step >= args.steps:
                break
    if args.log is not None:
        args.log.write_text(json.dumps(log, indent=1))
    return log


if __name__ == "__main__":
    main()
