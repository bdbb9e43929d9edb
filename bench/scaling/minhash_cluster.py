"""Every MinHash task's peak memory and CPU with a planted cluster of a million near-copies.

    python -m bench.scaling.minhash_cluster [--docs 1000000] [--files 64] [--partitions 64] [--jobs 2] [--json PATH]

Two corpora of ``--docs`` documents each: **cluster**, every document a near-copy of one page (a
boilerplate page copied across a crawl), and **distinct**, no two documents alike. The documents'
MinHash signatures are built directly rather than from text, to save the shingling of a million
texts (``tests/dedup/test_minhash_planted_cluster.py`` covers real text): a copy is the page's
signature with 5 of its 128 values replaced by values drawn from the document's number (estimated
Jaccard ~0.96 to the page, ~0.92 between copies; each band keeps the page's key in 70% of the
copies, as real near-copies do); a distinct document's signature is all drawn. Everything else
is the real run: the pipeline is minhash alone (threshold 0.7, 128 permutations), one map task
per input file (``--files``), ``--partitions`` partitions, and every task runs the engine's own
task function (``map_shard``, each round's merges and ``reduce_partition``, the combine step
``reduce_stage``) on the files the tasks before it wrote.

Each task runs in a process forked for it from one that has the imports loaded and no data, as a
fresh Ray worker (``--jobs`` at a time); its peak RSS (VmHWM, reset through /proc/self/clear_refs)
and CPU time (the child's rusage) are the task's. Printed: per phase and round the tasks, their
largest peak RSS and CPU, and the most rows one task received; then the largest task of all against
the bound (2 GiB, 10 CPU minutes) and against the distinct corpus (the ratio says what the cluster
adds). The decisions are checked: the copies are one cluster, every copy but its survivor dropped.

Machines here are shared: CPU seconds are the task's own but slowed by contention for caches and
memory bandwidth; wall times are not reported.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from bench._support.harness import Harness, add_args

GIB = 1024.0  # MiB
BOUND_MIB, BOUND_CPU_S = 2 * GIB, 600.0


CHANGED = 5  # signature values a copy changes, of 128


def make_corpus(folder: Path, docs: int, files: int, partitions: int) -> None:
    """Input files of short texts: the signatures are the stage's patched ``compute`` (``_planted``)."""
    (folder / "data").mkdir(parents=True)
    per_file = -(-docs // files)
    for f in range(files):
        first, last = f * per_file, min(docs, (f + 1) * per_file)
        (folder / "data" / f"part-{f:05d}.jsonl").write_text("".join(f'{{"text": "doc {i}"}}\n' for i in range(first, last)))
    (folder / "pipeline.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "cluster",
                "sources": [{"name": "web", "kind": "text", "paths": ["data/*.jsonl"]}],
                "split": {"group_small_files": False},  # one map task per file
                "stages": [{"minhash": {"threshold": 0.7, "partitions": partitions}}],
            }
        )
    )


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64: a document's drawn values depend only on its number."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x += np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def planted_signatures(numbers: np.ndarray, cluster: bool, num_perm: int = 128) -> np.ndarray:
    """Signatures of documents ``numbers``: near-copies of one page's, or all drawn."""
    n = len(numbers)
    cells = numbers.astype(np.uint64)[:, None] * np.uint64(num_perm) + np.arange(num_perm, dtype=np.uint64)
    drawn = (_mix(cells) >> np.uint64(32)).astype(np.uint32)
    if not cluster:
        return drawn
    page = (_mix(np.arange(num_perm, dtype=np.uint64) + np.uint64(1 << 40)) >> np.uint64(32)).astype(np.uint32)
    sigs = np.tile(page, (n, 1))
    which = (_mix(cells[:, :CHANGED] + np.uint64(1 << 50)) % np.uint64(num_perm)).astype(np.int64)
    rows = np.repeat(np.arange(n), CHANGED).reshape(n, CHANGED)
    sigs[rows, which] = drawn[rows, which]
    return sigs


def _planted(cluster: bool):
    """``MinHashDedup.compute`` with the signatures built from each document's number ("doc N")."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from datapipe.stages.columns import set_column
    from datapipe.stages.minhash import SIG_COLUMN

    def compute(self, batch):
        numbers = pc.cast(pc.utf8_slice_codeunits(batch["text"], 4), pa.int64()).to_numpy()
        sigs = planted_signatures(numbers, cluster, self.options.num_perm)
        buf = pa.py_buffer(np.ascontiguousarray(sigs).tobytes())
        return set_column(batch, SIG_COLUMN, pa.Array.from_buffers(pa.binary(4 * self.options.num_perm), len(sigs), [None, buf]))

    return compute


def _peak_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _start(fn) -> tuple[int, int]:
    """Fork a child that runs ``fn``; (its pid, the pipe it reports on)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here on: this task's
        except OSError:
            pass
        result = fn()
        os.write(write, json.dumps({"result": result, "peak": _peak_mib()}, default=str).encode())
        os._exit(0)
    os.close(write)
    return pid, read


def run_tasks(tasks: list, jobs: int) -> list[tuple[dict, float, float]]:
    """Each of ``tasks`` in its own forked child, ``jobs`` at a time: (result, peak RSS MiB, CPU s) each."""
    out: list = [None] * len(tasks)
    running: dict[int, tuple[int, int]] = {}  # pid -> (task index, pipe)
    todo = list(enumerate(tasks))
    while todo or running:
        while todo and len(running) < jobs:
            i, fn = todo.pop(0)
            pid, pipe = _start(fn)
            running[pid] = (i, pipe)
        pid, status, usage = os.wait4(-1, 0)
        i, pipe = running.pop(pid)
        with os.fdopen(pipe) as f:
            got = f.read()
        if status or not got:
            raise RuntimeError("a task failed in its child process")
        report = json.loads(got)
        out[i] = (report["result"], report["peak"], usage.ru_utime + usage.ru_stime)
    return out


def run_all(root: Path, cluster: bool, jobs: int) -> dict:
    """Every task of the run, each in a forked child: per phase/round the largest peak and CPU."""
    from datapipe.engine.plan import build_stage, make_spec
    from datapipe.engine.tasks.map import map_shard
    from datapipe.engine.tasks.merge import merge_group, merge_groups, round_writers
    from datapipe.engine.tasks.reduce import reduce_partition, reduce_stage
    from datapipe.pipeline.load import load_pipeline
    from datapipe.stages import PartitionStep
    from datapipe.stages.global_stage import step_of
    from datapipe.stages.minhash import MinHashDedup

    MinHashDedup.compute = _planted(cluster)  # type: ignore[method-assign]  # inherited by the forked tasks
    spec = make_spec(load_pipeline(root / "pipeline.yaml"), root / "out", root / "cache")
    seg = spec.segments[0]
    step = step_of(build_stage(spec, seg.compute_global), PartitionStep)
    assert step is not None
    phases: dict[str, dict] = {}

    def record(name: str, fns: list) -> list[dict]:
        results = []
        for result, peak, cpu in run_tasks(fns, jobs):
            p = phases.setdefault(name, {"tasks": 0, "peak_mib": 0.0, "cpu_s": 0.0, "cpu_total_s": 0.0, "rows_in": 0})
            p["tasks"] += 1
            p["peak_mib"] = max(p["peak_mib"], peak)
            p["cpu_s"] = max(p["cpu_s"], cpu)
            p["cpu_total_s"] += cpu
            p["rows_in"] = max(p["rows_in"], int(result.get("rows_in", 0)) if isinstance(result, dict) else 0)
            results.append(result)
        return results

    record("map", [lambda s=s: map_shard(spec, s, seg) for s in spec.shards])
    for r in range(step.rounds):
        groups = merge_groups(spec, round_writers(spec, seg, r))
        if groups:
            record(f"round {r} merge", [lambda g=g, r=r: merge_group(spec, seg, r, g) for g in range(groups)])
        done = record(f"round {r}", [lambda p=p, r=r: reduce_partition(spec, seg, p, r) for p in range(step.partitions)])
        if not sum(d["forwarded"] for d in done):
            break  # the engine plans no task for the rounds after one that forwarded nothing
    record("combine", [lambda: reduce_stage(spec, seg)])
    return phases


def check(root: Path, docs: int) -> dict:
    """The decisions: near duplicates dropped, and the survivors' cluster sizes."""
    import pyarrow.parquet as pq

    from datapipe.engine.plan import build_stage, make_spec
    from datapipe.engine.tasks.reduce import partition_decisions, partition_state
    from datapipe.engine.work_files import WorkFiles
    from datapipe.pipeline.load import load_pipeline
    from datapipe.run_folder.layout import RunFolder

    spec = make_spec(load_pipeline(root / "pipeline.yaml"), root / "out", root / "cache")
    seg = spec.segments[0]
    folder = RunFolder(root / "out")
    stage = build_stage(spec, seg.compute_global)
    dropped, survivors, sizes = 0, set(), []
    for s in spec.shards:
        for t in (partition_decisions(folder, seg.index, stage, s.ordinal),):
            if t is not None:
                dropped += t.num_rows
                survivors |= set(t["dup_of"].to_pylist())
        state = partition_state(folder, seg.index, stage, s.ordinal)
        if state is not None:
            sizes += state["dup_count"].to_pylist()
        path = WorkFiles(folder).decisions_file(seg.index, s.key)
        if path.exists():
            dropped += pq.read_metadata(path).num_rows
    return {
        "dropped": dropped,
        "survivors": len(survivors),
        "largest_cluster": max(sizes, default=1),
        "in_clusters": sum(sizes),
        "clusters": len(sizes),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=64, help="input files, one map task each")
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=2, help="tasks run at a time (each in its own process)")
    ap.add_argument("--keep", action="store_true", help="keep the run folders (printed)")
    ap.add_argument("--only", choices=["distinct", "cluster"], help="run one of the two corpora")
    add_args(ap, repeats=1)
    a = ap.parse_args(argv)
    h = Harness(
        "minhash_cluster", a, libs=["numba"], note=f"{a.docs:,} documents, {a.files} map tasks, {a.partitions} partitions"
    )
    results: dict[str, dict] = {}
    for corpus in [a.only] if a.only else ["distinct", "cluster"]:
        root = Path(tempfile.mkdtemp(prefix=f"dp-mhc-{corpus}-"))
        try:
            started = time.perf_counter()
            make_corpus(root, a.docs, a.files, a.partitions)
            phases = run_all(root, corpus == "cluster", a.jobs)
            print(f"{corpus}: {a.docs:,} documents in {a.files} files, {time.perf_counter() - started:.0f} s", flush=True)
            results[corpus] = {"phases": phases, "decisions": check(root, a.docs)}
            print(f"  decisions: {results[corpus]['decisions']}", flush=True)
        finally:
            if a.keep:
                print(f"  kept {root}")
            else:
                shutil.rmtree(root, ignore_errors=True)
    print(f"\n{'phase':<18}" + "".join(f"{f'{c} tasks':>16}{'peak MiB':>10}{'CPU s':>8}{'rows in':>10}" for c in results))
    names = list(dict.fromkeys(n for r in reversed(results.values()) for n in r["phases"]))
    for name in names:
        cells = ""
        for c in results:
            p = results[c]["phases"].get(name)
            cells += f"{p['tasks']:>16}{p['peak_mib']:>10.0f}{p['cpu_s']:>8.1f}{p['rows_in']:>10,}" if p else f"{'-':>44}"
        print(f"{name:<18}{cells}")
    for c, r in results.items():
        peak = max(p["peak_mib"] for p in r["phases"].values())
        cpu = max(p["cpu_s"] for p in r["phases"].values())
        rounds = sum(1 for n in r["phases"] if n.startswith("round ") and "merge" not in n)
        h.figure(f"{c}: largest task peak RSS", [peak], unit="MiB")
        h.figure(f"{c}: largest task CPU", [cpu], unit="s")
        h.figure(f"{c}: rounds with tasks", [rounds], unit="rounds")
        h.figure(
            f"{c}: total CPU of the rounds",
            [sum(p["cpu_total_s"] for n, p in r["phases"].items() if n.startswith("round"))],
            unit="s",
        )
        within = "within" if peak <= BOUND_MIB and cpu <= BOUND_CPU_S else "OVER"
        print(f"{c}: largest task {peak:.0f} MiB, {cpu:.1f} CPU s: {within} the bound ({BOUND_MIB:.0f} MiB, {BOUND_CPU_S:.0f} s)")
    if len(results) == 2:
        for what in ("peak_mib", "cpu_s"):
            mx = {c: max(p[what] for p in r["phases"].values()) for c, r in results.items()}
            h.ratio(
                f"largest task {what}: cluster / distinct",
                [mx["cluster"] / mx["distinct"]],
                target="<= 1.25" if what == "peak_mib" else "",
            )
    cluster = results.get("cluster", {}).get(
        "decisions", {"dropped": 0, "largest_cluster": a.docs, "in_clusters": 0, "clusters": 0}
    )
    # The copies are one cluster (a copy that kept none of the page's 14 band keys, about one in 10^7,
    # stays alone), and every member of a cluster but its survivor is dropped.
    ok = (
        cluster.get("largest_cluster", 0) >= 0.9999 * a.docs
        and cluster.get("dropped") == cluster["in_clusters"] - cluster["clusters"]
    )
    print(f"cluster settled whole: {ok} ({cluster})")
    h.finish(results=results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
