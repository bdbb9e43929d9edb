"""A pack task holds one output shard at a time: a written shard is freed before the next one fills.

The callers' loop variable once kept the shard just written alive while the whole next one filled
(two shards at once: a 2^26-token pack task of the scale corpus peaked 65 MiB above its start
instead of 48). Checked by reference, not by RSS: when the shard buffer starts a new shard, no
shard written before may still be alive."""

from __future__ import annotations

import weakref
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa

from datapipe.engine.tasks import pack
from datapipe.engine.tasks.sinks import TokenSink
from datapipe.tokens.encode import TOKENS_TYPE
from datapipe.tokens.packing import ShardBuffer


def _setup(tmp_path: Path, packing: str):
    rng = np.random.default_rng(7)
    root = tmp_path / "run"
    keys = ["src/00000", "src/00001"]
    for key in keys:  # two input shards of 60 documents of 5-40 tokens, written as map tasks write them
        path = root / "_work" / "tokens" / f"{key}.arrow"
        path.parent.mkdir(parents=True, exist_ok=True)
        sink = TokenSink(path)
        for batch in range(3):
            docs = [rng.integers(0, 2000, rng.integers(5, 40)).astype(np.uint32) for _ in range(20)]
            ids = pa.array([f"{key}:{batch}:{i}" for i in range(20)])
            sink.write(ids, pa.array(["train"] * 20), pa.array([d.tolist() for d in docs], TOKENS_TYPE))
        sink.close()
    folder = SimpleNamespace(
        root=root,
        tokens_file=lambda key: root / "_work" / "tokens" / f"{key}.arrow",
        shard_file=lambda source, split, i: root / "shards" / source / f"{split}-{i:05d}.arrow",
    )
    spec = SimpleNamespace(
        tokenizer=SimpleNamespace(fingerprint="f", vocab_size=2000, eos_id=1, pad_id=0, bos_id=None, dtype="uint16"),
        tokenize=SimpleNamespace(seq_len=16, labels=False, packing=packing, bestfit_window=32, rows_per_shard=8),
        shards_of=lambda source: [SimpleNamespace(key=k) for k in keys],
        repeats={},
    )
    return spec, folder


def test_a_written_shard_is_freed_before_the_next_one_fills(tmp_path: Path, monkeypatch) -> None:
    written: list[weakref.ref] = []
    starts = {"shards": 0, "alive": 0}
    real_write = pack.write_shard

    def write_shard(path, tokens, *args, **kwargs):
        written.append(weakref.ref(tokens.base if tokens.base is not None else tokens))
        return real_write(path, tokens, *args, **kwargs)

    class CheckedBuffer(ShardBuffer):
        def add(self, rows):
            for shard in super().add(rows):
                yield shard
                del shard  # this wrapper's own reference is not the one in question
            # The buffer went on (or stopped) after handing out every shard: what was written
            # before is the caller's to drop by now, and a partly filled next shard may exist.
            if self._tokens is not None and self.count:
                starts["shards"] += 1
                starts["alive"] += sum(ref() is not None for ref in written)

    monkeypatch.setattr(pack, "write_shard", write_shard)
    monkeypatch.setattr(pack, "ShardBuffer", CheckedBuffer)
    for packing in ("concat", "bestfit"):
        written.clear()
        spec, folder = _setup(tmp_path / packing, packing)
        manifest = pack._pack_split(spec, folder, "src", "train")
        assert len(manifest) >= 4  # several shards of 8 rows: the case in question
    assert starts["shards"] > 0
    assert starts["alive"] == 0, "a written shard was still referenced while the next one filled"
