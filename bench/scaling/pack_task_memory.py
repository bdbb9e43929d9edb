"""Peak memory of one concat pack task against the tokens it packs (``pack_plan.TOKENS_PER_TASK``), and
whether larger tasks write the same shard files (issue 30: 65,321 pack tasks at crawl scale, 30% of
the run's tasks, each a driver dispatch).

    python -m bench.scaling.pack_task_memory [--tasks-log2 26,28] [--repeats 2] [--json PATH]

One map task's token file (TokenSink, as map tasks write it: documents of 50-3,000 tokens, 2^25
tokens, ``train``) stands for every input shard (its key repeated, as many as the largest task
needs). Output files of ``seq_len`` 2,048 x 8,192 rows (2^24 tokens, 32 MiB of uint16). For each
task size, in a fresh process: the task packing files [0, n) (``engine/tasks/pack._pack_concat_range``,
what ``pack_range`` runs), its CPU seconds and its peak RSS above its start (VmHWM reset through
``/proc/self/clear_refs`` when it starts, as ``runtime/task_usage`` does). Then the smaller tasks
covering the largest one's files are run one after another and every file's sha256 compared.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from bench._support.paths import ROOT

SEQ_LEN = 2048
ROWS_PER_SHARD = 8192
FILE_TOKENS = 1 << 25


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def make_tokens(path: Path) -> int:
    import numpy as np
    import pyarrow as pa

    from datapipe.engine.tasks.sinks import TokenSink
    from datapipe.tokens.encode import TOKENS_TYPE

    rng = np.random.default_rng(26)
    sink = TokenSink(path)
    total = 0
    while total < FILE_TOKENS:
        lengths = rng.integers(50, 3000, 1000)
        flat = rng.integers(3, 32000, int(lengths.sum())).astype(np.uint32)
        offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
        tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat)).cast(TOKENS_TYPE)
        ids = pa.array([f"doc{total}-{i}" for i in range(len(lengths))])
        sink.write(ids, pa.array(["train"] * len(lengths)), tokens)
        total += int(lengths.sum())
    sink.close()
    return total


def run_task(work: Path, first: int, n_files: int, inputs: int, per_file: int) -> dict:
    """One pack task of files [first, first + n_files), in this process."""

    from datapipe.engine.pack_plan import PackRange
    from datapipe.engine.tasks import pack

    root = work / "run"
    folder = SimpleNamespace(
        root=root,
        tokens_file=lambda key: work / "tokens.arrow",
        shard_file=lambda source, split, i: root / "shards" / source / f"{split}-{i:05d}.arrow",
    )
    spec = SimpleNamespace(
        tokenizer=SimpleNamespace(fingerprint="f", vocab_size=32000, eos_id=1, pad_id=0, bos_id=None, dtype="uint16"),
        tokenize=SimpleNamespace(
            seq_len=SEQ_LEN, labels=False, packing="concat", bestfit_window=32, rows_per_shard=ROWS_PER_SHARD
        ),
    )
    rng = PackRange("src", "train", 0, first, n_files, False, 0, tuple((f"in{i:04d}", per_file) for i in range(inputs)))
    Path("/proc/self/clear_refs").write_text("5")
    start = _kib("VmRSS")
    cpu = time.process_time()
    manifest = pack._pack_concat_range(spec, folder, rng)  # type: ignore[arg-type]
    cpu = time.process_time() - cpu
    peak = _kib("VmHWM")
    return {
        "first_file": first,
        "n_files": n_files,
        "tokens": n_files * SEQ_LEN * ROWS_PER_SHARD,
        "cpu_s": cpu,
        "rss_start_mib": start / 1024,
        "peak_mib": peak / 1024,
        "growth_mib": (peak - start) / 1024,
        "files": [m["path"] for m in manifest],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks-log2", default="26,28", help="log2 of the tokens per task to compare")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:  # work, first, n_files, inputs, per_file
        w, first, n, inputs, per_file = a.child.split(",")
        print(json.dumps(run_task(Path(w), int(first), int(n), int(inputs), int(per_file))))
        return 0
    sizes = [int(x) for x in a.tasks_log2.split(",")]
    span = SEQ_LEN * ROWS_PER_SHARD
    with tempfile.TemporaryDirectory(prefix="pack-mem-") as tmp:
        work = Path(tmp)
        per_file = make_tokens(work / "tokens.arrow")
        largest = (1 << max(sizes)) // span
        inputs = -(-(largest + 1) * span // per_file)

        def child(first: int, n: int) -> dict:
            arg = f"{work},{first},{n},{inputs},{per_file}"
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            out = subprocess.run(
                [sys.executable, "-m", __spec__.name, "--child", arg], check=True, capture_output=True, text=True, env=env
            )
            return json.loads(out.stdout.strip().splitlines()[-1])

        results = []
        for rep in range(a.repeats):
            for lg in sizes:
                r = child(0, (1 << lg) // span)
                r.update(repeat=rep, log2=lg)
                results.append({k: v for k, v in r.items() if k != "files"})
                print(json.dumps(results[-1]), flush=True)
        # Byte-identical: the largest task's files, then the smallest tasks covering them.
        shards = work / "run" / "shards" / "src"
        child(0, largest)
        big = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(shards.glob("*.arrow"))}
        for p in shards.glob("*.arrow"):
            p.unlink()
        step = (1 << min(sizes)) // span
        for first in range(0, largest, step):
            child(first, step)
        small = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(shards.glob("*.arrow"))}
        same = big == small and len(big) == largest
        print(
            f"{len(big)} shard files; the same bytes from one task of 2^{max(sizes)} tokens and from "
            f"{largest // step} of 2^{min(sizes)}: {same}"
        )
    out = {
        "bench": "pack_task_memory",
        "seq_len": SEQ_LEN,
        "rows_per_shard": ROWS_PER_SHARD,
        "runs": results,
        "shard_files": len(big),
        "identical": same,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if a.json:
        from bench._support.harness import environment

        a.json.write_text(json.dumps({**out, "env": environment()}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
