"""Training one proxy: one candidate's data, one seed, one size; resumable and deterministic.

The checkpoint (``ckpt.pt``, replaced atomically every ``save_every`` steps) holds the model, the
optimizer, the loader's ``state_dict()`` (the exact next sample), the torch RNG state and the
per-step losses, so a run killed at any point and started again continues from the last
checkpoint and ends with the same weights and numbers as one never interrupted (the steps after
the checkpoint are redone on the same batches; CPU kernels are put in deterministic mode and the
thread count is part of the record, since a float sum over other threads rounds differently).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import datapipe.loader
from datapipe.ablate.model import TinyGPT
from datapipe.ablate.sizes import ModelConfig
from datapipe.errors import EXIT_USAGE, DatapipeError
from datapipe.loader.torch_adapter import TorchPackedDataset
from datapipe.runtime.faults import fault_point
from datapipe.runtime.heartbeat import Heartbeat, eta

CHECKPOINT = "ckpt.pt"


class ProxyTrainingError(DatapipeError, RuntimeError):
    """A proxy model cannot be trained as asked (a device torch does not see, a checkpoint of other settings)."""

    exit_code = EXIT_USAGE


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ProxyTrainingError(f"--device {device}: torch sees no CUDA device here; use --device cpu or auto")
    return torch.device(device)


def make_deterministic(seed: int, device: torch.device, threads: int) -> None:
    torch.manual_seed(seed)
    if threads:
        torch.set_num_threads(threads)
    if device.type == "cuda":  # cuBLAS is deterministic only with a fixed workspace
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")


def lr_at(cfg: ModelConfig, step: int) -> float:
    """Linear warmup, cosine decay to 10% at the last step."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _save(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # a kill while saving leaves the previous checkpoint whole


def vocab_size(data_dir: Path) -> int:
    import pyarrow.parquet as pq

    from datapipe.tokens.shard_format import open_shard

    first = pq.read_table(data_dir / "shards" / "manifest.parquet")["path"][0].as_py()
    return open_shard(data_dir / first)[1].vocab_size


def load_trained(data_dir: Path, cfg: ModelConfig, out_dir: Path, device: torch.device) -> TinyGPT | None:
    """The model of a finished run, from its last checkpoint (saved at the last step), or None when the
    folder holds no checkpoint of that step."""
    path = out_dir / CHECKPOINT
    if not path.is_file():
        return None
    ckpt = torch.load(path, weights_only=False, map_location=device)
    if ckpt["step"] != cfg.steps:
        return None
    model = TinyGPT(vocab_size(data_dir), cfg).to(device)
    model.load_state_dict(ckpt["model"])
    return model


def _progress(label: str, step: int, first: int, total: int, losses: list[float], elapsed: float) -> str:
    """One progress line: where the run is, its recent loss, and the time left at this attempt's pace."""
    done = step - first  # steps this attempt trained: a resumed run's earlier steps took no time here
    recent = losses[-20:]
    line = f"{label}: step {step}/{total}"
    if recent:
        line += f", loss {sum(recent) / len(recent):.3f}"
    if done > 0:
        line += f", {done / max(elapsed, 1e-9):.2f} steps/s"
    left = eta(elapsed, done, total - first)
    return line + (f", ETA {left}" if left else "")


def _train_steps(
    model: TinyGPT,
    opt: torch.optim.Optimizer,
    loader: Any,
    ds: TorchPackedDataset,
    cfg: ModelConfig,
    step: int,
    losses: list[float],
    ckpt_path: Path,
    save_every: int,
    device: torch.device,
) -> int:
    """Train from ``step`` to ``cfg.steps`` (appending to ``losses``, a checkpoint every ``save_every``); the last step."""
    while step < cfg.steps:
        for batch in loader:  # one pass is the rest of the current epoch; the while loop starts the next
            ids = batch["input_ids"].to(device).long()
            labels = batch["labels"].to(device).long()
            for group in opt.param_groups:
                group["lr"] = lr_at(cfg, step)
            logits = model(ids)
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            losses.append(float(loss.item()))
            if step % save_every == 0 or step == cfg.steps:
                _save(
                    ckpt_path,
                    {
                        "model": model.state_dict(),
                        "optimizer": opt.state_dict(),
                        "loader": ds.state_dict(),
                        "rng": torch.get_rng_state(),
                        "step": step,
                        "losses": losses,
                    },
                )
            fault_point("ablate-step", step)  # tests: DATAPIPE_FAULT_KILL_AT=ablate-step:N SIGKILLs here
            if step >= cfg.steps:
                break
    return step


def train(
    data_dir: Path,
    mixture: dict[str, float] | None,
    cfg: ModelConfig,
    seed: int,
    out_dir: Path,
    device: torch.device,
    threads: int = 0,
    save_every: int = 50,
    log: Callable[[str], None] = lambda _: None,
    label: str = "train",
) -> tuple[TinyGPT, dict[str, Any]]:
    """Train (or resume) to ``cfg.steps``; the model and what the run did. While it trains, a line every
    $DATAPIPE_PROGRESS_INTERVAL seconds (runtime/heartbeat.py) on stderr says ``label``, the step, the
    mean loss of the last steps and the time left at this run's pace."""
    out_dir.mkdir(parents=True, exist_ok=True)
    make_deterministic(seed, device, threads)
    ds = datapipe.loader.PackedDataset(
        data_dir,
        split="train",
        batch_size=cfg.batch_size,
        mixture=mixture,
        seed=seed,
        fields=("input_ids", "labels"),
        ignore_index=-100,
    )
    assert isinstance(ds, TorchPackedDataset)  # torch is installed: the adapter, with dataloader()
    if ds.seq_len != cfg.seq_len:
        raise ProxyTrainingError(f"{data_dir} is packed at seq_len {ds.seq_len}, the model needs {cfg.seq_len}")
    model = TinyGPT(vocab_size(data_dir), cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    step, losses, resumed_from = 0, [], None
    ckpt_path = out_dir / CHECKPOINT
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False, map_location=device)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        ds.load_state_dict(ckpt["loader"])  # the next batch is the one after the checkpoint's last
        torch.set_rng_state(ckpt["rng"])
        step, losses, resumed_from = ckpt["step"], list(ckpt["losses"]), ckpt["step"]
        log(f"resumed at step {step} from {ckpt_path}")
    started, cpu_started = time.perf_counter(), time.process_time()
    model.train()
    loader = ds.dataloader(num_workers=0)
    first_step = step
    # the step is len(losses), read by the heartbeat's thread as the loop appends (one loss a step)
    with Heartbeat(lambda elapsed: _progress(label, len(losses), first_step, cfg.steps, losses, elapsed)):
        step = _train_steps(model, opt, loader, ds, cfg, step, losses, ckpt_path, save_every, device)
    total, non_embedding = model.parameter_counts()
    tail = losses[-max(1, min(20, len(losses))) :]
    return model, {
        "steps": step,
        "tokens": step * cfg.batch_size * cfg.seq_len,
        "params": total,
        "non_embedding_params": non_embedding,
        "train_loss_last": sum(tail) / len(tail),
        "epochs": step * cfg.batch_size / max(1, ds.batches_per_epoch * cfg.batch_size),
        "resumed_from": resumed_from,
        "wall_s": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu_started,  # on a busy machine, closer to an idle one's wall time
        "device": str(device),
        "threads": torch.get_num_threads(),
    }
