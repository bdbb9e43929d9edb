"""Every phase's largest task, and the driver, at a crawl's real proportions (issue 48).

    python -m bench.scaling.crawl_proportions [--crawls 10,100] [--map-mib 256] \\
        [--work /tmp/crawl-proportions] [--json bench/results/crawl_proportions.json]

bench/scale.py measures the pipeline on corpora of 2,200-35,200 documents; a crawl's tasks read other
counts of everything: at 10 TB 37,253 map tasks of 256 MiB, 4,096 partitions of 1.22M documents, merge
tasks over thousands of files. Here, for a 10 TB and a 100 TB crawl (5 and 50 billion documents of
2,000 bytes), the files the largest task of each phase reads are built with the crawl's real counts
(input files, row groups, rows, partitions, shards) and synthetic rows, and that task's real code runs
on them in a fresh process: its CPU seconds and its peak RSS (VmHWM, reset when the task starts).

Rows: a template run (in process, bench/_scale_corpus.py's corpus: 20,000 real zh/en documents with 5%
exact and 5% near planted copies; langid, quality, exact dedup, MinHash 0.7, tokenize) gives the rows per
document of every shuffle round and partition output, and their columns. A crawl task's rows are the
template's rows repeated, row keys moved to other shards and hash keys salted per copy, so equal keys
stay equal within a copy (the same pairs, edges and clusters) and copies never meet. Every document is
assumed to reach every global stage (the crawl's filters keep most; the template's quality step drops a
third): the larger task. A map task reads 256 MiB of real documents (the same generator).

Where a task is too large to run here (a merge task of 4,657 files at 10 TB, tens of GB), it runs on a
sample of its inputs at several sizes (``--samples``: files, or fractions of its rows) and its CPU and
peak RSS are extrapolated linearly to the real count; the table says which. CPU seconds are the robust
figure on a shared machine; wall seconds are noisy and not reported per task.

The driver: planning every phase (task lists, placement) and committing every task (its marker adopted,
each phase's committed files handed on) for the crawls' 149k and 1.2M tasks, with markers copied from
the template run; and what a worker holds after installing the committed phases (one task of a late
phase), and the spec a task unpickles.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench._support.paths import ROOT

TARGET = 256 << 20  # split.target_bytes: a crawl's map task
DOC_BYTES = 2000
TEMPLATE_DOCS = 20_000
TEMPLATE_FILES = 8
TOKENIZER = ROOT / "tokenizer" / "demo.json"
# Before issue 48: partitions capped at 4,096 (auto: one per map task, at most this), shuffle_groups 8.
BEFORE_PARTITIONS = 4096
BEFORE_GROUPS = 8
PACK_LOG2 = 30  # tokens per pack task (engine/pack_plan.TOKENS_PER_TASK)


@dataclass(frozen=True)
class Crawl:
    tb: int

    @property
    def name(self) -> str:
        return f"{self.tb} TB"

    @property
    def bytes(self) -> int:
        return self.tb * 10**12

    @property
    def docs(self) -> int:
        return self.bytes // DOC_BYTES

    @property
    def map_tasks(self) -> int:
        return -(-self.bytes // TARGET)

    @property
    def docs_per_map(self) -> int:
        return self.docs // self.map_tasks


# --- measuring one task in a fresh process -----------------------------------------------------


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def measure(fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``fn(*args)`` in this process: CPU seconds (all threads), wall, peak RSS while it ran (VmHWM reset
    first), RSS at its start."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    start = _kib("VmRSS")
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn(*args, **kwargs)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    peak = max(_kib("VmHWM"), _kib("VmRSS"), start)
    return {"cpu_s": round(cpu, 3), "wall_s": round(wall, 3), "rss_start_mib": start / 1024, "peak_mib": peak / 1024, "out": out}


def in_child(job: dict[str, Any], work: Path) -> dict[str, Any]:
    """Run ``job`` (see ``JOBS``) in a fresh Python process; its measure() result."""
    path = work / "job.json"
    path.write_text(json.dumps(job))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.scaling.crawl_proportions", "--job", str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    if proc.returncode:
        raise RuntimeError(f"job {job['kind']} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """In the child: set up (not measured), then the task (measured)."""
    kind = job["kind"]
    if kind == "pack":
        from bench.scaling import pack_task_memory

        r = pack_task_memory.run_task(Path(job["work"]), 0, job["n_files"], job["inputs"], job["per_file"])
        return {"cpu_s": r["cpu_s"], "peak_mib": r["peak_mib"], "rss_start_mib": r["rss_start_mib"], "out": r["tokens"]}
    spec = pickle.loads(Path(job["spec"]).read_bytes()) if "spec" in job else None
    if kind == "map":
        from datapipe.engine.tasks.map import map_shard

        seg = spec.segments[job["segment"]]
        return measure(lambda: _brief(map_shard(spec, spec.shards[0], seg)))
    if kind == "merge_files":
        from datapipe.engine.tasks import merge

        out = Path(job["out"])
        paths = [Path(p) for p in job["paths"]]
        return measure(lambda: merge.merge_files(paths, lambda k: out / f"merged-{k}.parquet", merge.key_files(job["parts"])))
    if kind == "partition":
        from datapipe.engine.tasks.reduce import reduce_partition

        seg = spec.segments[job["segment"]]
        return measure(lambda: _brief(reduce_partition(spec, seg, job["partition"], job["round"])))
    if kind == "merge_outputs":
        from datapipe.engine.tasks import merge

        paths = job["paths"]
        out = Path(job["out"])
        shards = range(job["lo"], job["hi"])

        def task() -> int:
            n = 0
            for kind_, files in paths.items():
                sources = [pq.ParquetFile(p) for p in files]
                n += merge.merge_by_shard(
                    sources, lambda k, kd=kind_: out / f"{kd}-{k}.parquet", shards, merge.key_files(len(shards))
                )
            return n

        return measure(task)
    if kind == "combine":
        from datapipe.engine.tasks.reduce import reduce_stage

        return measure(lambda: _brief(reduce_stage(spec, spec.segments[job["segment"]])))
    if kind == "worker":
        return worker_install(job)
    if kind == "driver":
        return driver(job)
    raise ValueError(kind)


def _brief(marker: dict[str, Any]) -> dict[str, Any]:
    keep = ("docs_in", "kept", "rows_in", "rows_out", "forwarded", "state_rows", "copies_rows", "decisions", "tokens")
    return {k: marker[k] for k in keep if k in marker}


def linear(xs: list[float], ys: list[float], at: float) -> float:
    """Least-squares line through (xs, ys), evaluated at ``at`` (the intercept kept >= 0)."""
    if len(set(xs)) < 2:
        return ys[-1] * at / xs[-1]
    b, a = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return max(0.0, float(a)) + float(b) * at


# --- the template run -------------------------------------------------------------------------


def template(work: Path) -> dict[str, Any]:
    """The template run (made once under ``work``): rows per document of every shuffle round and output."""
    out = work / "template" / "out"
    meta = work / "template" / "rows.json"
    if meta.is_file() and out.is_dir():
        return json.loads(meta.read_text())
    import yaml

    from bench._support.scale_corpus import write_corpus
    from bench.scaling.scale import pipeline_config
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    shutil.rmtree(work / "template", ignore_errors=True)
    corpus = write_corpus(work / "template" / "in", _base(), TEMPLATE_DOCS, TEMPLATE_FILES, window=5000)
    cfg = pipeline_config(work / "template" / "in", TEMPLATE_FILES, 1 << 30)
    cfg["split"]["shuffle_groups"] = 0
    (work / "template" / "p.yaml").write_text(yaml.safe_dump(cfg))
    run_pipeline(
        load_pipeline(work / "template" / "p.yaml"), output=out, show_progress=False, log=lambda _: None, in_process=True
    )
    markers = out / "_work" / "markers"

    def total(phase: str, key: str) -> int:
        return sum(json.loads(p.read_text()).get(key, 0) for p in (markers / phase).rglob("*.json"))

    exact_docs, minhash_docs = total("map0", "kept"), total("map1", "kept")
    rows: dict[str, Any] = {
        "docs": corpus.docs,
        "exact_docs": exact_docs,
        "minhash_docs": minhash_docs,
        "exact_rows": total("shuffle0", "rows_in") / exact_docs,
        "band_rows": total("shuffle1", "rows_in") / minhash_docs,
        "minhash_round_rows": {},
        "outputs": {},
    }
    r = 1
    while (markers / f"shuffle1r{r}").is_dir():
        rows["minhash_round_rows"][r] = total(f"shuffle1r{r}", "rows_in") / minhash_docs
        r += 1
    for seg, docs in ((0, exact_docs), (1, minhash_docs)):
        rows["outputs"][seg] = {
            k: sum(total(p.name, k) for p in markers.iterdir() if p.name.startswith(f"shuffle{seg}")) / docs
            for k in ("rows_out", "state_rows", "copies_rows")
        }
    meta.write_text(json.dumps(rows, indent=1))
    return json.loads(meta.read_text())  # keys as text, as when read back


_BASE: Any = None


def _base() -> Any:
    global _BASE
    if _BASE is None:
        from bench._support.scale_corpus import load_base

        _BASE = load_base()
    return _BASE


def map_input(work: Path, mib: int) -> Path:
    """One crawl map task's input: ``mib`` MiB of JSONL documents (the template's generator)."""
    from bench._support.scale_corpus import write_corpus

    folder = work / f"map-input-{mib}"
    files = sorted(folder.glob("*.jsonl"))
    if files:
        return files[0]
    n = int(mib * (1 << 20) / 1800)
    corpus = write_corpus(folder, _base(), n, 1, window=5000, seed=48)
    return corpus.files[0]


# --- synthetic rows at crawl proportions ---------------------------------------------------------

ROW_KEY_COLUMNS = ("doc", "node", "nbr")
# MinHash's forwarded row kinds whose ``nbr`` is a partition, not a row key (stages/minhash.py).
NBR_IS_PART = (3, 4)


def replicate(template: pa.Table, n: int, shards: int, seed: int) -> pa.Table:
    """About ``n`` rows (whole copies of ``template``): row keys moved to other shards (of ``shards``) per copy,
    hash keys salted per copy and ids suffixed, so each copy holds the template's structure (equal keys,
    pairs, edges) and copies never meet."""
    rng = np.random.default_rng(seed)
    copies = max(1, round(n / max(1, template.num_rows)))  # whole copies: a pair never loses its answers
    n = copies * template.num_rows
    idx = np.tile(np.arange(template.num_rows), copies)
    copy = np.repeat(np.arange(copies), template.num_rows).astype(np.int64)
    t = template.take(pa.array(idx))
    t_shards = 1 + max((int(np.max(t[c].to_numpy() >> 32)) for c in ROW_KEY_COLUMNS if c in t.column_names), default=0)
    slot = copy * t_shards  # a copy's first shard slot
    for c in ROW_KEY_COLUMNS:
        if c not in t.column_names:
            continue
        v = t[c].to_numpy()
        keep = np.zeros(len(v), bool)
        if c == "nbr" and "kind" in t.column_names:
            keep = np.isin(t["kind"].to_numpy(), NBR_IS_PART)
        s = (v >> 32) + slot
        moved = ((s % shards) << 32) | ((v & 0xFFFFFFFF) + (s // shards) * 4096)
        t = t.set_column(t.schema.get_field_index(c), c, pa.array(np.where(keep, v, moved)))
    salt = rng.integers(1, 2**63, copies, dtype=np.int64).astype(np.uint64)[copy]
    if "key" in t.column_names:
        t = t.set_column(t.schema.get_field_index("key"), "key", pa.array(t["key"].to_numpy() ^ salt))
    if "text_hash" in t.column_names:
        raw = np.frombuffer(t["text_hash"].combine_chunks().buffers()[1], np.uint64, count=2 * n).copy()
        raw[0::2] ^= salt
        t = t.set_column(
            t.schema.get_field_index("text_hash"),
            "text_hash",
            pa.Array.from_buffers(pa.binary(16), n, [None, pa.py_buffer(raw.tobytes())]),
        )
    for c in ("id", "dup_of"):
        if c in t.column_names:
            ids = t[c].to_pylist()
            t = t.set_column(
                t.schema.get_field_index(c),
                c,
                pa.array([None if x is None else f"{x}~{k}" for x, k in zip(ids, copy.tolist())], pa.string()),
            )
    return t


def template_table(work: Path, folder: str, pattern: str = "*.parquet") -> pa.Table:
    files = sorted((work / "template" / "out" / "_work" / folder).rglob(pattern))
    return pa.concat_tables([pq.read_table(f) for f in files], promote_options="permissive")


def write_by_part(table: pa.Table, path: Path, key: str = "part") -> None:
    """A row group per value of ``key`` (the layout ShuffleSink and the merges wrote before issue 48)."""
    table = table.sort_by([(key, "ascending")])
    part = table[key].to_numpy()
    bounds = np.flatnonzero(np.diff(part)) + 1
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, table.schema, compression="zstd") as w:
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(part)]):
            w.write_table(table.slice(lo, hi - lo))


def copies_of(path: Path, n: int, folder: Path) -> list[Path]:
    """``n`` hard links of ``path`` (each opened as its own file; the same bytes on disk)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        p = folder / f"{i:06d}.parquet"
        if not p.exists():
            os.link(path, p)
        out.append(p)
    return out


# --- the run's spec at crawl proportions --------------------------------------------------------


def crawl_spec(work: Path, root: Path, crawl: Crawl, map_file: Path, partitions: int, groups: int) -> Path:
    """The crawl's spec (the template's pipeline on ``map_file``, with ``crawl.map_tasks`` shards: the
    first is ``map_file``, the others stand-ins never read), pickled for the task processes."""
    import yaml

    from bench.scaling.scale import pipeline_config
    from datapipe.engine.plan import make_spec
    from datapipe.pipeline.load import load_pipeline
    from datapipe.storage.cache import cache_dir

    cfg = pipeline_config(map_file.parent, partitions, 1 << 30)
    cfg["split"]["shuffle_groups"] = groups
    (root.parent / f"{root.name}.yaml").write_text(yaml.safe_dump(cfg))
    spec = make_spec(load_pipeline(root.parent / f"{root.name}.yaml"), root, cache_dir(), 1 << 30)
    real = spec.shards[0]
    shards = [real] + [replace(real, ordinal=i, key=f"web/s{i:07d}") for i in range(1, crawl.map_tasks)]
    spec = replace(spec, shards=tuple(shards))
    path = root.parent / f"{root.name}.spec.pkl"
    path.write_bytes(pickle.dumps(spec))
    return path


# --- the phases, before issue 48 ------------------------------------------------------------------


def before(work: Path, crawls: list[Crawl], map_mib: int, samples: list[int], fractions: list[float]) -> list[dict[str, Any]]:
    """Every phase's largest task of the code before issue 48 (partitions capped at 4,096, ``shuffle_groups``
    merges of a row group per part), at each crawl's proportions."""
    from datapipe.engine.tasks import merge
    from datapipe.run_folder.layout import RunFolder

    rows = template(work)
    print(f"template: {json.dumps(rows)}", flush=True)
    results: list[dict[str, Any]] = []
    P, G = BEFORE_PARTITIONS, BEFORE_GROUPS
    map_file = map_input(work, map_mib)

    # Map tasks: one real 256 MiB task per map phase; what differs with the crawl's size (the shuffle's
    # 4,096 row groups, the decisions' G merged files) is the same at 10 and 100 TB with the cap.
    crawl0 = crawls[0]
    root = work / "before-map" / "run"
    shutil.rmtree(root.parent, ignore_errors=True)
    root.mkdir(parents=True)
    spec_path = crawl_spec(work, root, crawl0, map_file, P, G)
    spec = pickle.loads(spec_path.read_bytes())
    folder = RunFolder(root)
    for seg in range(3):
        if seg:
            _before_decisions(spec, folder, seg - 1, rows, crawl0, work)
        r = in_child({"kind": "map", "spec": str(spec_path), "segment": seg}, work)
        print(f"map{seg}: {r}", flush=True)
        for crawl in crawls:
            results.append(_row(f"map{seg}", crawl, r, "measured (the same task at both sizes: 4,096 partitions, 8 groups)"))
    shuffle_files = {0: folder.shuffle_file(0, spec.shards[0].key), 1: folder.shuffle_file(1, spec.shards[0].key)}

    for crawl in crawls:
        per_part = crawl.docs / P
        # merge0 / merge1: a group of M / G map tasks' shuffle files, 4,096 row groups each.
        for seg in (0, 1):
            n_group = -(-crawl.map_tasks // G)
            fits = []
            for n in samples:
                paths = copies_of(shuffle_files[seg], n, work / "before-merge" / f"in{seg}")
                out = work / "before-merge" / "out"
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir(parents=True)
                r = in_child({"kind": "merge_files", "paths": [str(p) for p in paths], "out": str(out), "parts": P}, work)
                fits.append((n, r))
                print(f"{crawl.name} merge{seg} {n} files: {r}", flush=True)
            results.append(_extrapolated(f"merge{seg}", crawl, fits, n_group, "map tasks' shuffle files"))
        # merge1r<k>: a group of P / G partitions' forwarded files, 4,096 row groups each.
        fwd = template_table(work, "shuffle1-r0").schema
        for r_ in sorted(rows["minhash_round_rows"], key=int):
            per_doc = rows["minhash_round_rows"][r_]
            n_rows = int(per_doc * crawl.docs / P)  # one partition's forwarded rows, over every part
            src = template_table(work, f"shuffle1-r{int(r_) - 1}").cast(fwd)
            t = replicate(src, n_rows, crawl.map_tasks, int(r_))
            t = t.set_column(0, "part", pa.array(np.random.default_rng(int(r_)).integers(0, P, t.num_rows).astype(np.int32)))
            one = work / "before-merge" / f"fwd{r_}.parquet"
            write_by_part(t, one)
            del t
            fits = []
            for n in samples:
                paths = copies_of(one, n, work / "before-merge" / f"fwd{r_}")
                out = work / "before-merge" / "out"
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir(parents=True)
                r = in_child({"kind": "merge_files", "paths": [str(p) for p in paths], "out": str(out), "parts": P}, work)
                fits.append((n, r))
                print(f"{crawl.name} merge1r{r_} {n} files: {r}", flush=True)
            results.append(_extrapolated(f"merge1r{r_}", crawl, fits, P // G, "partitions' forwarded files"))
            shutil.rmtree(work / "before-merge" / f"fwd{r_}", ignore_errors=True)
            one.unlink()
        shutil.rmtree(work / "before-merge", ignore_errors=True)

        # Partitions: partition 0's rows from the G merged files of its key range (128 parts each).
        root = work / f"before-{crawl.tb}" / "run"
        shutil.rmtree(root.parent, ignore_errors=True)
        root.mkdir(parents=True)
        spec_path = crawl_spec(work, root, crawl, map_file, P, G)
        spec = pickle.loads(spec_path.read_bytes())
        folder = RunFolder(root)
        owned = [s for s in range(0, crawl.map_tasks, P)]  # shards whose owner is partition 0
        _owned_outputs(folder, spec, owned, crawl, work)
        plans = [(0, 0, template_table(work, "shuffle0"), rows["exact_rows"])]
        plans.append((1, 0, template_table(work, "shuffle1"), rows["band_rows"]))
        for r_ in sorted(rows["minhash_round_rows"], key=int):
            src = template_table(work, f"shuffle1-r{int(r_) - 1}").cast(fwd)
            plans.append((1, int(r_), src, rows["minhash_round_rows"][r_]))
        for seg, rnd, src, per_doc in plans:
            phase = f"shuffle{seg}" + (f"r{rnd}" if rnd else "")
            n_rows = per_part * per_doc
            fits = []
            for frac in fractions:  # of the smallest crawl's partition: larger ones are extrapolated
                n = int(crawls[0].docs / P * per_doc * frac)
                n = _before_partition_inputs(spec, folder, seg, rnd, src, n, owned, crawl)
                r = in_child({"kind": "partition", "spec": str(spec_path), "segment": seg, "partition": 0, "round": rnd}, work)
                fits.append((n, r))
                print(f"{crawl.name} {phase} {n:,} rows: {r}", flush=True)
            results.append(_extrapolated(phase, crawl, fits, int(n_rows), "rows of one partition", unit="rows"))
        # The combine step (reduce1): nothing left open in the template; its loops over the shards remain.
        r = in_child({"kind": "combine", "spec": str(spec_path), "segment": 1}, work)
        results.append(_row("reduce1", crawl, r, "measured (nothing left open: its loops over every shard)"))
        # Decisions merges: one range task (of 8 per group) over a group's outputs.
        for seg, name in ((0, "merge0d"), (1, "merge1d")):
            out_rows = rows["outputs"][str(seg)]
            tables = {
                "decisions": template_table(work, f"reduce{seg}-parts", "[0r]*.parquet"),
                "state": template_table(work, f"reduce{seg}-parts", "state-*.parquet") if out_rows["state_rows"] else None,
                "copies": template_table(work, f"reduce{seg}-parts", "copies-*.parquet"),
            }
            per_output = {
                "decisions": out_rows["rows_out"] * per_part,
                "state": out_rows["state_rows"] * per_part,
                "copies": out_rows["copies_rows"] * per_part,
            }
            made: dict[str, Path] = {}
            for k, t in tables.items():
                if t is None or not per_output[k]:
                    continue
                t = replicate(t, int(per_output[k]), crawl.map_tasks, 7)
                t = t.set_column(
                    t.schema.get_field_index("shard"),
                    "shard",
                    pa.array(np.random.default_rng(3).integers(0, crawl.map_tasks, t.num_rows).astype(np.int32)),
                )
                made[k] = work / "before-outputs" / f"{k}.parquet"
                made[k].parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(t.sort_by([("shard", "ascending")]), made[k], row_group_size=1 << 15)
            # A group's outputs: the rounds that write are cut into G groups by rows, P / G outputs each.
            n_group = P // G
            shards = merge.OutputMerge(G, 8, crawl.map_tasks).shards_of(0)
            fits = []
            for n in samples:
                paths = {k: [str(p) for p in copies_of(f, n, work / "before-outputs" / k)] for k, f in made.items()}
                out = work / "before-outputs" / "out"
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir(parents=True)
                job = {"kind": "merge_outputs", "paths": paths, "out": str(out), "lo": shards.start, "hi": shards.stop}
                r = in_child(job, work)
                fits.append((n, r))
                print(f"{crawl.name} {name} {n} outputs: {r}", flush=True)
            results.append(_extrapolated(name, crawl, fits, n_group, "partition outputs of each kind"))
            shutil.rmtree(work / "before-outputs", ignore_errors=True)
        shutil.rmtree(root.parent, ignore_errors=True)
    results += pack_rows(work, crawls)
    results += driver_rows(work, crawls, map_file, P, G)
    return results


def driver_rows(work: Path, crawls: list[Crawl], map_file: Path, partitions: int, groups: int) -> list[dict[str, Any]]:
    """The driver's planning and commit per phase (real markers at the smallest crawl, counts only
    at the larger, their per-task commit cost and memory carried over), and a worker's install of every
    committed phase before the last shuffle round."""
    out: list[dict[str, Any]] = []
    per_task: dict[str, float] = {}
    for i, crawl in enumerate(crawls):
        root = work / f"driver-{crawl.tb}" / "run"
        shutil.rmtree(root.parent, ignore_errors=True)
        root.mkdir(parents=True)
        spec_path = crawl_spec(work, root, crawl, map_file, partitions, groups)
        committed = root.parent / "committed"
        job = {
            "kind": "driver",
            "spec": str(spec_path),
            "work": str(work),
            "uri": f"s3://crawl-proportions/driver-{crawl.tb}",
            "compact": i > 0,
            "committed_dir": str(committed),
        }
        r = in_child(job, work)
        phases = [p for p in r["phases"] if "tasks" in p]
        if i == 0:
            tasks = sum(p["tasks"] for p in phases)
            per_task = {
                "adopt_s": sum(p["adopt_s"] for p in phases) / tasks,
                "rss_mib": r["rss_growth_mib"] / tasks,
                "commit_s_per_task": {p["phase"]: p["commit_s"] / max(1, p["tasks"]) for p in phases},
            }
        worst = max(phases, key=lambda p: p["plan_s"] + p["tasks"] * per_task["adopt_s"] + p["commit_s"])
        held = i == 0
        out.append(
            {
                "phase": "driver",
                "crawl": crawl.name,
                "tasks": r["tasks"],
                "plan_s_max": max(p["plan_s"] for p in phases),
                "plan_s_max_phase": max(phases, key=lambda p: p["plan_s"])["phase"],
                "commit_s_max": max(p["tasks"] * per_task["adopt_s"] + p["commit_s"] for p in phases),
                "worst_phase": worst["phase"],
                "rss_mib": r["rss_growth_mib"] if held else r["tasks"] * per_task["rss_mib"],
                "how": "measured"
                if held
                else "planning measured (markers of counts only); commit and memory per task from the smaller crawl",
                "runs": [r],
            }
        )
        print(f"{crawl.name} driver: {json.dumps({k: v for k, v in out[-1].items() if k != 'runs'})}", flush=True)
        if held:
            pkls = sorted(committed.glob("*.pkl"))
            last = max(i for i, p in enumerate(pkls) if p.stem.endswith("shuffle1r6"))
            w = in_child({"kind": "worker", "committed": [str(p) for p in pkls[:last]], "spec": str(spec_path)}, work)
            out.append(
                {
                    "phase": "worker",
                    "crawl": crawl.name,
                    "files": w["out"],
                    "install_cpu_s": w["cpu_s"],
                    "rss_mib": w["peak_mib"] - w["rss_start_mib"],
                    "spec_cpu_s": w["spec_cpu_s"],
                    "spec_bytes": w["spec_bytes"],
                    "how": "measured: a worker's first task of shuffle1r6 installs every committed phase before it",
                    "runs": [w],
                }
            )
            print(f"{crawl.name} worker: {json.dumps({k: v for k, v in out[-1].items() if k != 'runs'})}", flush=True)
        shutil.rmtree(root.parent, ignore_errors=True)
    return out


def pack_rows(work: Path, crawls: list[Crawl]) -> list[dict[str, Any]]:
    """A pack task of 2^30 tokens (engine/pack_plan.TOKENS_PER_TASK): the same at every crawl size."""
    from bench.scaling import pack_task_memory

    folder = work / "pack"
    folder.mkdir(exist_ok=True)
    per_file = pack_task_memory.make_tokens(folder / "tokens.arrow")
    span = pack_task_memory.SEQ_LEN * pack_task_memory.ROWS_PER_SHARD
    n_files = (1 << PACK_LOG2) // span
    r = in_child(
        {
            "kind": "pack",
            "work": str(folder),
            "n_files": n_files,
            "inputs": -(-(n_files + 1) * span // per_file),
            "per_file": per_file,
        },
        work,
    )
    shutil.rmtree(folder, ignore_errors=True)
    return [_row("pack", c, r, "measured (2^30 tokens: the same task at every size)") for c in crawls]


def _row(phase: str, crawl: Crawl, r: dict[str, Any], how: str) -> dict[str, Any]:
    return {"phase": phase, "crawl": crawl.name, "cpu_s": r["cpu_s"], "peak_mib": r["peak_mib"], "how": how, "runs": [r]}


def _extrapolated(
    phase: str, crawl: Crawl, fits: list[tuple[int, dict[str, Any]]], at: int, what: str, unit: str = "files"
) -> dict[str, Any]:
    xs = [float(n) for n, _ in fits]
    measured_at = max(xs)
    cpu = linear(xs, [r["cpu_s"] for _, r in fits], at)
    peak = linear(xs, [r["peak_mib"] for _, r in fits], at)
    how = "measured" if measured_at >= at else f"extrapolated from {', '.join(f'{int(x):,}' for x in xs)} {unit}"
    return {
        "phase": phase,
        "crawl": crawl.name,
        "cpu_s": cpu,
        "peak_mib": peak,
        "how": f"{how} ({at:,} {what})",
        "runs": [{"n": n, **r} for n, r in fits],
    }


def _before_decisions(spec: Any, folder: Any, seg: int, rows: dict[str, Any], crawl: Crawl, work: Path) -> None:
    """What map<seg+1> reads of the step before: shard 0's decisions (and state, copies) in the G merged
    files of its range, each holding 128 shards' row groups (the merge<seg>d layout before issue 48);
    shard 0's rows are its documents', at the template's rate."""
    from datapipe.engine.tasks.merge import output_groups

    merged = output_groups(spec, spec.segments[seg])
    docs = pq.read_table(folder.map_output(seg, spec.shards[0].key), columns=["id"])["id"].to_pylist()
    out_rows = rows["outputs"][str(seg)]
    rng = np.random.default_rng(seg)
    dec = template_table(work, f"reduce{seg}-parts", "[0r]*.parquet")
    for kind, rate in (
        ("decisions", out_rows["rows_out"]),
        ("state", out_rows["state_rows"]),
        ("copies", out_rows["copies_rows"]),
    ):
        if not rate:
            continue
        n = int(rate * len(docs))
        pick = rng.choice(len(docs), n, replace=False)
        src = template_table(
            work,
            f"reduce{seg}-parts",
            "state-*.parquet" if kind == "state" else f"{kind}-*.parquet" if kind == "copies" else "[0r]*.parquet",
        )
        t = replicate(src if src.num_rows else dec, n, crawl.map_tasks, 11).slice(0, n)
        if "id" in t.column_names:
            t = t.set_column(t.schema.get_field_index("id"), "id", pa.array([docs[i] for i in pick], pa.string()))
        if "row_key" in t.column_names:
            t = t.set_column(t.schema.get_field_index("row_key"), "row_key", pa.array(np.sort(pick).astype(np.int64)))
        for g in range(merged.groups):
            mine = t.slice(g * n // merged.groups, (g + 1) * n // merged.groups - g * n // merged.groups)
            mine = mine.set_column(mine.schema.get_field_index("shard"), "shard", pa.array(np.zeros(mine.num_rows, np.int32)))
            others = t.slice(0, 1)
            filler = pa.concat_tables(
                [
                    others.set_column(others.schema.get_field_index("shard"), "shard", pa.array([s], pa.int32()))
                    for s in range(1, 128)
                ]
            )
            path = folder.merged_outputs(seg, g, kind, rng=0, cut=0 if merged.shards > 8 * 128 else None)
            write_by_part(pa.concat_tables([mine, filler]), path, "shard")


def _owned_outputs(folder: Any, spec: Any, owned: list[int], crawl: Crawl, work: Path) -> None:
    """Map outputs of the shards partition 0 answers for (MinHash's owner reads): id, signature and
    n_chars of a crawl map task's documents, a row group per 1,000 (as map tasks write them); the other
    columns are never read by the partitions. One file, linked for every owned shard."""
    src = template_table(work, "map1")
    n = crawl.docs_per_map
    t = src.select(["id", "minhash_sig", "n_chars"]).take(pa.array(np.arange(n) % src.num_rows))
    one = work / f"before-{crawl.tb}" / "owned.parquet"
    pq.write_table(t, one, row_group_size=1000)
    for s in owned:
        path = folder.map_output(1, spec.shards[s].key)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            os.link(one, path)


def _before_partition_inputs(
    spec: Any, folder: Any, seg: int, rnd: int, src: pa.Table, n: int, owned: list[int], crawl: Crawl
) -> int:
    """Partition 0's round-``rnd`` rows (``n``) in the G merged files of its key range (parts 0-127), a row
    group per part (the others one row each); ask rows moved to the shards it owns."""
    from datapipe.engine.tasks.merge import key_file, merge_groups, round_writers

    t = replicate(src, n, crawl.map_tasks, rnd + 100 * seg)
    n = t.num_rows
    t = t.set_column(0, "part", pa.array(np.zeros(n, np.int32)))
    if "kind" in t.column_names:
        kind = t["kind"].to_numpy()
        asks = np.isin(kind, (3, 5))
        node = t["node"].to_numpy().copy()
        rng = np.random.default_rng(rnd)
        shard = np.asarray(owned)[rng.integers(0, len(owned), int(asks.sum()))]
        node[asks] = (shard.astype(np.int64) << 32) | rng.integers(0, crawl.docs_per_map, int(asks.sum()))
        t = t.set_column(t.schema.get_field_index("node"), "node", pa.array(node))
    groups = merge_groups(spec, round_writers(spec, spec.segments[seg], rnd))
    for g in range(groups):
        mine = t.slice(g * n // groups, (g + 1) * n // groups - g * n // groups)
        one = t.slice(0, 1)
        filler = pa.concat_tables([one.set_column(0, "part", pa.array([p], pa.int32())) for p in range(1, 128)])
        path = folder.merged_file(seg, rnd, g, rng=key_file(0, BEFORE_PARTITIONS))
        write_by_part(pa.concat_tables([mine, filler]), path)
    return n


# --- the driver --------------------------------------------------------------------------------


def template_markers(work: Path) -> dict[str, tuple[str, str]]:
    """A marker of the template run per kind of phase (its text, and the task key to replace in it)."""
    markers = work / "template" / "out" / "_work" / "markers"
    out = {}
    for phase in ("map0", "map1", "map2", "shuffle0", "shuffle1", "pack", *(p.name for p in markers.glob("shuffle1r*"))):
        path = sorted((markers / phase).rglob("*.json"))[0]
        out[phase] = (path.read_text(), path.relative_to(markers / phase).as_posix()[: -len(".json")])
    return out


def _marker_for(phase: str, key: str, templates: dict[str, tuple[str, str]], compact: bool) -> bytes:
    """A marker of ``phase``'s task ``key``: the template's of its kind, its files renamed (``compact``:
    only what planning reads, the node and the counts)."""
    name = phase if phase in templates else ("shuffle1r1" if phase.startswith("shuffle") else "")
    if not name:  # merges: what a merge task's marker holds
        return json.dumps(
            {"rows": 1000, "node": NODE, "files": [{"path": f"_work/{phase}/{key}.parquet", "bytes": 1 << 20, "footer": 4096}]}
        ).encode()
    text, old = templates[name]
    marker = json.loads(text.replace(old, key))
    marker["node"] = NODE
    for k in ("forwarded", "rows_out", "state_rows", "copies_rows"):
        if k in marker:
            marker[k] = max(1, marker[k])
    if compact:
        marker = {k: v for k, v in marker.items() if not isinstance(v, (list, dict)) or k == "split_tokens"}
    return json.dumps(marker, sort_keys=True).encode()


NODE = "f" * 56  # a Ray node id: placement weighs the map tasks by the node that ran them


def driver(job: dict[str, Any]) -> dict[str, Any]:
    """In the child: the driver of a crawl's run, phase by phase: planning (the phase's task list, each
    task placed) and committing (every task's marker adopted, the phase's committed files built for the
    later tasks), CPU seconds per phase and the driver's RSS growth per task. ``compact``: markers with
    counts only (planning does not read the rest; at 100 TB real markers would not fit here)."""
    from datapipe.engine.phases import plan_phases
    from datapipe.run_folder.layout import RunFolder

    spec = pickle.loads(Path(job["spec"]).read_bytes())
    templates = template_markers(Path(job["work"]))
    compact = job["compact"]
    folder = RunFolder(job["uri"])
    shutil.rmtree(folder.root, ignore_errors=True)
    out_dir = Path(job["committed_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    gc.collect()
    rss0 = _kib("VmRSS")
    cpu = time.process_time()
    phases = plan_phases(spec)
    rows: list[dict[str, Any]] = [{"phase": "plan_phases", "plan_s": time.process_time() - cpu}]
    tasks = 0
    for phase in phases:
        cpu = time.process_time()
        work = phase.task_list(folder)
        assert work is not None, phase.name
        if phase.follows is not None:
            nodes = {k: m["node"] for k, m in folder.read_markers(phase.follows).items()}
            work = phase.placed(list(work), nodes)
        plan_s = time.process_time() - cpu
        bodies = [(t.key, _marker_for(phase.name, t.key, templates, compact)) for t in work]
        cpu = time.process_time()
        for key, body in bodies:
            folder.adopt_marker(phase.name, key, body)
        adopt_s = time.process_time() - cpu
        cpu = time.process_time()
        committed = folder.committed(phase.name)
        commit_s = time.process_time() - cpu
        if not compact:
            (out_dir / f"{len(rows):03d}-{phase.name}.pkl").write_bytes(pickle.dumps(committed))
        del bodies, committed
        tasks += len(work)
        rows.append({"phase": phase.name, "tasks": len(work), "plan_s": plan_s, "adopt_s": adopt_s, "commit_s": commit_s})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    gc.collect()
    growth = (_kib("VmRSS") - rss0) / 1024
    return {"tasks": tasks, "rss_growth_mib": growth, "phases": rows, "cpu_s": 0, "peak_mib": _kib("VmHWM") / 1024}


def worker_install(job: dict[str, Any]) -> dict[str, Any]:
    """In the child: a worker's first task of a late phase installs every committed phase (their file
    tables) and unpickles the spec: the RSS it adds and the CPU it takes."""
    from datapipe.run_folder import remote

    blobs = [Path(p).read_bytes() for p in job["committed"]]
    spec_blob = Path(job["spec"]).read_bytes()

    def install() -> int:
        phases = [pickle.loads(b) for b in blobs]
        remote.install("s3://bench/run", phases)
        return sum(len(p.files) for p in phases)

    r = measure(install)
    s = measure(lambda: len(pickle.loads(spec_blob).shards))
    r["spec_cpu_s"], r["spec_bytes"] = s["cpu_s"], len(spec_blob)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--crawls", default="10,100", help="crawl sizes in TB")
    ap.add_argument("--map-mib", type=int, default=256, help="a map task's input (256 MiB: split.target_bytes)")
    ap.add_argument("--samples", default="8,16,32", help="files a too-large merge task is measured on")
    ap.add_argument("--fractions", default="0.25,0.5,1", help="fractions of a 10 TB partition's rows measured")
    ap.add_argument("--work", type=Path, default=Path("/tmp/crawl-proportions"))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.job:
        r = run_job(json.loads(a.job.read_text()))
        r["out"] = r.get("out") if isinstance(r.get("out"), (int, float, dict, type(None))) else str(r.get("out"))
        print(json.dumps(r))
        return 0
    a.work.mkdir(parents=True, exist_ok=True)
    crawls = [Crawl(int(x)) for x in a.crawls.split(",")]
    results = before(
        a.work, crawls, a.map_mib, [int(x) for x in a.samples.split(",")], [float(x) for x in a.fractions.split(",")]
    )
    for r in results:
        if "cpu_s" in r:
            print(f"{r['phase']:>10} {r['crawl']:>7} cpu {r['cpu_s']:>10.1f} s  peak {r['peak_mib']:>9,.0f} MiB  {r['how']}")
        else:
            print(f"{r['phase']:>10} {r['crawl']:>7} {json.dumps({k: v for k, v in r.items() if k != 'runs'})}")
    if a.json:
        from bench._support.harness import environment

        a.json.write_text(json.dumps({"bench": "crawl_proportions", "env": environment(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
