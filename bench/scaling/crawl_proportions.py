"""Every phase's largest task, and the driver, at a crawl's real proportions (issue 48).

    python -m bench.scaling.crawl_proportions [--crawls 10,100] [--map-mib 256] \\
        [--before bench/results/crawl_proportions_before.json] [--json bench/results/crawl_proportions.json]

bench/scaling/scale.py measures the pipeline on corpora of thousands of documents; a crawl's tasks read
other counts of everything. Here, for a 10 TB and a 100 TB crawl (5 and 50 billion documents of 2,000
bytes; 37,253 and 372,530 map tasks of 256 MiB), the files the largest task of each phase reads are
built with the crawl's real counts (input runs, their key ranges, rows, parts, shards) and synthetic
rows, and that task's real code runs on them in a fresh process: its CPU seconds and its peak RSS
(VmHWM, reset when the task starts). The phases' sizes come from the engine's own plan
(engine/shuffle_plan.py ``levels``, ``split.shuffle_fan_in``, ``split.partition_rows``) applied to
the crawl's row and byte counts.

Rows: a template run (in process, bench/_support/scale_corpus.py's corpus: 20,000 real zh/en documents
with 5% exact and 5% near planted copies; langid, quality, exact dedup, MinHash 0.7, tokenize) gives
the rows per document of every shuffle round and partition output, their bytes and columns. A crawl
task's rows are the template's rows repeated, row keys moved to other shards and hash keys salted per
copy, so equal keys stay equal within a copy (the same pairs, edges and clusters) and copies never
meet. Every document is assumed to reach every global stage (the larger task). A map task reads 256 MiB
of real documents (the same generator).

A merge or partition task reads one key range of each of its input runs; each input here holds that
range's rows and one row group of keys on either side (what a reader of a range reads beyond it), and
inputs beyond a few distinct ones are hard links (a merge's cost does not depend on which rows it
merges; a partition's does, so its inputs are all distinct).

The driver: planning every phase (task lists from the markers' counts, placement) and committing every
task (its marker adopted) for the crawls' tasks, with markers carrying the crawl's counts; a worker:
what a task is handed (the committed entries of its own inputs) and the spec it unpickles.

``--before``: the same bench's figures for the code before issue 48 (partitions capped at 4,096,
``shuffle_groups`` merges of a row group per part), recorded by running this script as it was at the
commit the JSON names against that code: merges of thousands of files measured on samples of 4-16
files and extrapolated, as the table says. CPU seconds are the robust figure on a shared machine;
wall seconds are noisy and not used.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
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
PACK_LOG2 = 30  # tokens per pack task (engine/pack_plan.TOKENS_PER_TASK)
DISTINCT = 8  # distinct input runs of a merge task (the rest hard links)
# A task's peak RSS the issue allows at 100 TB: "2 GB" read strictly as 2,000,000,000 bytes (1,907 MiB),
# not 2 GiB (2,048 MiB): a node's memory is sold and planned in GB, and a task that fits 2 GiB but not
# 2 GB would be passed by the table while over the bound the issue states.
LIMIT_MIB = 2_000_000_000 // (1 << 20)
LIMIT_CPU_S = 600  # and its CPU seconds


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
    profile = os.environ.get("CRAWL_PROPORTIONS_PROFILE")  # --profile: a cProfile of each task, in that folder
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    sampler = _PeakStack() if os.environ.get("CRAWL_PROPORTIONS_PEAK_STACK") else None
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn(*args, **kwargs)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if sampler is not None:
        print(sampler.stop(), file=sys.stderr, flush=True)
    if prof is not None and profile:
        prof.disable()
        prof.dump_stats(Path(profile) / f"{os.getpid()}.prof")
    peak = max(_kib("VmHWM"), _kib("VmRSS"), start)
    return {"cpu_s": round(cpu, 3), "wall_s": round(wall, 3), "rss_start_mib": start / 1024, "peak_mib": peak / 1024, "out": out}


class _PeakStack:
    """--peak-stack: the task's Python stack when its RSS was highest (sampled every 20 ms), to stderr."""

    def __init__(self) -> None:
        import threading

        self.main = threading.main_thread().ident
        self.peak, self.stack, self.done = 0, "", False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import traceback

        while not self.done:
            rss = _kib("VmRSS")
            if rss > self.peak:
                frame = sys._current_frames().get(self.main or 0)
                self.peak, self.stack = rss, "".join(traceback.format_stack(frame)[-8:]) if frame else ""
            time.sleep(0.02)

    def stop(self) -> str:
        self.done = True
        self.thread.join()
        return f"peak RSS {self.peak / 1024:,.0f} MiB at:\n{self.stack}"


def in_child(job: dict[str, Any], work: Path) -> dict[str, Any]:
    """Run ``job`` (see ``run_job``) in a fresh Python process; its measure() result."""
    path = work / "job.pkl"
    path.write_bytes(pickle.dumps(job))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_DEDUP_LOGS": "0"}
    cmd = [sys.executable, "-m", "bench.scaling.crawl_proportions", "--job", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(f"job {job['kind']} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    if os.environ.get("CRAWL_PROPORTIONS_PEAK_STACK"):
        print(proc.stderr[-4000:], flush=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """In the child: set up (not measured), then the task (measured)."""
    kind = job["kind"]
    if kind == "pack":
        from bench.scaling import pack_task_memory

        r = pack_task_memory.run_task(Path(job["work"]), 0, job["n_files"], job["inputs"], job["per_file"])
        return {"cpu_s": r["cpu_s"], "peak_mib": r["peak_mib"], "rss_start_mib": r["rss_start_mib"], "out": r["tokens"]}
    if kind == "driver":
        return driver(job)
    if kind == "worker":
        return worker(job)
    spec = pickle.loads(Path(job["spec"]).read_bytes())
    seg = spec.segments[job["segment"]]
    if not _full_spec(spec, seg, kind):
        spec = replace(spec, shards=())  # as the engine hands it (engine/phases.py ``full_spec``)
    if kind == "map":
        from datapipe.engine.tasks.map import map_shard

        return measure(lambda: _brief(map_shard(spec, spec.shards[0], seg, job.get("decided"))))
    if kind == "merge":
        from datapipe.engine.tasks.merge import merge_outputs, merge_runs

        if job.get("output_kind"):
            return measure(lambda: _brief(merge_outputs(spec, seg, job["output_kind"], job["task"])))
        return measure(lambda: _brief(merge_runs(spec, seg, job["round"], job["task"])))
    if kind == "partition":
        from datapipe.engine.tasks.reduce import reduce_partition

        return measure(lambda: _brief(reduce_partition(spec, seg, job["round"], job["task"], job["outputs"])))
    if kind == "combine":
        from datapipe.engine.tasks.reduce import reduce_stage

        return measure(lambda: _brief(reduce_stage(spec, seg)))
    raise ValueError(kind)


def _full_spec(spec: Any, seg: Any, kind: str) -> bool:
    """Whether the engine hands this kind of task the spec with the run's shards (``Phase.full_spec``):
    not a merge, nor a partition whose step reads only the map outputs it owns (MinHash's). Handed them
    all, a task at 100 TB held 372,530 shards it never reads (~150 MiB of its peak)."""
    if kind == "merge":
        return False
    if kind == "partition":
        from datapipe.engine.plan import build_stage
        from datapipe.stages.global_stage import PartitionStep, step_of

        step = step_of(build_stage(spec, seg.compute_global), PartitionStep)
        return step is None or not step.owner_reads
    return True


def _brief(marker: dict[str, Any]) -> dict[str, Any]:
    keep = ("docs_in", "kept", "rows_in", "rows_out", "forwarded", "state_rows", "copies_rows", "rows", "tokens", "inputs")
    return {k: marker[k] for k in keep if k in marker}


class Results(list[dict[str, Any]]):
    """The results so far, written to ``path`` (when given) after every phase, so a run stopped or not
    yet finished leaves every phase it measured; ``kept``: rows of an earlier JSON for the phases not
    run again (``--phases``), replaced as this run measures them. ``selected``: the phases to run."""

    def __init__(self, path: Path | None, patterns: list[str], kept: list[dict[str, Any]]) -> None:
        super().__init__()
        self.path, self.patterns, self.kept = path, patterns, kept
        self.load_start = os.getloadavg()  # the machine is shared: CPU s are the figures, the load says how shared
        self.loads: list[float] = []

    def selected(self, phase: str) -> bool:
        import fnmatch

        return any(fnmatch.fnmatchcase(phase, p) for p in self.patterns)

    def append(self, row: dict[str, Any]) -> None:
        super().append(row)
        self.save(partial=True)

    def rows(self) -> list[dict[str, Any]]:
        mine = {(r["phase"], r["crawl"]) for r in self}
        return [r for r in self.kept if (r["phase"], r["crawl"]) not in mine] + list(self)

    def save(self, partial: bool) -> None:
        self.loads.append(os.getloadavg()[0])
        if self.path is None:
            return
        from bench._support.harness import environment

        load = {"start": self.load_start, "end": os.getloadavg(), "min": min(self.loads), "max": max(self.loads)}
        out: dict[str, Any] = {"bench": "crawl_proportions", "env": environment(), "loadavg": load}
        if partial:
            out["partial"] = f"written after each phase: the run had measured {len(self)} rows when this was written"
        out["results"] = self.rows()
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(out, indent=1, default=str))
        tmp.replace(self.path)


# --- the template run ---------------------------------------------------------------------


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


def nbr_not_row_key() -> tuple[int, ...]:
    """MinHash's forwarded row kinds whose ``nbr`` is not a row key (stages/minhash.py: a HEAD row's is the
    shard whose owner looks for the head's key), kept as they are when rows are replicated."""
    from datapipe.stages.minhash import HEAD

    return (HEAD,)


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
            keep = np.isin(t["kind"].to_numpy(), nbr_not_row_key())
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


# --- the phases, this code ---------------------------------------------------------------------


def bytes_per_row(table: pa.Table, key: str, work: Path) -> float:
    """Bytes a row of ``table`` takes in a run (engine/tasks/runs.py ``write_run``: zstd, large row groups)."""
    from datapipe.engine.tasks import runs

    path = work / "probe.parquet"
    n = runs.write_run(path, table, key)
    size = path.stat().st_size
    path.unlink()
    return size / max(1, n)


def crawl_spec(root: Path, crawl: Crawl, map_file: Path) -> Path:
    """The crawl's spec (bench/scaling/scale.py's pipeline on ``map_file``, its parts one per map task as
    ``partitions: auto`` resolves them at the crawl's size), with ``crawl.map_tasks`` shards: the first
    is ``map_file``, the others stand-ins never read; pickled for the task processes."""
    import yaml

    from bench.scaling.scale import pipeline_config
    from datapipe.engine.plan import make_spec
    from datapipe.pipeline.load import load_pipeline
    from datapipe.storage.cache import cache_dir

    cfg = pipeline_config(map_file.parent, crawl.map_tasks, 1 << 30)
    (root.parent / f"{root.name}.yaml").write_text(yaml.safe_dump(cfg))
    spec = make_spec(load_pipeline(root.parent / f"{root.name}.yaml"), root, cache_dir(), 1 << 30)
    real = spec.shards[0]
    shards = [real] + [replace(real, ordinal=i, key=f"web/s{i:07d}") for i in range(1, crawl.map_tasks)]
    spec = replace(spec, shards=tuple(shards))
    path = root.parent / f"{root.name}.spec.pkl"
    path.write_bytes(pickle.dumps(spec))
    return path


def with_keys(table: pa.Table, key: str, values: np.ndarray) -> pa.Table:
    return table.set_column(table.schema.get_field_index(key), key, pa.array(values.astype(np.int32), pa.int32()))


def write_slice(root: Path, rel: str, rows: pa.Table, key: str, lo: int, hi: int, keys: int, edge: int) -> Any:
    """A run at ``rel`` (in the run folder ``root``) holding ``rows`` (keys in [lo, hi)) and ``edge`` rows
    of the key before and after the range: what a reader of [lo, hi) finds in a run of many keys (it
    reads at most a row group beyond each end). Returns its ``RunFile`` (over every key)."""
    from datapipe.engine.shuffle_plan import RunFile
    from datapipe.engine.tasks import runs
    from datapipe.storage.parquet_reads import footer_length

    path = root / rel
    pieces = [rows]
    head = rows.slice(0, min(edge, rows.num_rows))
    if lo > 0 and head.num_rows:
        pieces.append(with_keys(head, key, np.full(head.num_rows, lo - 1)))
    if hi < keys and head.num_rows:
        pieces.append(with_keys(head, key, np.full(head.num_rows, hi)))
    n = runs.write_run(path, pa.concat_tables(pieces), key)
    return RunFile(rel, n, 0, keys, path.stat().st_size, footer_length(path))


def edge_rows(table: pa.Table) -> int:
    """Rows of a row group of this table's rows in a run (engine/tasks/runs.py ``group_rows``)."""
    from datapipe.engine.tasks import runs

    return runs.group_rows(table)


def spread(table: pa.Table, files: int, rng: np.random.Generator) -> list[pa.Table]:
    """``table``'s rows dealt at random to ``files`` runs (a key's rows come from many writers)."""
    which = rng.integers(0, files, table.num_rows)
    return [table.filter(pa.array(which == i)) for i in range(files)]


@dataclass
class Shape:
    """One merge level or a partition phase as the engine plans it at a crawl's counts."""

    phase: str
    inputs: int  # runs the largest task reads
    rows_per_input: int  # rows of its key range in each
    width: int  # keys of its range
    tasks: int


def shapes(
    name: str,
    writers: int,
    keys: int,
    rows: float,
    row_bytes: float,
    reader_rows: int | None,
    reader_files: int,
    reader_bytes: int = 0,
) -> list[Shape]:
    """The merge levels of a shuffle of ``writers`` runs of ``rows`` rows in all over ``keys`` keys, and
    (``reader_rows``, ``reader_bytes``) its readers (partition tasks), as engine/shuffle_plan.py plans
    them, assuming the rows spread evenly over the keys: the largest task of each."""
    from datapipe.config.sections import SplitConfig
    from datapipe.engine.shuffle_plan import cut, levels
    from datapipe.engine.shuffles import MERGE_TASK_BYTES

    fan_in = SplitConfig().shuffle_fan_in
    out = []
    groups, ranges = writers, 1
    for n, level in enumerate(levels(writers, keys, int(rows * row_bytes), fan_in, MERGE_TASK_BYTES, reader_files), 1):
        width = max(hi - lo for lo, hi in level.ranges)
        rows_in = rows / (groups * keys) * width  # of one input run: its group's share of every key of the range
        tasks = level.groups * len(level.ranges)
        out.append(Shape(name + (f"l{n}" if n > 1 else ""), min(fan_in, groups), int(rows_in), width, tasks))
        groups, ranges = level.groups, len(level.ranges)
    if reader_rows is not None:
        span = max(1, keys // ranges)
        pieces = max(1, math.ceil(rows / ranges / reader_rows))
        if reader_bytes:
            pieces = max(pieces, math.ceil(rows * row_bytes / ranges / reader_bytes))
        width = max(b - a for a, b in cut(0, span, pieces))
        out.append(Shape("", groups, int(rows / (groups * keys) * width), width, ranges * min(pieces, span)))
    return out


def after(work: Path, crawls: list[Crawl], map_mib: int, results: Results) -> Results:
    """Every phase's largest task of this code (those ``results`` selects), at each crawl's proportions."""
    from datapipe.config.sections import SplitConfig
    from datapipe.engine.shuffles import OUTPUT_READS
    from datapipe.engine.work_files import WorkFiles
    from datapipe.run_folder.layout import RunFolder

    rows = template(work)
    print(f"template: {json.dumps(rows)}", flush=True)
    split = SplitConfig()
    map_file = map_input(work, map_mib)
    rng = np.random.default_rng(48)
    fwd_schema = template_table(work, "shuffle1-r0").schema
    tables = {  # (segment, round) -> the template's rows of that round, as the partitions read them
        (0, 0): template_table(work, "shuffle0"),
        (1, 0): template_table(work, "shuffle1"),
        **{(1, int(r)): template_table(work, f"shuffle1-r{int(r) - 1}").cast(fwd_schema) for r in rows["minhash_round_rows"]},
    }
    per_doc = {
        (0, 0): rows["exact_rows"],
        (1, 0): rows["band_rows"],
        **{(1, int(r)): v for r, v in rows["minhash_round_rows"].items()},
    }
    row_bytes = {k: bytes_per_row(t, "part", work) for k, t in tables.items()}
    outputs = {  # segment -> kind -> the template's rows of that kind, and per document
        seg: {
            kind: (template_table(work, f"reduce{seg}-parts", pattern), rows["outputs"][str(seg)][count])
            for kind, pattern, count in (
                ("decisions", "[0r]*.parquet", "rows_out"),
                ("state", "state-*.parquet", "state_rows"),
                ("copies", "copies-*.parquet", "copies_rows"),
            )
            if rows["outputs"][str(seg)][count]
        }
        for seg in (0, 1)
    }

    for i, crawl in enumerate(crawls):
        root = work / f"after-{crawl.tb}" / "run"
        shutil.rmtree(root.parent, ignore_errors=True)
        root.mkdir(parents=True)
        spec_path = crawl_spec(root, crawl, map_file)
        spec = pickle.loads(spec_path.read_bytes())
        folder = RunFolder(root)
        M = crawl.map_tasks

        # The rounds' partition tasks (per round: rows / partition_rows, or bytes / partition_bytes when
        # more), whose outputs the merges read.
        tasks_of = {
            k: max(
                math.ceil(crawl.docs * v / split.partition_rows), math.ceil(crawl.docs * v * row_bytes[k] / split.partition_bytes)
            )
            for k, v in per_doc.items()
        }

        # --- map tasks: one real 256 MiB task per map phase (the same at every size but the runs it reads)
        owners = work / "map1-output.parquet"  # map1's output: the rows MinHash's owners answer from
        if i == 0 and (any(results.selected(f"map{seg}") for seg in range(3)) or not owners.exists()):
            decided: dict[str, Any] | None = None
            for seg in range(3):
                if seg:
                    decided = _decided_runs(folder, spec, seg - 1, outputs[seg - 1], crawl, tasks_of, work)
                r = in_child({"kind": "map", "spec": str(spec_path), "segment": seg, "decided": decided}, work)
                print(f"map{seg}: {r}", flush=True)
                map_rows = r
                for c in crawls:
                    if results.selected(f"map{seg}"):  # else run only for the files later phases read
                        results.append(_row(f"map{seg}", c, map_rows, "measured (the same task at every size)"))
            shutil.copy(WorkFiles(folder).map_output(1, spec.shards[0].key), owners)

        # --- each shuffle's merge levels and partitions
        for (seg, rnd), table in tables.items():
            writers = M if rnd == 0 else tasks_of[(seg, rnd - 1)]
            n_rows = crawl.docs * per_doc[(seg, rnd)]
            base = f"merge{seg}" + (f"r{rnd}" if rnd else "")
            plan = shapes(
                base, writers, M, n_rows, row_bytes[(seg, rnd)], split.partition_rows, split.shuffle_fan_in, split.partition_bytes
            )
            for shape in plan[:-1]:
                if not results.selected(shape.phase):
                    continue
                r = _merge_job(work, spec_path, folder, seg, rnd, shape, table, M, rng)
                results.append(_row(shape.phase, crawl, r, _how(shape, "runs")))
                print(f"{crawl.name} {shape.phase}: {shape} {r}", flush=True)
            shape = plan[-1]
            name = f"shuffle{seg}" + (f"r{rnd}" if rnd else "")
            if not results.selected(name):
                continue
            r = _partition_job(work, spec_path, folder, spec, seg, rnd, shape, table, M, crawl, rng)
            results.append(_row(name, crawl, r, _how(shape, "runs")))
            print(f"{crawl.name} {name}: {shape} {r}", flush=True)

        # --- the outputs merges (by shard), for the next map tasks
        for seg, kinds in outputs.items():
            # Writers: the partition tasks of the rounds that decide (exact dedup: round 0; MinHash: round 6).
            deciding = max((k for k in tables if k[0] == seg), key=lambda k: k[1]) if seg else (0, 0)
            writers = tasks_of[deciding]
            for kind, (table, rate) in kinds.items():
                t_bytes = bytes_per_row(table, "shard", work)
                plan = shapes(f"merge{seg}d", writers, M, crawl.docs * rate, t_bytes, None, OUTPUT_READS)
                for shape in plan:
                    if not results.selected(f"{shape.phase}:{kind}"):
                        continue
                    r = _outputs_job(work, spec_path, folder, seg, kind, shape, table, M, rng)
                    results.append(_row(f"{shape.phase}:{kind}", crawl, r, _how(shape, "partition outputs")))
                    print(f"{crawl.name} {shape.phase} {kind}: {shape} {r}", flush=True)

        # --- the combine step: nothing left open in the template; its loop over every shard remains
        if results.selected("reduce1"):
            r = in_child({"kind": "combine", "spec": str(spec_path), "segment": 1}, work)
            results.append(_row("reduce1", crawl, r, "measured (nothing left open: its loops over every shard)"))
        shutil.rmtree(root.parent, ignore_errors=True)
    if results.selected("pack"):
        for row in pack_rows(work, crawls):
            results.append(row)
    return results


def _how(shape: Shape, what: str) -> str:
    return f"measured: {shape.inputs:,} {what} x {shape.rows_per_input:,} rows of {shape.width:,} keys ({shape.tasks:,} tasks)"


def _row(phase: str, crawl: Crawl, r: dict[str, Any], how: str) -> dict[str, Any]:
    return {"phase": phase, "crawl": crawl.name, "cpu_s": r["cpu_s"], "peak_mib": r["peak_mib"], "how": how, "runs": [r]}


def _merge_job(
    work: Path,
    spec_path: Path,
    folder: Any,
    seg: int,
    rnd: int,
    shape: Shape,
    table: pa.Table,
    keys: int,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """The largest merge task of a level: ``shape.inputs`` runs (``DISTINCT`` distinct ones, the rest
    hard links) each holding ``shape.rows_per_input`` rows of its range."""
    from datapipe.engine.shuffle_plan import MergeTask

    lo, hi = 0, shape.width
    edge = edge_rows(table)
    made = []
    for d in range(min(DISTINCT, shape.inputs)):
        t = replicate(table, max(1, shape.rows_per_input), keys, 1000 + d)
        t = with_keys(t, "part", lo + rng.integers(0, hi - lo, t.num_rows))
        made.append(write_slice(folder.root, f"_work/bench-in/{shape.phase}-{d}.parquet", t, "part", lo, hi, keys, edge))
    inputs = _linked(folder, made, shape.inputs, shape.phase)
    task = MergeTask(1, 0, 0, lo, hi, tuple(inputs))
    r = in_child({"kind": "merge", "spec": str(spec_path), "segment": seg, "round": rnd, "task": task}, work)
    shutil.rmtree(folder.root / "_work", ignore_errors=True)
    return r


def _linked(folder: Any, made: list[Any], n: int, name: str) -> list[Any]:
    """``n`` inputs of a merge: the distinct files ``made``, then hard links to them (a merge's cost does
    not depend on which rows it merges)."""
    inputs = []
    for j in range(n):
        f = made[j % len(made)]
        if j >= len(made):
            link = f"_work/bench-in/{name}-{j}.parquet"
            os.link(folder.root / f.path, folder.root / link)
            f = replace(f, path=link)
        inputs.append(f)
    return inputs


def _outputs_job(
    work: Path,
    spec_path: Path,
    folder: Any,
    seg: int,
    kind: str,
    shape: Shape,
    table: pa.Table,
    keys: int,
    rng: np.random.Generator,
) -> dict[str, Any]:
    from datapipe.engine.shuffle_plan import MergeTask

    lo, hi = 0, shape.width
    edge = edge_rows(table)
    made = []
    for d in range(min(DISTINCT, shape.inputs)):
        t = replicate(table, max(1, shape.rows_per_input), keys, 2000 + d).slice(0, max(1, shape.rows_per_input))
        t = with_keys(t, "shard", lo + rng.integers(0, hi - lo, t.num_rows))
        made.append(write_slice(folder.root, f"_work/bench-in/{kind}-{d}.parquet", t, "shard", lo, hi, keys, edge))
    inputs = _linked(folder, made, shape.inputs, kind)
    task = MergeTask(1, 0, 0, lo, hi, tuple(inputs))
    r = in_child({"kind": "merge", "spec": str(spec_path), "segment": seg, "output_kind": kind, "task": task}, work)
    shutil.rmtree(folder.root / "_work", ignore_errors=True)
    return r


def _partition_job(
    work: Path,
    spec_path: Path,
    folder: Any,
    spec: Any,
    seg: int,
    rnd: int,
    shape: Shape,
    table: pa.Table,
    keys: int,
    crawl: Crawl,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """The largest partition task of a round: its rows (the template's round, repeated) over parts
    [0, width), dealt to ``shape.inputs`` runs; the rows of one template partition stay in one part (a
    pair and the signatures answered for it meet there). MinHash's answering rounds read the map outputs
    of the shards their parts own (part = shard ordinal: ``partitions`` is one per map task)."""
    from datapipe.engine.shuffle_plan import ReadTask, RunFile
    from datapipe.engine.work_files import WorkFiles
    from datapipe.storage.parquet_reads import footer_length

    lo, hi = 0, shape.width
    total = max(1, shape.rows_per_input * shape.inputs)
    t = replicate(table, total, keys, 3000 + rnd + 100 * seg)
    copies = np.repeat(np.arange(-(-t.num_rows // table.num_rows)), table.num_rows)[: t.num_rows]
    part = (t["part"].to_numpy().astype(np.int64) + copies) % (hi - lo) + lo
    t = with_keys(t, "part", part)
    outputs = None
    if seg == 1:  # MinHash: owners answer for the shards their parts own
        owned = list(range(lo, min(hi, keys)))
        kind = t["kind"].to_numpy() if "kind" in t.column_names else None
        if kind is not None:
            from datapipe.stages.minhash import ASK_DOC, ASK_SIG, HEAD, WAIT2

            # The rows whose answer reads a map output (stages/minhash.py: ``_answer_sigs``, ``_read_for``,
            # ``_verify``) ask for documents, or shards, their own part owns: a row goes to the owner of
            # the shard it reads (``_owner``: the part numbered the shard's ordinal modulo the parts, here
            # one part per shard), so each part's call reads its own shard. (Dealt at random over the
            # task's 28 owned shards, every part read every shard: shuffle1r2's 331 CPU s were 28 x 28
            # reads of a shard's signatures and their band keys, where the engine makes 28.)
            assert hi <= keys, "a part per shard: the partitions are one per map task"
            node, nbr = t["node"].to_numpy().copy(), t["nbr"].to_numpy().copy()
            asks = np.isin(kind, (ASK_SIG, ASK_DOC)) | ((kind == WAIT2) & (node != t["aux"].to_numpy()))
            # The asked row's shard becomes its part's, its row the template's (offset per copy, modulo a
            # map task's documents), so the asks that named one document still do: an owner answers each
            # (document, asker) once, and random rows would make every ask a distinct answer (a
            # 512-byte signature each: 5.5x the template's answers per ask in round 1).
            row = ((node[asks] & 0xFFFFFFFF) + copies[asks] * 4096) % crawl.docs_per_map  # copies apart
            node[asks] = (part[asks].astype(np.int64) << 32) | row
            heads = kind == HEAD
            nbr[heads] = part[heads]
            t = t.set_column(t.schema.get_field_index("node"), "node", pa.array(node))
            t = t.set_column(t.schema.get_field_index("nbr"), "nbr", pa.array(nbr))
        out = []
        source = work / "owned.parquet"
        if not source.exists():
            src = pq.read_table(work / "map1-output.parquet", columns=["id", "minhash_sig", "n_chars"])
            pq.write_table(src.take(pa.array(np.arange(crawl.docs_per_map) % src.num_rows)), source, row_group_size=1000)
        work_files = WorkFiles(folder)
        for o in owned:
            path = work_files.map_output(1, spec.shards[o].key, fetch=False)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)  # shard 0's real map output, when this run measured the map tasks
            os.link(source, path)
            rel = path.relative_to(folder.root).as_posix()
            out.append((o, RunFile(rel, crawl.docs_per_map, 0, 1, path.stat().st_size, footer_length(path))))
        outputs = tuple(out)
    edge = edge_rows(table)
    inputs = [
        write_slice(folder.root, f"_work/bench-in/{rnd}-{j}.parquet", piece, "part", lo, hi, keys, edge)
        for j, piece in enumerate(spread(t, shape.inputs, rng))
    ]
    task = ReadTask(0, lo, hi, tuple(inputs))
    r = in_child(
        {"kind": "partition", "spec": str(spec_path), "segment": seg, "round": rnd, "task": task, "outputs": outputs}, work
    )
    shutil.rmtree(folder.root / "_work", ignore_errors=True)
    return r


def _decided_runs(
    folder: Any, spec: Any, seg: int, kinds: dict[str, Any], crawl: Crawl, tasks_of: dict[Any, int], work: Path
) -> dict[str, Any]:
    """What the next map task of shard 0 reads of the step ending ``seg``: per kind, the runs of the last
    outputs merge level holding shard 0 (as many as the plan gives at this crawl's size), its rows those
    of its own documents at the template's rate."""
    from datapipe.engine.shuffle_plan import levels
    from datapipe.engine.shuffles import OUTPUT_READS
    from datapipe.engine.work_files import WorkFiles

    ids = pq.read_table(WorkFiles(folder).map_output(seg, spec.shards[0].key), columns=["id"])["id"].to_pylist()
    deciding = max((k for k in tasks_of if k[0] == seg), key=lambda k: k[1])
    out: dict[str, Any] = {}
    for kind, (table, rate) in kinds.items():
        n = max(1, int(rate * len(ids)))
        plan = levels(tasks_of[deciding], crawl.map_tasks, 1, 256, 1, OUTPUT_READS)
        files = plan[-1].groups if plan else min(tasks_of[deciding], OUTPUT_READS)
        # replicate() makes whole copies (it rounds): ask for one more copy so ``n`` rows remain after the cut
        t = replicate(table, n + table.num_rows, crawl.map_tasks, 11).slice(0, n)
        pick = np.sort(np.random.default_rng(seg).choice(len(ids), n, replace=False))
        if "id" in t.column_names:
            t = t.set_column(t.schema.get_field_index("id"), "id", pa.array([ids[i] for i in pick], pa.string()))
        if "row_key" in t.column_names:
            t = t.set_column(t.schema.get_field_index("row_key"), "row_key", pa.array(pick.astype(np.int64)))
        t = with_keys(t, "shard", np.zeros(n, np.int64))
        edge = edge_rows(t)
        pieces = spread(t, files, np.random.default_rng(0))
        out[kind] = tuple(
            write_slice(folder.root, f"_work/decided{seg}/{kind}-{g}.parquet", piece, "shard", 0, 1, crawl.map_tasks, edge)
            for g, piece in enumerate(pieces)
        )
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


# --- the driver --------------------------------------------------------------------------------

NODE = "f" * 56  # a Ray node id: placement weighs the map tasks by the node that ran them


def template_markers(work: Path) -> dict[str, str]:
    """A marker of the template run per kind of phase (its text)."""
    markers = work / "template" / "out" / "_work" / "markers"
    return {p: sorted((markers / p).rglob("*.json"))[0].read_text() for p in ("map0", "map1", "map2", "pack")}


class Counts:
    """A crawl's counts, to write each task's marker as a real one would read: rows per document of
    each round and output (the template's), bytes per row of each run."""

    def __init__(self, crawl: Crawl, rows: dict[str, Any], row_bytes: dict[str, float]) -> None:
        self.crawl, self.rows, self.row_bytes = crawl, rows, row_bytes
        self.per_doc = {
            0: {0: rows["exact_rows"]},
            1: {0: rows["band_rows"], **{int(r): v for r, v in rows["minhash_round_rows"].items()}},
        }


def _files(*entries: tuple[str, int]) -> list[dict[str, Any]]:
    return [{"path": p, "bytes": max(1, int(b)), "footer": 4096} for p, b in entries]


def marker_for(phase: str, task: Any, counts: Counts, templates: dict[str, str], spec: Any) -> bytes:
    """The marker ``task`` of ``phase`` would commit at the crawl's counts (a map task's: the template's,
    with its counts and files; the others': their counts and files)."""
    from datapipe.engine.shuffle_plan import MergeTask, ReadTask
    from datapipe.engine.work_files import WorkFiles
    from datapipe.run_folder.layout import RunFolder

    c = counts
    work = WorkFiles(RunFolder(Path(spec.root)))
    rel = lambda p: p.relative_to(work.folder.root).as_posix()  # noqa: E731
    docs = c.crawl.docs_per_map
    if phase.startswith("map"):
        seg = int(phase[3:])
        shard = task.args[0]
        m = json.loads(templates[phase] if phase in templates else templates["map0"])
        m.update(shard=shard.key, docs_in=docs, kept=docs, node=NODE)
        files = [(rel(work.map_output(seg, shard.key, fetch=False)), docs * 1000)]
        if seg in c.per_doc:
            n = int(docs * c.per_doc[seg][0])
            m["shuffle_rows"] = n
            files.append((rel(work.shuffle_file(seg, shard.key, fetch=False)), n * c.row_bytes[f"{seg}-0"]))
        m["files"] = _files(*files)
        return json.dumps(m, sort_keys=True).encode()
    if phase == "pack":
        m = json.loads(templates["pack"])
        m["node"] = NODE
        return json.dumps(m, sort_keys=True).encode()
    seg = int(phase[len("merge") :][0]) if phase.startswith("merge") else int(phase[len("shuffle") :][0])
    args = task.args
    if phase.startswith("merge"):
        t: MergeTask = args[-1]
        rows = sum(f.rows * (min(t.hi, f.hi) - max(t.lo, f.lo)) // max(1, f.hi - f.lo) for f in t.inputs)
        if "d" in phase:
            path = work.merged_outputs(seg, t.level, args[1], t.key, fetch=False)
            b = rows * 100
        else:
            path = work.merged_run(seg, args[1], t.level, t.key, fetch=False)
            b = rows * c.row_bytes[f"{seg}-{args[1]}"]
        return json.dumps({"rows": rows, "node": NODE, "files": _files((rel(path), b))}, sort_keys=True).encode()
    if phase.startswith("shuffle"):
        r: int = args[1]
        rt: ReadTask = args[2]
        rows_in = rt.rows
        here = c.per_doc[seg][r]
        nxt = c.per_doc[seg].get(r + 1, 0.0)
        forwarded = int(rows_in * nxt / here)
        last = max(c.per_doc[seg])
        deciding = r == last
        out_rates = c.rows["outputs"][str(seg)]
        m = {"rows_in": rows_in, "forwarded": forwarded, "rows_out": 0, "state_rows": 0, "copies_rows": 0, "node": NODE}
        files = []
        if forwarded:
            files.append(
                (rel(work.forward_file(seg, r, rt.index, fetch=False)), forwarded * c.row_bytes.get(f"{seg}-{r + 1}", 50))
            )
        if deciding:
            scale = rows_in / here
            for kind, key in (("decisions", "rows_out"), ("state", "state_rows"), ("copies", "copies_rows")):
                n = int(scale * out_rates[key])
                if n:
                    m[key] = n
                    files.append((rel(work.partition_file(kind, seg, rt.index, r, fetch=False)), n * 100))
        m["files"] = _files(*files)
        return json.dumps(m, sort_keys=True).encode()
    return json.dumps({"node": NODE, "files": []}).encode()  # the combine step


def driver(job: dict[str, Any]) -> dict[str, Any]:
    """In the child: the driver of a crawl's run, phase by phase, as the runner runs it (engine/runner.py
    ``_run_phase``): the phase's task list (from the markers of the phases before), each task placed and
    handed its inputs' committed entries (a remote run folder) — what holds the run up before its first
    task; then every task's marker adopted as it comes back; CPU seconds of each, and the driver's RSS
    growth per task (it keeps each marker's counts and files: ``MarkerStore.compact``)."""
    from datapipe.engine.phases import plan_phases
    from datapipe.engine.runner import _handed
    from datapipe.run_folder.layout import RunFolder

    spec = pickle.loads(Path(job["spec"]).read_bytes())
    counts = Counts(job["crawl"], job["rows"], job["row_bytes"])
    templates = template_markers(Path(job["work"]))
    folder = RunFolder(job["uri"])
    shutil.rmtree(folder.root, ignore_errors=True)
    gc.collect()
    rss0 = _kib("VmRSS")
    cpu = time.process_time()
    phases = plan_phases(spec)
    rows: list[dict[str, Any]] = [{"phase": "plan_phases", "plan_s": time.process_time() - cpu, "tasks": 0, "adopt_s": 0.0}]
    tasks = 0
    for phase in phases:
        cpu = time.process_time()
        work = phase.task_list(folder)
        assert work is not None, phase.name
        listed_s = time.process_time() - cpu
        if not work:
            continue
        cpu = time.process_time()
        todo = list(work)
        if phase.follows is not None:
            todo = phase.placed(todo, {k: m["node"] for k, m in folder.markers.read_all(phase.follows).items()})
        todo = [replace(t, committed=_handed(folder, phase, t)) for t in todo]
        placed_s = time.process_time() - cpu
        bodies = [(t.key, marker_for(phase.name, t, counts, templates, spec)) for t in todo]
        cpu = time.process_time()
        for key, body in bodies:
            folder.markers.adopt(phase.name, key, body)
        adopt_s = time.process_time() - cpu
        del bodies, todo, work
        n = len(folder.markers.read_all(phase.name))
        tasks += n
        rows.append(
            {
                "phase": phase.name,
                "tasks": n,
                "list_s": listed_s,
                "place_s": placed_s,
                "plan_s": listed_s + placed_s,
                "adopt_s": adopt_s,
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    gc.collect()
    growth = (_kib("VmRSS") - rss0) / 1024
    return {"tasks": tasks, "rss_growth_mib": growth, "phases": rows, "cpu_s": 0, "peak_mib": _kib("VmHWM") / 1024}


def worker(job: dict[str, Any]) -> dict[str, Any]:
    """In the child: what a worker holds for a task: the spec it unpickles (without the run's shards, as
    tasks now get it; with them, as every task got it before) and the committed entries it is handed."""
    light, full = Path(job["light"]).read_bytes(), Path(job["full"]).read_bytes()
    out = {}
    for name, blob in (("light", light), ("full", full)):
        r = measure(lambda b=blob: len(pickle.loads(b).shards))
        out[f"spec_{name}_cpu_s"], out[f"spec_{name}_bytes"] = r["cpu_s"], len(blob)
    return {**out, "cpu_s": 0, "peak_mib": 0}


def driver_rows(work: Path, crawls: list[Crawl], map_file: Path, rows: dict[str, Any]) -> list[dict[str, Any]]:
    """The driver's planning (up to a phase's first task) and its adoption of every marker, per phase,
    and a worker's spec, at each crawl's size."""
    from datapipe.run_folder.layout import RunFolder  # noqa: F401  (the child's)

    out: list[dict[str, Any]] = []
    row_bytes = {"0-0": bytes_per_row(template_table(work, "shuffle0"), "part", work)}
    fwd = template_table(work, "shuffle1-r0").schema
    row_bytes["1-0"] = bytes_per_row(template_table(work, "shuffle1"), "part", work)
    for r in rows["minhash_round_rows"]:
        row_bytes[f"1-{r}"] = bytes_per_row(template_table(work, f"shuffle1-r{int(r) - 1}").cast(fwd), "part", work)
    for crawl in crawls:
        root = work / f"driver-{crawl.tb}" / "run"
        shutil.rmtree(root.parent, ignore_errors=True)
        root.mkdir(parents=True)
        spec_path = crawl_spec(root, crawl, map_file)
        job = {
            "kind": "driver",
            "spec": str(spec_path),
            "work": str(work),
            "uri": f"s3://crawl-proportions/driver-{crawl.tb}",
            "crawl": crawl,
            "rows": rows,
            "row_bytes": row_bytes,
        }
        r = in_child(job, work)
        phases = [p for p in r["phases"] if p["tasks"]]
        worst = max(phases, key=lambda p: p["plan_s"])
        spec = pickle.loads(spec_path.read_bytes())
        light = root.parent / "light.pkl"
        light.write_bytes(pickle.dumps(replace(spec, shards=())))
        w = in_child({"kind": "worker", "light": str(light), "full": str(spec_path)}, work)
        out.append(
            {
                "phase": "driver",
                "crawl": crawl.name,
                "tasks": r["tasks"],
                "plan_s_max": worst["plan_s"],
                "plan_s_max_phase": worst["phase"],
                "adopt_s_per_task": sum(p["adopt_s"] for p in phases) / max(1, r["tasks"]),
                "rss_mib": r["rss_growth_mib"],
                "rss_kib_per_task": r["rss_growth_mib"] * 1024 / max(1, r["tasks"]),
                **w,
                "how": "measured: every phase planned from markers at the crawl's counts, every marker adopted",
                "runs": [r],
            }
        )
        print(f"{crawl.name} driver: {json.dumps({k: v for k, v in out[-1].items() if k != 'runs'})}", flush=True)
        shutil.rmtree(root.parent, ignore_errors=True)
    return out


def table_md(results: list[dict[str, Any]], before: list[dict[str, Any]] | None) -> str:
    """The before/after table: every phase's largest task per crawl, CPU s and peak RSS MiB."""
    rows = []
    order: list[str] = []
    for r in [*(before or []), *results]:
        if "cpu_s" in r and r["phase"] not in order:
            order.append(r["phase"])
    crawls = sorted({r["crawl"] for r in results}, key=lambda c: int(c.split()[0]))

    def cell(rs: list[dict[str, Any]] | None, phase: str, crawl: str) -> str:
        got = [r for r in rs or [] if r["phase"] == phase and r["crawl"] == crawl and "cpu_s" in r]
        if not got:
            return "-"
        r = max(got, key=lambda x: x["cpu_s"])
        mark = "" if r["cpu_s"] <= LIMIT_CPU_S and r["peak_mib"] <= LIMIT_MIB else " **over**"
        extra = "" if r["how"].startswith("measured") else " (extrapolated)"
        return f"{r['cpu_s']:,.1f} s, {r['peak_mib']:,.0f} MiB{extra}{mark}"

    head = " | ".join(f"{c} before | {c} after" for c in crawls)
    rows.append(f"| phase | {head} |")
    rows.append("|---" * (1 + 2 * len(crawls)) + "|")
    for phase in order:
        cells = " | ".join(f"{cell(before, phase, c)} | {cell(results, phase, c)}" for c in crawls)
        rows.append(f"| {phase} | {cells} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--crawls", default="10,100", help="crawl sizes in TB")
    ap.add_argument("--map-mib", type=int, default=256, help="a map task's input (256 MiB: split.target_bytes)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/crawl-proportions"))
    ap.add_argument("--before", type=Path, help="this bench's JSON for the code before issue 48 (the table's 'before')")
    ap.add_argument("--skip-tasks", action="store_true", help="only the driver and the worker's spec")
    ap.add_argument(
        "--phases",
        default="*",
        help="comma-separated patterns (fnmatch) of the phases to run, e.g. 'merge1r1*,shuffle1r[1-2],driver' (default: all)",
    )
    ap.add_argument("--json", type=Path, help="written after every phase (and at the end)")
    ap.add_argument("--peak-stack", action="store_true", help="print each task's Python stack at its peak RSS")
    ap.add_argument("--profile", type=Path, help="a cProfile of each task (FOLDER/<pid>.prof; CPU s then include its cost)")
    ap.add_argument("--keep", action="store_true", help="keep the --json file's rows of the phases not run again")
    ap.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.job:
        r = run_job(pickle.loads(a.job.read_bytes()))
        r["out"] = r.get("out") if isinstance(r.get("out"), (int, float, dict, type(None))) else str(r.get("out"))
        print(json.dumps(r))
        return 0
    a.work.mkdir(parents=True, exist_ok=True)
    if a.peak_stack:
        os.environ["CRAWL_PROPORTIONS_PEAK_STACK"] = "1"
    if a.profile:
        a.profile.mkdir(parents=True, exist_ok=True)
        os.environ["CRAWL_PROPORTIONS_PROFILE"] = str(a.profile.resolve())
    crawls = [Crawl(int(x)) for x in a.crawls.split(",")]
    kept = json.loads(a.json.read_text())["results"] if a.keep and a.json and a.json.is_file() else []
    results = Results(a.json, a.phases.split(","), kept)
    rows = template(a.work)
    if not a.skip_tasks:
        after(a.work, crawls, a.map_mib, results)
    if results.selected("driver"):
        for row in driver_rows(a.work, crawls, map_input(a.work, a.map_mib), rows):
            results.append(row)
    results.save(partial=False)
    before = json.loads(a.before.read_text())["results"] if a.before else None
    print(table_md(results.rows(), before))
    for r in results.rows():
        if "cpu_s" not in r:
            print(f"{r['phase']:>10} {r['crawl']:>7} {json.dumps({k: v for k, v in r.items() if k != 'runs'})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
