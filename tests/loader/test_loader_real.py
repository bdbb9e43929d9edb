"""The loader over shards packed from real zh/en Wikipedia text: every row exactly once per
epoch, positions restart at real document starts, whole documents decode to the originals,
and a resumed loader continues with the same batches."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from datapipe.loader import PackedDataset, StateMismatch
from datapipe.pipeline.load import TokenizeConfig
from datapipe.tokens.encode import encode_documents, load_tokenizer_info
from datapipe.tokens.packing import BestFitPacker, concat_rows
from datapipe.tokens.shard_format import ShardMeta, file_sha256, open_shard, tokens_view
from datapipe.tokens.shard_writer import write_shard
from tests.support.loader_helpers import write_manifest
from tests.support.shared_data import PROJECT_ROOT, shared_path

TOKENIZER = PROJECT_ROOT / "tokenizer" / "demo.json"


def _real_run(root: Path) -> tuple[Path, list[str], int]:
    """Three shards per language of best-fit rows (seq_len 128) and the run's manifest."""
    cfg = TokenizeConfig(tokenizer=str(TOKENIZER), seq_len=128, labels=True, packing="bestfit")
    info = load_tokenizer_info(TOKENIZER, cfg)
    recs, texts = [], []
    for source, name in (("zh", "zh_wikipedia.jsonl"), ("en", "en_wikipedia.jsonl")):
        with shared_path("corpus", name).open(encoding="utf-8") as f:
            docs = [json.loads(next(f))["text"][:600] for _ in range(90)]
        texts += docs
        for k in range(3):
            lists = encode_documents(docs[k * 30 : (k + 1) * 30], info)
            packer = BestFitPacker(cfg.seq_len + 1, info.pad_id, np.dtype(info.dtype), window=16)
            rows = concat_rows(
                [packer.add(lists.values.to_numpy(), lists.offsets.to_numpy()), packer.finish()],
                cfg.seq_len + 1,
                np.dtype(info.dtype),
            )
            meta = ShardMeta(
                tokenizer_fingerprint=info.fingerprint,
                vocab_size=info.vocab_size,
                seq_len=cfg.seq_len,
                row_len=cfg.seq_len + 1,
                eos_id=info.eos_id,
                pad_id=info.pad_id,
                bos_id=None,
                packing="bestfit",
                source=source,
                split="train",
                dtype=info.dtype,
            )
            rel = f"shards/{source}/train-{k:05d}.arrow"
            meta = write_shard(root / rel, rows.tokens, rows.doc_start_splits, rows.doc_start_values, rows.n_tokens, meta)
            recs.append(
                {
                    "path": rel,
                    "source": source,
                    "split": "train",
                    "rows": len(rows.n_tokens),
                    "tokens": meta.tokens,
                    "sha256": file_sha256(root / rel),
                    "tokenizer_fingerprint": info.fingerprint,
                    "seq_len": cfg.seq_len,
                    "row_len": cfg.seq_len + 1,
                }
            )
    write_manifest(root, recs)
    return root, texts, info.eos_id


def test_loader_on_real_text(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    run, texts, eos = _real_run(tmp_path)
    tok = Tokenizer.from_file(str(TOKENIZER))
    ds = PackedDataset(run, backend="numpy", batch_size=4, seed=7)
    rows = Counter()
    decoded = []
    for batch in ds:
        for ids, lab, pos, cu, n in zip(
            batch["input_ids"], batch["labels"], batch["position_ids"], batch["cu_seqlens"], batch["num_segments"]
        ):
            rows[np.append(ids, lab[-1]).tobytes()] += 1
            bounds = cu[: n + 1]
            assert np.array_equal(np.nonzero(pos == 0)[0], bounds[:-1])  # positions restart at each segment
            for a, b in zip(bounds[:-1], bounds[1:]):
                # Inside a row, a segment starts at a document start; ending in EOS, it is whole.
                if a > 0 and ids[b - 1] == eos:
                    decoded.append(tok.decode(ids[a : b - 1].tolist()))
    # Every row of the split exactly once (the epoch drops fewer than one global batch).
    every = Counter()
    for m in ds.manifest.paths:
        table, _ = open_shard(run / m)
        every.update(r.tobytes() for r in tokens_view(table))
    assert sum(rows.values()) == ds.samples_per_epoch and sum(every.values()) - ds.samples_per_epoch < 4
    assert all(rows[k] == 1 and every[k] >= 1 for k in rows)
    # Whole documents inside samples decode to the original texts.
    originals = set(texts)
    assert len(decoded) > 15 and all(d in originals for d in decoded), [d for d in decoded if d not in originals][:3]

    # Resume mid-epoch: the same batches follow.
    ds2 = PackedDataset(run, backend="numpy", batch_size=4, seed=7)
    it = iter(ds2)
    for _ in range(5):
        next(it)
    state = ds2.state_dict()
    rest = [b["input_ids"].copy() for b in it]
    ds3 = PackedDataset(run, backend="numpy", batch_size=4, seed=7)
    ds3.load_state_dict(state)
    assert all(np.array_equal(a, b["input_ids"]) for a, b in zip(rest, ds3, strict=True))

    # Resumed with a mixture over fewer sources: the message names the mixture, not the shards
    # (which did not change), also for a state saved before it recorded its sources.
    both = PackedDataset(run, backend="numpy", batch_size=4, seed=7, mixture={"zh": 1, "en": 1})
    next(iter(both))
    legacy = {k: v for k, v in both.state_dict().items() if k != "sources"}
    for saved, was in ((state, "no mixture"), (both.state_dict(), "mixture {'en': 1, 'zh': 1}"), (legacy, "mixture {")):
        with pytest.raises(StateMismatch) as refused:
            PackedDataset(run, backend="numpy", batch_size=4, seed=7, mixture={"zh": 1}).load_state_dict(saved)
        message = str(refused.value)
        assert "mixture changed" in message and "shards changed" not in message, message
        assert "it read sources ['en', 'zh'] (" + was in message and "this loader reads ['zh'] (mixture {'zh': 1})" in message
