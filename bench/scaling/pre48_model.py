"""The 10 TB estimate of the engine BEFORE issue 48, from bench/scaling/scale.py's measured rates: kept only to
regenerate docs/scaling.md's historical "On paper" section. The estimate of the current engine is
bench/scaling/cost_model.py (crawl-sized tasks).

    python -m bench.scaling.pre48_model --scale bench/results/scale.json --fit bench/results/scale_fit.json

prints it; ``python -m bench.scaling.scaling_doc`` (same options, plus ``--explain`` and ``--write``)
writes docs/scaling.md around it.

Measured inputs (nothing here is a guess about datapipe's own speed):

* ``--scale``: bench/scaling/scale.py's JSON of its 1x/16x run (tasks and partitions scaled with the corpus,
  ``--s3 --count-opens``): per phase the tasks' CPU seconds and task count, the driver's CPU, the
  process tree's CPU, the store's requests and bytes, per scale.
* ``--fit``: one more bench/scaling/scale.py run with the same number of tasks as the 1x run but ``--base-docs``
  8 times larger, so a task holds 8x the documents. With it every cost splits into a part per task and
  a part per document: for each phase, CPU = a x tasks + b x documents, fitted (non-negative least
  squares) over all the runs' scales; the same for the driver's CPU, Ray's own CPU (tree - tasks -
  driver), store requests and bytes (+ a constant per run: Ray's start). A crawl's tasks hold
  ~500x more documents than the bench's, so its per-task costs are amortised far better; using the
  bench's per-document figure as it is would charge each crawl document the bench's per-task costs.

Assumptions (the constants below, each with its reason): documents of 2,000 bytes (the map phases' and
packing's per-document CPU is scaled by bytes per document; the shuffle phases handle keys, not text);
64 nodes x 64 cores; 20 ms per store request, sequential within a task; the driver's marker reads at
``MARKER_READERS`` at a time; each node moves 1.25 GB/s to and from the store, and transfers are
added to the time, not overlapped with compute.

The wall time of a phase with n tasks on K cores is (waves - 1) x task + task x straggler, waves =
ceil(n / K), task = its CPU + its requests' latency; straggler = the phase's largest task / its mean task
at the largest measured scale; for map phases, the mean task + the largest task's excess over the mean,
fitted per task and per document of a task over the runs (a fixed part: the first task of a worker
loads the models); for the MinHash decisions merge, bench/scaling/merge_task.py's crawl-sized task. Phases
run one after another (a phase waits for the one before). Serial steps (the driver's CPU, its marker
reads, a phase's one task, Ray's start) are listed apart: each must stay under 5% of the total.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

from bench._support.paths import ROOT

DOCS = 5_000_000_000
BYTES = 10 * 10**12
NODES = 64
CORES_PER_NODE = 64
TARGET = 256 << 20  # split.target_bytes default: a crawl map task (effective_target keeps it at this size here)
PARTITIONS = 4096  # dedup/minhash `partitions`, the largest allowed: 1.2M documents per partition
MAP_DOCS_PER_MERGE = 64  # shuffle_groups = map tasks / 64: a merge task combines 64 map tasks' rows
REQUEST_S = 0.020  # one object-store round trip (S3 GET/PUT first byte, same region)
# The driver reads no marker back from the store in a run it starts: each task's marker comes back with
# its result (RunFolder.adopt_marker; before 2026-11-27 the driver's pull read every marker before the
# next phase and the sweep read them all again, 16 at a time: 2 x 215k x 20 ms / 16 = 526 s serial).
# What is left serial on the store is listing: one listing of the markers when the run starts and at
# the sweep, and the end of the run's two damage checks and its sweep each list every object of the
# run (run_folder/integrity.py, remote.sweep), a page of LIST_PAGE keys per round trip.
LIST_PAGE = 1000
END_LISTINGS = 3
# Objects of the run on the store per task: its marker and the files it names, counted in the driver's
# mirror of the runs in scale.json and scale_fit*.json (2026-11-27: 2.42 at 1x and at 16x, 2.57 and
# 2.48 in the fit runs). Fitted PUTs are no bound: a marker's upload alone is 3 requests (multipart).
OBJECTS_PER_TASK = 2.6
NODE_GBPS = 1.25  # GB/s per node to and from the store (10 Gbit/s)
# The driver's own threads, measured where they hold at crawl scale (bench/scaling/driver_scale.py --dispatch on
# the loopback store, no strace: dispatch to the sweep at its largest size, per task; one long task, per
# wall second; the end of the run's counts and statistics per task), used instead of the scale runs' fit
# of the driver's own CPU (strace, loads of 40-60: wall-proportional costs counted per task) when present.
DRIVER_JSON = ROOT / "bench" / "results" / "driver_dispatch_store.json"
from datapipe.engine.pack_plan import TOKENS_PER_TASK as TOKENS_PER_PACK_TASK  # noqa: E402  (2^30 since 2026-11-27)

# The driver writes each marker it adopts to its mirror unless the task ran on its own node, where the
# worker wrote it already (run_folder/remote.adopt): on 64 nodes 63 of 64 markers. The one-node bench
# never takes that path (its mirror always holds the marker), so it is charged here, per task:
# storage/atomic.write_copy of a 4.2 kB marker (a map task's), measured 2026-11-27 (1,000 writes, 3
# repeats, 2 loaded cores): 0.050-0.052 ms of CPU, 0.056-0.098 ms of wall; the wall is charged (the
# loop waits for it). Before, write_bytes_atomic fsynced each copy: 0.23-0.29 ms of CPU, 0.52-1.01 ms wall.
MIRROR_COPY_S = 0.1e-3

STRAGGLER_DEFAULT = 1.5  # a phase's largest / mean task where the bench JSON does not record it
BUDGET_H = 1.5
SERIAL_SHARE = 0.05
TEXT_PHASES = re.compile(r"^(map\d+|lines|pack)$")

# Published figures (issue 30's anchors).
ANCHORS = [
    ("Data-Juicer", "dedup (MinHash) of 5 TB in 2.8 h on 1,280 cores", 5e12, 2.8, 1280),
    ("datatrove", "MinHash signatures of 4 TB in 71 min on 1,200 tasks", 4e12, 71 / 60, 1200),
]


# The MinHash decisions merge is measured at crawl size (bench/scaling/merge_task.py), not fitted from the
# bench's tiny tasks (36 ms on average: their fixed costs).
MEASURED_MERGE = "merge1d"
MERGE_TASK_JSON = ROOT / "bench" / "results" / "merge_task.json"
# Kinds of merged partition outputs a map task reads per global stage it applies: exact dedup's
# decisions and copies (map1), MinHash's decisions, states and copies (map2).
MERGED_KINDS = {"map1": 2, "map2": 3}
# Store requests a reader makes per merged file it reads, one after another within a task: a HEAD
# when the process first opens the object, a GET of its footer (the length the writer's marker
# records) and a ranged GET of its row groups (docs/cluster.md, storage/parquet_reads.py).
READ_REQUESTS_PER_FILE = 3
# The merge layout this model was fitted on, gone from the engine since issue 48 (sorted runs merged in
# levels of bounded fan-in): bench/scaling/crawl_estimate.py estimates the current engine from crawl-sized tasks.
PRE_RUNS_KEYS_PER_FILE = 128
PRE_RUNS_OUTPUT_RANGES = 8


def keys_per_file() -> int:
    """Keys (parts, shards) a merged file held at most (engine/tasks/merge.py ``KEYS_PER_FILE`` before issue
    48's sorted runs, at ca37341: this model describes that engine's merges)."""
    return PRE_RUNS_KEYS_PER_FILE


def footer_us_per_row_group(row_groups: int = 1024, files: int = 4) -> float:
    """Measured: CPU us per row group of a merged shuffle file's footer when a partition scans it for its
    `part` (pyarrow's filtered dataset scan, as engine/tasks/reduce.py does): a synthetic file of
    ``row_groups`` row groups of 8 columns, one per part, scanned ``files`` times for one part."""
    import tempfile
    import time

    import pyarrow as pa
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    n = 25
    cols = {f"c{i}": pa.array(np.arange(row_groups * n, dtype=np.int64)) for i in range(7)}
    table = pa.table({"part": pa.array(np.repeat(np.arange(row_groups, dtype=np.int32), n)), **cols})
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/merged.parquet"
        with pq.ParquetWriter(path, table.schema) as w:
            for p in range(row_groups):
                w.write_table(table.slice(p * n, n))
        best = float("inf")
        for _ in range(3):
            t = time.process_time()
            pads.dataset([path] * files, format="parquet").to_table(filter=pads.field("part") == row_groups // 2)
            best = min(best, time.process_time() - t)
    return best / (files * row_groups) * 1e6


def merged_reads(phase: str, k: str, g: int) -> int:
    """Merged files one task of ``phase`` reads at crawl scale: a partition one per group (every round's
    inputs outnumber the groups), a map task one per group and kind of the stage it applies."""
    if k == "partition":
        return g
    if k == "map" and phase != "map0":
        return g * MERGED_KINDS.get(phase, 3)
    return 0


def merged_writes(phase: str, k: str, m: int, p: int, g: int, split: bool) -> int:
    """Files one merge task of ``phase`` writes at crawl scale: one, or with ``split`` one per
    ``KEYS_PER_FILE`` keys of its output (for a decisions merge, per kind of MinHash's three)."""
    if k != "merge":
        return 0
    if phase.endswith("d"):
        keys = math.ceil(m / output_ranges(g))
        return 3 * (math.ceil(keys / keys_per_file()) if split else 1)
    return math.ceil(p / keys_per_file()) if split else 1


def footer_rgs(phase: str, k: str, m: int, p: int, g: int, split: bool) -> float:
    """Row groups of footers one task of ``phase`` parses at crawl scale: merged files hold a row group per
    key (part or shard) of every key; with ``split`` (the code since 2026-11-27) each merge output is
    split into files of at most KEYS_PER_FILE keys, and a reader opens the one of its key."""
    per_file = (lambda keys: min(keys, keys_per_file())) if split else (lambda keys: keys)
    if k == "partition":  # G merged files of the round's rows, a row group per part
        return g * per_file(p)
    if k == "map" and phase != "map0":  # the decisions of the stage before: G merged files of its shard's range, per kind
        return merged_reads(phase, k, g) * per_file(math.ceil(m / output_ranges(g)))
    if k == "merge":
        if phase.endswith("d"):  # partition outputs: few row groups each
            return math.ceil(p / g)
        inputs = m if re.fullmatch(r"merge\d+", phase) else p  # map tasks' shuffle files or last round's
        return math.ceil(inputs / g) * p
    return 0.0


def output_ranges(g: int) -> int:
    """Ranges of shards each group of a deciding step's outputs is cut into (engine/tasks/merge.py
    ``OUTPUT_RANGES`` before issue 48's sorted runs, at ca37341): its merge phase had G x that many tasks."""
    return PRE_RUNS_OUTPUT_RANGES


def kind(phase: str) -> str:
    if re.fullmatch(r"map\d+|lines", phase):
        return "map"
    if re.fullmatch(r"shuffle\d+(r\d+)?", phase):
        return "partition"
    if re.fullmatch(r"merge\d+(r\d+|d)?", phase):
        return "merge"
    if phase == "pack":
        return "pack"
    if phase.startswith("reduce"):
        return "single"
    return "other"


def points(paths: list[Path]) -> list[dict[str, Any]]:
    runs = []
    for p in paths:
        runs += json.loads(p.read_text())["extra"]["scales"]
    return runs


def driver_measured(path: Path = DRIVER_JSON) -> dict[str, Any] | None:
    """The driver's own-thread CPU from bench/scaling/driver_scale.py's JSON: per task (dispatch to the sweep on
    the store at its largest size, plus the end of the run's counts and statistics where measured) and
    per wall second (one long task); None without the file."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    top = max(data["dispatch"]["rows"], key=lambda r: r["tasks"])
    idle = data["dispatch"].get("idle")
    end = data.get("end_of_run")
    end_s = max(end["rows"], key=lambda r: r["tasks"])["own_cpu_s_per_task"] if end else 0.0
    return {
        "tasks": top["tasks"],
        "dispatch_s": top["own_cpu_s"] / top["tasks"],
        "end_of_run_s": end_s,
        "per_task_s": top["own_cpu_s"] / top["tasks"] + end_s,
        "per_wall_s": idle["own_cpu_s"] / idle["seconds"] if idle else 0.0,
    }


PARTS = ("plan", "submit", "results", "commit")  # a phase's parts as the runner records them


def _sections_fit(pts: list[tuple[str, int, float, float]], wall: bool) -> dict[str, Any]:
    """One non-negative least squares over every phase section: ``cpu = a_kind x tasks + c_kind (+ w x
    wall seconds)``, ``w`` shared by every kind (what the driver spends per second whatever it does:
    the run lock's heartbeat on the store, the results loop's wake-ups, the progress line)."""
    kinds = sorted({k for k, *_ in pts})
    width = 2 * len(kinds) + (1 if wall else 0)
    rows = []
    for k, tasks, seconds, _ in pts:
        row = [0.0] * width
        i = kinds.index(k)
        row[i], row[len(kinds) + i] = float(tasks), 1.0
        if wall:
            row[-1] = seconds
        rows.append(row)
    A = np.array(rows)
    scale = A.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(A / scale, np.array([y for *_, y in pts]))
    coef = coef / scale
    # A kind whose phases all have one size (pack and the combine: one task each here) cannot split its
    # CPU into a part per task and one per phase: it is charged the largest part per task of the others.
    resolved = [i for i, k in enumerate(kinds) if len({pt[1] for pt in pts if pt[0] == k}) > 1]
    top = max((coef[i] for i in resolved), default=0.0)
    for i, k in enumerate(kinds):
        if i not in resolved:
            mine = [pt for pt in pts if pt[0] == k]
            coef[i] = top
            coef[len(kinds) + i] = max(
                0.0, float(np.mean([y - top * t - (coef[-1] * w if wall else 0.0) for _, t, w, y in mine]))
            )
    pred = A @ coef
    out: dict[str, Any] = {"per_wall_s": float(coef[-1]) if wall else 0.0, "kinds": {}}
    for i, k in enumerate(kinds):
        mine = [j for j, pt in enumerate(pts) if pt[0] == k]
        resid = [pts[j][3] - pred[j] for j in mine]
        out["kinds"][k] = {
            "per_task_s": float(coef[i]),
            "per_phase_s": float(coef[len(kinds) + i]),
            "points": len(mine),
            "tasks": sorted({pts[j][1] for j in mine}),
            "resid_s": (min(resid), max(resid)),
        }
    return out


def driver_sections(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The driver's own-thread CPU as it recorded it by section (run.json ``driver_cpu_s``, runtime/own_cpu.py).

    Each phase's section is fitted as ``a x its tasks + c`` per kind of phase, plus ``w x its wall
    seconds`` shared by all kinds (``_sections_fit``; without ``w`` too, as the upper bound: on 2 loaded
    cores a phase's wall grows with its tasks, so what the driver spends per second of wall otherwise
    counts per task, and a crawl's phase has ~500 times the documents per task); the end of the run
    as ``a x the run's tasks + c``; the start (imports, planning, Ray's start), Ray's shutdown and what
    follows the record (the process's exit) as their means. None: fewer than two runs recorded it."""
    have = [r for r in runs if r.get("driver_sections_s")]
    if len(have) < 2:
        return None
    pts: list[tuple[str, int, float, float]] = []  # (kind, tasks, wall s, own CPU s) of each phase section
    # The same by part, where the runs recorded parts (runner.run_phases, since 2026-11-27 17:30 UTC):
    # "held" (plan + commit: before the phase's first task is handed over and after its last marker),
    # "submit" (handing its tasks over) and "results" (up to the last marker adopted).
    parts: dict[str, list[tuple[str, int, float, float]]] = {"held": [], "submit": [], "results": []}
    for r in have:
        by_phase: dict[str, dict[str, float]] = {}
        for name, s in r["driver_sections_s"].items():
            if name.startswith("phase:"):
                p, _, part = name.split(":", 1)[1].partition(":")
                by_phase.setdefault(p, {})[part or "whole"] = s
        for p, cut in by_phase.items():
            ph = r["phases"].get(p, {})
            at = (kind(p), ph.get("tasks", 0), ph.get("wall_s") or 0.0)
            pts.append((*at, sum(cut.values())))
            if "plan" in cut and "commit" in cut:
                parts["held"].append((*at, cut["plan"] + cut["commit"]))
                parts["submit"].append((*at, cut.get("submit", 0.0)))
                parts["results"].append((*at, cut.get("results", 0.0)))
    end = fit([(r["tasks"], 0.0, 1.0) for r in have], [r["driver_sections_s"].get("end", 0.0) for r in have], constant=True)
    sec = [r["driver_sections_s"] for r in have]
    rest = [r["driver_own_cpu_s"] - sum(x.values()) for r, x in zip(have, sec)]
    with_wall = _sections_fit(pts, wall=True)
    split = None
    if parts["held"]:
        per_run = []
        for r in have:
            x = r["driver_sections_s"]
            if any(n.endswith(":plan") for n in x):
                sums = {p: sum(v for n, v in x.items() if n.startswith("phase:") and n.endswith(f":{p}")) for p in PARTS}
                per_run.append(
                    {"tasks": r["tasks"], "wall_s": r["wall_s"], "start": x.get("start", 0.0), "end": x.get("end", 0.0), **sums}
                )
        split = {
            "per_run": per_run,
            "runs": sum(1 for r in have if any(n.endswith(":plan") for n in r["driver_sections_s"])),
            "held": _sections_fit(parts["held"], wall=False)["kinds"],
            "submit": _sections_fit(parts["submit"], wall=False)["kinds"],
            "results": _sections_fit(parts["results"], wall=True),
        }
    return {
        "runs": len(have),
        "split": split,
        "kinds": with_wall["kinds"],
        "per_wall_s": with_wall["per_wall_s"],
        "per_task_only": _sections_fit(pts, wall=False)["kinds"],
        "end": (end[0], end[2]),
        "start_s": [x.get("start", 0.0) for x in sec],
        "exit_s": [x.get("executor_exit", 0.0) for x in sec],
        "rest_s": rest,
        "loop_s": [sum(v for n, v in x.items() if n.startswith("phase:")) for x in sec],
        "end_s": [x.get("end", 0.0) for x in sec],
        "tasks": [r["tasks"] for r in have],
        "whole_s": [r["driver_own_cpu_s"] for r in have],
        "walls_s": [r["wall_s"] for r in have],
    }


def fit(rows: list[tuple[float, float, float]], y: list[float], constant: bool = False) -> list[float]:
    """Non-negative least squares y = a*tasks + b*docs (+ c): [a, b(, c)]."""
    cols = [[r[0], r[1]] + ([1.0] if constant else []) for r in rows]
    A = np.array(cols, dtype=float)
    scale = A.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(A / scale, np.array(y, dtype=float))
    return list(coef / scale)


def store_total(r: dict[str, Any], keys: tuple[str, ...]) -> float:
    return float(sum(r.get("s3", {}).get(k, 0) for k in keys))


def model(
    runs: list[dict[str, Any]],
    main: dict[str, Any],
    footer_us: float,
    groups: int | None = None,
    split: bool = True,
    merge_task: dict[str, Any] | None = None,
    driver_runs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The crawl estimate: per phase and for the whole run; ``main``: the largest scale of --scale.
    ``driver_runs``: more bench/scaling/scale.py runs (many small tasks) for the driver's sections only.
    ``groups``: split.shuffle_groups (default: a merge task per MAP_DOCS_PER_MERGE map tasks).
    ``split``: merged files split by key range (the code); False: one file per merge task (before).
    ``merge_task``: bench/scaling/merge_task.py's JSON (MEASURED_MERGE's task from it, not from the fit)."""
    K = NODES * CORES_PER_NODE
    bytes_factor = (BYTES / DOCS) / (main["corpus"]["bytes"] / main["docs"])
    map_tasks = math.ceil(BYTES / TARGET)
    groups = groups or max(8, map_tasks // MAP_DOCS_PER_MERGE)
    tokens_per_doc = main["tokens"] / main["docs"]
    crawl_tasks = {
        "map": map_tasks,
        "partition": PARTITIONS,
        "merge": groups,
        "pack": math.ceil(tokens_per_doc * bytes_factor * DOCS / TOKENS_PER_PACK_TASK),
        "single": 1,
    }
    phases = [p for p in main["phases"] if p != "stats" and kind(p) != "other"]
    per_phase = []
    total_tasks = 0
    for p in phases:
        have = [r for r in runs if p in r["phases"] and r["phases"][p]["tasks"]]
        # A single task (the MinHash combine) reads what the partitions left: its work grows with the
        # partitions' files, not the documents (none are left open in these runs).
        single = kind(p) == "single"
        xs = [(r["phases"][p]["tasks"], r["partitions"] if single else r["docs"], 0.0) for r in have]
        ys = [r["phases"][p]["task_cpu_s"] for r in have]
        a, b = fit(xs, ys) if len(have) > 1 else (0.0, ys[0] / xs[0][1])
        n = crawl_tasks[kind(p)] * (output_ranges(groups) if re.fullmatch(r"merge\d+d", p) else 1)
        f = bytes_factor if TEXT_PHASES.match(p) else 1.0
        footer_s = footer_rgs(p, kind(p), map_tasks, PARTITIONS, groups, split) * footer_us / 1e6
        ph = main["phases"][p]
        mean = ph["task_cpu_s"] / ph["tasks"] if ph["tasks"] else 0.0
        straggler = ph["task_cpu_s_max"] / mean if ph.get("task_cpu_s_max") and mean > 0 else STRAGGLER_DEFAULT
        measured = merge_task is not None and p == MEASURED_MERGE
        fitted = (a, b)  # what the bench's runs say (check_fit compares them with those runs)
        if measured:
            # Measured at crawl size: a fixed part per task (one row group per shard of its range
            # written) and a part per row of its group's outputs; the straggler from the rows per task.
            mt = merge_task
            a, b = mt["fit"]["task_s"], mt["fit"]["per_row_us"] * 1e-6 * sum(mt["rows_per_doc"].values())  # type: ignore[index]
            from bench.scaling.merge_task import task_sizes

            straggler = task_sizes(mt, groups)["straggler"]  # type: ignore[arg-type]
        cpu = a * n + b * (PARTITIONS if single else DOCS * f) + footer_s * n
        excess = None
        if kind(p) == "map" and len({r["docs"] // r["phases"][p]["tasks"] for r in have}) > 1:
            # A map phase's largest task is its mean task plus a cost of its own (the first task of a
            # worker loads the models): the excess of the largest over the mean is fitted as a part per
            # task and a part per document of a task over the runs (the same documents in every task
            # of a run), not taken as a ratio: the bench's tasks hold ~500 times fewer documents than
            # the crawl's, so its largest / mean (3.5 for map0 at 16x, 1.4 with 8x the documents per
            # task) is mostly that fixed part.
            ex = [r["phases"][p]["task_cpu_s_max"] - r["phases"][p]["task_cpu_s"] / r["phases"][p]["tasks"] for r in have]
            per = [(1.0, r["docs"] / r["phases"][p]["tasks"], 0.0) for r in have]
            e0, e1 = fit(per, ex)
            excess = (e0, e1)
            straggler = 1.0 + (e0 + e1 * f * DOCS / n) / (cpu / n)
        # Requests a task makes beyond the fitted ones: a GET per merged file it reads (the bench's G is
        # 8, the crawl's far more) and a PUT per extra file a merge task writes.
        io_s = (merged_reads(p, kind(p), groups) * READ_REQUESTS_PER_FILE) * REQUEST_S
        io_s += max(0, merged_writes(p, kind(p), map_tasks, PARTITIONS, groups, split) - 1) * REQUEST_S
        per_phase.append(
            {
                "phase": p,
                "kind": kind(p),
                "fit_points": len(have),
                "per_task_s": a,
                "per_doc_us": b * 1e6,  # single: per partition
                "fitted": fitted,
                "bench_us_per_doc": ph["cpu_us_per_doc"],
                "crawl_tasks": n,
                "footer_s_per_task": footer_s,
                "io_s_per_task": io_s,
                "files_written_per_task": merged_writes(p, kind(p), map_tasks, PARTITIONS, groups, split),
                "measured": measured,
                "crawl_cpu_core_h": cpu / 3600,
                "task_cpu_s": cpu / n,
                "straggler": straggler,
                "excess_fit": excess,
            }
        )
        total_tasks += n
    # Whole-run quantities: per task, per document and a constant per run (Ray's start).
    xs = [(r["tasks"], r["docs"], 1.0) for r in runs]
    # The driver's serial work is its own threads' (the loop, markers, plans, the end of the run); Ray's
    # threads in the driver (submission, results, gRPC, timers) run beside it on the driver node's
    # other cores, so they are fitted apart and only checked against one core over the run.
    # Per task and per run only: the driver handles no documents (it reads markers and footers). A
    # per-document term fitted 0 on one set of runs and 32 us on the next, from 0.5 s between two runs
    # of the same tasks (noise at load averages of 40-60), which 5B documents would turn into hours.
    drv = fit([(r["tasks"], 0.0, 1.0) for r in runs], [r.get("driver_own_cpu_s", r["driver_cpu_s"]) for r in runs], constant=True)
    measured = driver_measured()
    per_wall = 0.0  # the driver's own CPU per second of the run that does not follow tasks (polls, timers)
    if measured is not None and measured["per_task_s"] >= drv[0]:
        # The larger of the two per task: the scale runs' fit is the real pipeline's driver (its markers,
        # files and end of run) on 2 cores shared with the workers; the dispatch bench is trivial tasks
        # at 10,000 a phase on a driver with the cores to itself. The runs' constant (planning) is kept.
        drv, per_wall = [measured["per_task_s"], 0.0, drv[2]], measured["per_wall_s"]
    elif measured is not None:
        measured = {**measured, "below_fit": True}
    # The driver's own CPU as it recorded it by section: each phase kind's part per task and per phase
    # (fitted over every phase of every run), the end of the run's part per task, the start as measured.
    # It replaces both figures above where the runs recorded it; they are shown beside it.
    sections = driver_sections(runs + (driver_runs or []))
    driver_parts: dict[str, float] = {}
    driver_parts_upper = 0.0
    if sections is not None:
        kinds = sections["kinds"]
        for ph in per_phase:
            k = kinds.get(ph["kind"])
            if k is not None:
                driver_parts[ph["kind"]] = (
                    driver_parts.get(ph["kind"], 0.0) + k["per_task_s"] * ph["crawl_tasks"] + k["per_phase_s"]
                )
        driver_parts["end"] = sections["end"][0] * total_tasks + sections["end"][1]
        driver_parts["mirror copies"] = MIRROR_COPY_S * (NODES - 1) / NODES * total_tasks
        constant = float(np.mean(sections["start_s"]) + np.mean(sections["exit_s"]) + np.mean(sections["rest_s"]))
        driver_parts["start, Ray's shutdown, exit"] = constant
        per_task = (sum(driver_parts.values()) - constant) / total_tasks
        # What the driver spends per second of wall runs over the whole run (below); the upper bound
        # charges every phase section's CPU per task and per phase instead.
        drv, per_wall = [per_task, 0.0, constant], sections["per_wall_s"]
        upper = sum(driver_parts.values()) - sum(driver_parts.get(k, 0.0) for k in kinds)
        for ph in per_phase:
            k = sections["per_task_only"].get(ph["kind"])
            if k is not None:
                upper += k["per_task_s"] * ph["crawl_tasks"] + k["per_phase_s"]
        driver_parts_upper = upper
    # Where the runs recorded each phase by part: what of the driver's CPU holds the run up. A phase's
    # tasks are all handed to Ray at its start and Ray gives a freed core the next queued task without
    # the driver, so the driver's work while tasks run (handing over all but the first K, taking
    # results and adopting markers, the heartbeat and the loop's wake-ups) runs beside them on the
    # head's core; what holds the run up is the start, each phase's plan and commit (before its first
    # task and after its last marker), handing over its first K tasks (the cores wait for them: at most
    # K x the part per task) and the end of the run. Checked: the work beside the tasks stays under one
    # core in every phase, and the handing over of a phase ends before its first tasks do.
    held = None
    if sections is not None and sections["split"] is not None:
        sp = sections["split"]
        per_wall_split = sp["results"]["per_wall_s"]
        held_parts: collections.Counter[str] = collections.Counter()
        beside: list[dict[str, Any]] = []
        for ph in per_phase:
            n, k = ph["crawl_tasks"], ph["kind"]
            h, sub, res = sp["held"].get(k), sp["submit"].get(k), sp["results"]["kinds"].get(k)
            if h is None or sub is None or res is None:
                continue
            held_parts[k] += h["per_task_s"] * n + h["per_phase_s"]
            held_parts["handing over the first K tasks"] += sub["per_task_s"] * min(n, K) + sub["per_phase_s"]
            side = sub["per_task_s"] * max(0, n - K) + res["per_task_s"] * n + res["per_phase_s"]
            side += MIRROR_COPY_S * (NODES - 1) / NODES * n
            beside.append({"phase": ph["phase"], "kind": k, "tasks": n, "beside_s": side, "submit_s": sub["per_task_s"] * n})
        held_parts["end"] = sections["end"][0] * total_tasks + sections["end"][1]
        held_parts["start, Ray's shutdown, exit"] = driver_parts["start, Ray's shutdown, exit"]
        held = {"parts": dict(held_parts), "beside": beside, "per_wall_s": per_wall_split, "runs": sp["runs"]}
    # Ray's threads in the driver handle tasks, not documents: per task and per run, as the driver's own.
    drv_ray = fit([(r["tasks"], 0.0, 1.0) for r in runs], [r.get("driver_ray_threads_cpu_s", 0.0) for r in runs], constant=True)
    ray = fit(xs, [r["tree_cpu_s"] - r["task_cpu_s"] - r["driver_cpu_s"] for r in runs], constant=True)
    req = {k: fit(xs, [store_total(r, (k,)) for r in runs], constant=True) for k in ("GET", "PUT", "LIST", "HEAD")}
    moved = fit(xs, [store_total(r, ("bytes_read", "bytes_written")) for r in runs], constant=True)
    requests_total = {k: c[0] * total_tasks + c[1] * DOCS + c[2] for k, c in req.items()}
    per_task_requests = sum(c[0] + c[1] * DOCS / total_tasks for c in req.values())
    latency = per_task_requests * REQUEST_S
    phase_rows = []
    wall = 0.0
    for ph in per_phase:
        n = ph["crawl_tasks"]
        task = ph["task_cpu_s"] + latency + ph["io_s_per_task"]
        waves = math.ceil(n / K)
        w = (waves - 1) * task + task * max(1.0, ph["straggler"])
        ph.update(waves=waves, task_wall_s=task, wall_s=w)
        wall += w
        phase_rows.append(ph)
    ray_parallel_s = (ray[0] * total_tasks + ray[1] * DOCS) / K
    driver_s = drv[0] * total_tasks + drv[1] * DOCS + drv[2]
    # The measured objects per task count one file per merge task; a split merge task writes more.
    extra_files = sum(max(0, ph["files_written_per_task"] - 1) * ph["crawl_tasks"] for ph in per_phase)
    objects = OBJECTS_PER_TASK * total_tasks + extra_files
    marker_s = (2 * math.ceil(total_tasks / LIST_PAGE) + END_LISTINGS * math.ceil(objects / LIST_PAGE)) * REQUEST_S
    moved_bytes = moved[0] * total_tasks + moved[1] * DOCS * bytes_factor
    transfer_s = moved_bytes / (NODES * NODE_GBPS * 1e9)
    # The driver's constant (its start) is its own serial CPU: in its row when fitted by section (it
    # was counted in both rows before).
    start_s = ray[2] + (0.0 if sections is not None else drv[2])
    driver_ray_s = drv_ray[0] * total_tasks + drv_ray[1] * DOCS + drv_ray[2]
    # The part per wall second runs over the whole run, the driver's own serial time included:
    # driver = per task + per_wall x total, total = the rest + driver.
    rest_s = wall + ray_parallel_s + marker_s + transfer_s + start_s
    driver_s = (driver_s + per_wall * rest_s) / (1.0 - per_wall)
    if held is None:
        total_s = rest_s + driver_s
        driver_row = ("the driver's CPU in its own threads (dispatch, completions, markers, plans, end of run)", driver_s)
    else:
        held_s = sum(held["parts"].values())
        total_s = rest_s + held_s
        walls = {ph["phase"]: ph for ph in phase_rows}
        for b in held["beside"]:  # the driver's CPU beside running tasks, as a share of one core
            w = walls[b["phase"]]["wall_s"]
            b["core_share"] = (b["beside_s"] + held["per_wall_s"] * w) / w
            b["submit_vs_task"] = b["submit_s"] / walls[b["phase"]]["task_wall_s"]
        held.update(
            all_share=driver_s / (rest_s + driver_s),
            held_s=held_s,
            beside_s=sum(b["beside_s"] for b in held["beside"]) + held["per_wall_s"] * total_s,
        )
        driver_row = (
            "the driver's CPU that holds the run up (start, each phase's plan and commit, "
            "its first K tasks handed over, end of run)",
            held_s,
        )
    longest = max(phase_rows, key=lambda ph: ph["task_wall_s"] * ph["straggler"])
    serial = [
        driver_row,
        ("the driver's store listings (markers at the start and the sweep; every object at the end, 3 times)", marker_s),
        (f"the longest single task ({longest['phase']}, its straggler)", longest["task_wall_s"] * longest["straggler"]),
        ("Ray's start and the run's fixed costs", start_s),
    ]
    serial += [(f"{ph['phase']} (one task)", ph["wall_s"]) for ph in phase_rows if ph["kind"] == "single"]
    return {
        "cores": K,
        "split": split,
        "footer_us": footer_us,
        "bytes_factor": bytes_factor,
        "map_tasks": map_tasks,
        "shuffle_groups": groups,
        "tokens_per_doc": tokens_per_doc,
        "phases": phase_rows,
        "total_tasks": total_tasks,
        "objects": objects,
        "extra_files": extra_files,
        "driver_fit": drv,
        "driver_per_wall": per_wall,
        "driver_measured": measured,
        "driver_sections": sections,
        "driver_parts": driver_parts,
        "driver_upper_s": driver_parts_upper,
        "driver_held": held,
        "rest_s": rest_s,
        "ray_fit": ray,
        "request_fit": req,
        "moved_fit": moved,
        "requests_total": requests_total,
        "per_task_requests": per_task_requests,
        "phase_wall_s": wall,
        "ray_parallel_s": ray_parallel_s,
        "driver_s": driver_s,
        "driver_ray_fit": drv_ray,
        "driver_ray_s": driver_ray_s,
        "marker_s": marker_s,
        "transfer_s": transfer_s,
        "moved_bytes": moved_bytes,
        "start_s": start_s,
        "total_s": total_s,
        "serial": serial,
        "cpu_core_h": sum(ph["crawl_cpu_core_h"] for ph in phase_rows) + (ray[0] * total_tasks + ray[1] * DOCS) / 3600,
    }


def check_fit(runs: list[dict[str, Any]], est: dict[str, Any]) -> list[str]:
    """How well a ``a x tasks + b x docs`` fit reproduces each run's tasks' CPU (its own input)."""
    lines = []
    for r in runs:
        pred = 0.0
        for ph in est["phases"]:
            m = r["phases"].get(ph["phase"])
            if m:
                pred += ph["fitted"][0] * m["tasks"] + ph["fitted"][1] * r["docs"]
        lines.append(
            f"| {r['scale']}x of {r['docs'] // r['scale']:,}-doc base | {r['docs']:,} | {r['tasks']:,} | "
            f"{r['task_cpu_s']:,.1f} | {pred:,.1f} | {pred / r['task_cpu_s']:.2f} |"
        )
    return lines


def _f(x: float, fmt: str = "{:,.0f}") -> str:
    return fmt.format(x)


GROUP_CHOICES = (8, 32, 64, 128, 256, 582, 1024, 4096)


def designs(
    runs: list[dict[str, Any]],
    main: dict[str, Any],
    footer_us: float,
    merge_task: dict[str, Any] | None,
    driver_runs: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The estimate for each split.shuffle_groups as the code is (merged files split by key range), and
    for the best of them with one file per merge task (the code before)."""
    out = [model(runs, main, footer_us, groups=g, merge_task=merge_task, driver_runs=driver_runs) for g in GROUP_CHOICES]
    best = min(out, key=lambda e: e["total_s"])
    out.append(
        model(runs, main, footer_us, groups=best["shuffle_groups"], split=False, merge_task=merge_task, driver_runs=driver_runs)
    )
    return out


def serial_share(est: dict[str, Any]) -> tuple[str, float]:
    name, s = max(est["serial"], key=lambda x: x[1])
    return name, s / est["total_s"]


def designs_md(options: list[dict[str, Any]]) -> str:
    lines = [
        "| merged shuffle files | split.shuffle_groups | footer row groups per partition task | per map task "
        "(decisions) | total h | largest serial step | its share |",
        "|---|---|---|---|---|---|---|",
    ]
    for est in options:
        part = next((ph for ph in est["phases"] if ph["kind"] == "partition"), None)
        mp = next((ph for ph in est["phases"] if ph["phase"] == "map1"), None)
        name, share = serial_share(est)
        rgs = [f"{ph['footer_s_per_task'] * 1e6 / est['footer_us']:,.0f}" if ph else "-" for ph in (part, mp)]
        what = (
            f"split by key range (at most {keys_per_file()} keys a file; the code)"
            if est["split"]
            else "one file per merge task, a row group per key of every key (before)"
        )
        lines.append(
            f"| {what} | {est['shuffle_groups']} | {rgs[0]} | {rgs[1]} | {est['total_s'] / 3600:,.2f} | {name} | {share:.1%} |"
        )
    return "\n".join(lines)


def estimate_md(
    paths: list[Path],
    runs: list[dict[str, Any]],
    main: dict[str, Any],
    footer_us: float,
    merge_task: dict[str, Any] | None,
    driver_runs: list[dict[str, Any]] | None = None,
) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    options = designs(runs, main, footer_us, merge_task, driver_runs)
    today = [e for e in options if e["split"]]
    est = min(today, key=lambda e: e["total_s"])  # the best split.shuffle_groups for the code as it is
    K, T = est["cores"], est["total_s"]
    out = [
        f"Inputs: {', '.join(f'`{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}`' for p in paths)}: "
        f"{len(runs)} measured runs (scales and base sizes in the fit check below). Crawl: {DOCS / 1e9:.0f}B "
        f"documents, {BYTES / 1e12:.0f} TB ({BYTES / DOCS:,.0f} bytes each; the bench's are "
        f"{main['corpus']['bytes'] / main['docs']:,.0f}: text phases' per-document CPU x{est['bytes_factor']:.2f}), "
        f"{NODES} nodes x {CORES_PER_NODE} cores = {K:,} cores; {est['map_tasks']:,} map tasks of "
        f"{TARGET >> 20} MiB, {PARTITIONS:,} partitions, `split.shuffle_groups: {est['shuffle_groups']}` "
        f"(a merge task per {-(-est['map_tasks'] // est['shuffle_groups']):,} map tasks), {est['total_tasks']:,} tasks in all.",
        "",
        "",
        f"Footers: a merged shuffle file holds a row group per key (part, or shard for decisions) and a reader "
        f"parses its whole footer: measured {footer_us:.1f} us of CPU per row group (`footer_us_per_row_group`: a "
        f"filtered pyarrow scan of a 1,024-row-group file, as a partition task reads). A merge task's output is "
        f"split into files of at most {keys_per_file()} keys (`engine/tasks/merge.py`, `KEYS_PER_FILE`), and a "
        f"reader opens the file of its key in each group: a partition task parses G x {keys_per_file()} row groups, "
        f"a map task G x {keys_per_file()} per kind of decisions it applies. Merged-file requests: a reader makes a "
        f"HEAD, a footer GET and a row-group GET per merged file ({READ_REQUESTS_PER_FILE} requests), one after "
        f"another, and a merge task a PUT per file it writes beyond the first; the bench's 8 groups are in the "
        f'fitted requests, the crawl\'s G are charged here (column "merged-file requests s"). {MEASURED_MERGE} '
        f"is measured at crawl size (`bench/scaling/merge_task.py`, below), not fitted. The table below is the code as it "
        f"is, with the `split.shuffle_groups` that gives the shortest run ({est['shuffle_groups']}); the next table "
        f"compares the choices.",
        "",
        "| phase | fitted CPU per task s | fitted CPU per doc us | bench us/doc (largest scale) | crawl tasks | "
        "footer CPU per task s | merged-file requests s | crawl core-h | crawl task s | waves | straggler | phase wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ph in est["phases"]:
        name = f"{ph['phase']} (measured)" if ph["measured"] else ph["phase"]
        out.append(
            f"| {name} | {ph['per_task_s']:.3f} | {ph['per_doc_us']:,.1f} | {ph['bench_us_per_doc']:,.0f} | "
            f"{ph['crawl_tasks']:,} | {ph['footer_s_per_task']:,.1f} | {ph['io_s_per_task']:,.1f} | "
            f"{ph['crawl_cpu_core_h']:,.0f} | {ph['task_wall_s']:,.1f} | {ph['waves']} | {ph['straggler']:.2f} | "
            f"{ph['wall_s']:,.0f} |"
        )
    d, r = est["driver_fit"], est["ray_fit"]
    out += [
        "",
        "| part of the run | fitted from the runs | crawl seconds | share |",
        "|---|---|---|---|",
        f"| phases, one after another (above; each task + {est['per_task_requests']:.1f} store requests x "
        f"{REQUEST_S * 1e3:.0f} ms) | - | {est['phase_wall_s']:,.0f} | {est['phase_wall_s'] / T:.0%} |",
        f"| Ray's own CPU (tree - tasks - driver), spread over the cores | {r[0] * 1e3:,.1f} ms per task + "
        f"{r[1] * 1e6:,.1f} us per doc + {r[2]:,.1f} s | {est['ray_parallel_s']:,.0f} | {est['ray_parallel_s'] / T:.0%} |",
        f"| store transfer, not overlapped ({est['moved_bytes'] / 1e12:,.1f} TB at {NODES} x {NODE_GBPS} GB/s) | "
        f"{est['moved_fit'][0] / 1e3:,.1f} kB per task + {est['moved_fit'][1]:,.0f} B per doc | "
        f"{est['transfer_s']:,.0f} | {est['transfer_s'] / T:.0%} |",
        *(_held_rows(est) if est["driver_held"] is not None else []),
        (
            "| **serial:** the driver's CPU in its own threads (loop, markers, plans, end of run) | "
            if est["driver_held"] is None
            else "| (all of the driver's own CPU, were it serial: the bound before the parts were recorded) | "
        )
        + (
            f"recorded by the driver by section ({est['driver_sections']['runs']} runs; below): "
            f"{d[0] * 1e3:,.2f} ms per task over the crawl's mix + {d[2]:,.1f} s (its start)"
            if est["driver_sections"] is not None
            else f"measured (`driver_dispatch_store.json`): {d[0] * 1e3:,.2f} ms per task + "
            f"{est['driver_per_wall'] * 1e3:,.2f} ms per second of the run + {d[2]:,.1f} s (fitted)"
            if est["driver_measured"] is not None and not est["driver_measured"].get("below_fit")
            else f"fitted on the runs: {d[0] * 1e3:,.2f} ms per task + {d[2]:,.1f} s (more than the "
            f"{est['driver_measured']['per_task_s'] * 1e3:,.2f} ms per task of `driver_dispatch_store.json`'s trivial tasks)"
            if est["driver_measured"] is not None
            else f"{d[0] * 1e3:,.2f} ms per task + {d[1] * 1e6:,.2f} us per doc + {d[2]:,.1f} s"
        )
        + (
            f" | {est['driver_s']:,.0f} | {est['driver_s'] / T:.1%} |"
            if est["driver_held"] is None
            else f" | ({est['driver_s']:,.0f}) | ({est['driver_held']['all_share']:.1%}) |"
        ),
        f"| beside it: Ray's threads in the driver (submission, results, gRPC, timers), on the driver node's other "
        f"cores | {est['driver_ray_fit'][0] * 1e3:,.2f} ms per task + {est['driver_ray_fit'][1] * 1e6:,.2f} us per doc + "
        f"{est['driver_ray_fit'][2]:,.1f} s | ({est['driver_ray_s']:,.0f} CPU s: {est['driver_ray_s'] / T:.0%} of one core "
        f"over the run) | - |",
        f"| **serial:** the driver's store listings (no marker is read back: each comes with its task's result) | "
        f"2 of {est['total_tasks']:,} markers and {END_LISTINGS} of {est['objects'] / 1e6:,.2f}M "
        f"objects ({OBJECTS_PER_TASK} per task and {est['extra_files'] / 1e6:,.2f}M more files of the split merges), "
        f"{LIST_PAGE:,} a page, {REQUEST_S * 1e3:.0f} ms each | "
        f"{est['marker_s']:,.0f} | {est['marker_s'] / T:.1%} |",
        f"| **serial:** Ray's start, the run's constants | - | {est['start_s']:,.0f} | {est['start_s'] / T:.1%} |",
        f"| **total** | | **{T:,.0f} s = {T / 3600:.2f} h** | (budget {BUDGET_H} h) |",
        "",
        "Serial steps against the 5% limit:",
        "",
    ]
    for name, s in est["serial"]:
        share = s / T
        out.append(f"- {name}: {s:,.0f} s, {share:.1%} {'(over 5%)' if share > SERIAL_SHARE else '(under 5%)'}")
    if est["driver_sections"] is not None:
        out += ["", driver_sections_md(est)]
    rq = est["requests_total"]
    out += [
        "",
        "Store requests for the crawl (fitted per task and per document): "
        + ", ".join(f"{k} {v / 1e6:,.1f}M" for k, v in rq.items())
        + f"; {sum(rq.values()) / T:,.0f} requests/s on average over the run (S3 serves 5,500 GET and 3,500 PUT per "
        "second per key prefix; datapipe's keys spread over a prefix per phase and task).",
    ]
    out += ["", "Choices of `split.shuffle_groups` (G), and the merged files split by key range:", "", designs_md(options)]
    return "\n".join(out), est, options


def _held_rows(est: dict[str, Any]) -> list[str]:
    """The driver's CPU in the estimate where the runs recorded each phase by part: what holds the run
    up (serial), and what runs beside the tasks (on the head's core; its largest share of one core)."""
    held, T = est["driver_held"], est["total_s"]
    top = max(held["beside"], key=lambda b: b["core_share"])
    sub = max(held["beside"], key=lambda b: b["submit_vs_task"])
    return [
        f"| **serial:** the driver's CPU that holds the run up: its start, each phase's plan and commit, handing "
        f"over a phase's first {est['cores']:,} tasks, the end of the run | recorded by the driver by part "
        f"({held['runs']} runs; below) | {held['held_s']:,.0f} | {held['held_s'] / T:.1%} |",
        f"| beside the tasks: the rest of the driver's CPU (handing over the later tasks, results and markers, "
        f"the heartbeat), on the head's own core | at most {top['core_share']:.1%} of one core in any phase "
        f"({top['phase']}); handing a phase over takes at most {sub['submit_vs_task']:.1%} of one of its tasks' "
        f"wall ({sub['phase']}) | ({held['beside_s']:,.0f} CPU s) | - |",
    ]


def driver_sections_md(est: dict[str, Any]) -> str:
    """The driver's own CPU by section: each kind's fit, its crawl tasks and seconds."""
    sec, parts = est["driver_sections"], est["driver_parts"]
    const_s = parts["start, Ray's shutdown, exit"]
    crawl = {}
    for ph in est["phases"]:
        crawl[ph["kind"]] = crawl.get(ph["kind"], 0) + ph["crawl_tasks"]
    lines = [
        f"The driver's own CPU by section, as the driver recorded it in run.json (`driver_cpu_s`; "
        f"{sec['runs']} runs of {min(sec['tasks']):,}-{max(sec['tasks']):,} tasks): each phase's section "
        "(its tasks' dispatch, results and markers, and the phase it hands the later ones) fitted per kind of "
        "phase as a part per task and a part per phase over every phase of every run; the end of the run per "
        "task of the run; the start (imports, planning, Ray's start), Ray's shutdown and the process's exit as "
        "their means. Residuals: the fit's error on the sections it was fitted on.",
        "",
        "| section | phases (points) | tasks per phase | fitted ms per task | fitted ms per phase | residuals ms | "
        "crawl tasks | crawl s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k, f in sorted(sec["kinds"].items()):
        lo, hi = f["resid_s"]
        lines.append(
            f"| phases: {k} | {f['points']} | {min(f['tasks']):,}-{max(f['tasks']):,} | {f['per_task_s'] * 1e3:.3f} | "
            f"{f['per_phase_s'] * 1e3:.1f} | {lo * 1e3:+.0f} to {hi * 1e3:+.0f} | {crawl.get(k, 0):,} | "
            f"{parts.get(k, 0.0):,.1f} |"
        )
    e0, e1 = sec["end"]
    lines += [
        f"| end of the run (checks, counts, statistics, sweep) | {sec['runs']} runs | - | {e0 * 1e3:.3f} | "
        f"{e1 * 1e3:,.0f} (per run) | - | {est['total_tasks']:,} | {parts['end']:,.1f} |",
        f"| markers of other nodes copied to the mirror (not on one node: charged, `MIRROR_COPY_S`) | - | - | "
        f"{MIRROR_COPY_S * 1e3:.3f} x {NODES - 1}/{NODES} | - | - | {est['total_tasks']:,} | {parts['mirror copies']:,.1f} |",
        f"| start, Ray's shutdown, exit (means) | {sec['runs']} runs | - | - | - | "
        f"start {min(sec['start_s']):.2f}-{max(sec['start_s']):.2f} s | - | {const_s:,.1f} |",
        f"| what the driver spends per second of wall, whatever it does (the lock's heartbeat, the loop's "
        f"wake-ups), fitted with the phases | all | - | - | {sec['per_wall_s'] * 1e3:.2f} per s of wall | - | "
        f"{est['total_s']:,.0f} s of run | {est['driver_s'] - sum(parts.values()):,.1f} |",
        f"| **the driver's own CPU** | | | **{est['driver_fit'][0] * 1e3:.3f}** (mean) | | | {est['total_tasks']:,} | "
        f"**{est['driver_s']:,.0f}** |",
        "",
        "Without the part per second of wall (every phase section charged per task and per phase: "
        + ", ".join(
            f"{k} {f['per_task_s'] * 1e3:.3f} ms per task" for k, f in sorted(sec["per_task_only"].items()) if f["per_task_s"]
        )
        + f"), the driver's own CPU would be {est['driver_upper_s']:,.0f} s, "
        f"{est['driver_upper_s'] / (est['rest_s'] + est['driver_upper_s']):.1%} of the run: the upper bound.",
        "",
        "Per run (s): "
        + "; ".join(
            f"{t:,} tasks: whole {w:.2f} = start {a:.2f} + phases {lp:.2f} + end {en:.2f} + the rest {x + r:.2f}"
            for t, w, a, lp, en, x, r in zip(
                sec["tasks"], sec["whole_s"], sec["start_s"], sec["loop_s"], sec["end_s"], sec["exit_s"], sec["rest_s"]
            )
        )
        + ".",
    ]
    held = est["driver_held"]
    if held is not None:
        sp = sec["split"]
        lines += [
            "",
            f"By part ({held['runs']} runs recorded each phase as its plan, handing over, results and commit): "
            "the plan (up to the phase's first task handed over) and the commit (after its last marker) hold the "
            "run up, as does handing over the first tasks while cores wait for them; handing over the rest and "
            "taking results run beside the tasks. Each part fitted per kind of phase as a part per task and one "
            "per phase (results with a part per second of wall shared by all kinds).",
            "",
            "| kind | plan + commit ms per task | plan + commit ms per phase | handing over ms per task | "
            "results ms per task | results ms per phase | crawl s holding the run up |",
            "|---|---|---|---|---|---|---|",
        ]
        for k in sorted(sp["held"]):
            h, sub, res = sp["held"][k], sp["submit"].get(k, {}), sp["results"]["kinds"].get(k, {})
            lines.append(
                f"| {k} | {h['per_task_s'] * 1e3:.3f} | {h['per_phase_s'] * 1e3:.1f} | "
                f"{sub.get('per_task_s', 0.0) * 1e3:.3f} | {res.get('per_task_s', 0.0) * 1e3:.3f} | "
                f"{res.get('per_phase_s', 0.0) * 1e3:.1f} | {held['parts'].get(k, 0.0):,.1f} |"
            )
        lines += [
            "",
            "Holding the run up, crawl seconds: "
            + "; ".join(f"{k} {v:,.1f}" for k, v in held["parts"].items())
            + f"; **{held['held_s']:,.0f} s, {held['held_s'] / est['total_s']:.1%} of the run**. Beside the tasks, "
            "the driver's share of one core by phase: "
            + ", ".join(f"{b['phase']} {b['core_share']:.1%}" for b in held["beside"])
            + f" (results' part per second of wall {held['per_wall_s'] * 1e3:.2f} ms).",
        ]
    return "\n".join(lines)


def per_core_hour(main: dict[str, Any], est: dict[str, Any]) -> str:
    dedup_phases = [ph for ph in est["phases"] if ph["kind"] in ("partition", "merge", "single") or ph["phase"] == "map1"]
    dedup_core_h = sum(ph["crawl_cpu_core_h"] for ph in dedup_phases)
    whole_core_h = est["total_s"] / 3600 * est["cores"]
    bench_core_h = main["tree_cpu_s"] / 3600
    lines = [
        "| who | what | published or estimated | GB per core-hour |",
        "|---|---|---|---|",
    ]
    for who, what, nbytes, hours, cores in ANCHORS:
        lines.append(
            f"| {who} (published) | {what} | {nbytes / 1e12:.0f} TB, {hours:.2f} h x {cores:,} cores | "
            f"{nbytes / 1e9 / (hours * cores):,.2f} |"
        )
    lines += [
        f"| datapipe (estimate, wall x cores) | whole pipeline: langid, quality, exact + MinHash dedup, tokenize, pack | "
        f"10 TB, {est['total_s'] / 3600:.2f} h x {est['cores']:,} cores | {BYTES / 1e9 / whole_core_h:,.2f} |",
        f"| datapipe (estimate, CPU) | dedup only: map1 (dedup applied + signatures), shuffles, rounds, merges | "
        f"10 TB, {dedup_core_h:,.0f} core-h of CPU | {BYTES / 1e9 / dedup_core_h:,.2f} |",
        f"| datapipe (measured here) | whole pipeline on the bench's {main['scale']}x corpus, tasks of "
        f"{main['docs'] // main['map_tasks']:,} documents (per-task costs not amortised) | "
        f"{main['corpus']['bytes'] / 1e9:.3f} GB, {main['tree_cpu_s']:,.0f} CPU s | "
        f"{main['corpus']['bytes'] / 1e9 / bench_core_h:,.2f} |",
    ]
    return "\n".join(lines)


def add_args(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The measured inputs of the estimate (bench/scaling/scaling_doc.py takes them too)."""
    ap.add_argument("--scale", type=Path, required=True, help="bench/scaling/scale.py JSON of the 1x/16x run")
    ap.add_argument("--fit", type=Path, nargs="*", default=[], help="more bench/scaling/scale.py JSONs (larger tasks)")
    ap.add_argument(
        "--driver-runs",
        type=Path,
        nargs="*",
        default=[],
        help="more bench/scaling/scale.py JSONs (many small tasks) for the driver's sections only",
    )
    ap.add_argument("--footer-us", type=float, help="CPU us per footer row group (default: measured now)")
    ap.add_argument(
        "--merge-task",
        type=Path,
        default=MERGE_TASK_JSON,
        help=f"bench/scaling/merge_task.py JSON (default {MERGE_TASK_JSON.name})",
    )
    return ap


@dataclass
class Estimate:
    """The estimate from the measured inputs, and what docs/scaling.md shows beside it."""

    scale: dict[str, Any]  # the --scale JSON
    runs: list[dict[str, Any]]  # its scales and the --fit runs' as points of the fit
    merge_task: dict[str, Any] | None
    text: str  # the estimate's tables, markdown
    est: dict[str, Any]
    options: list[dict[str, Any]]  # the estimate per split.shuffle_groups choice
    fit: str  # the fit against each measured run, markdown
    per_core_hour: str


def estimate(a: argparse.Namespace) -> Estimate:
    paths = [a.scale, *a.fit]
    runs = points(paths)
    scale = json.loads(a.scale.read_text())
    main_run = scale["extra"]["scales"][-1]
    footer_us = a.footer_us if a.footer_us is not None else footer_us_per_row_group()
    merge_task = json.loads(a.merge_task.read_text()) if a.merge_task and a.merge_task.exists() else None
    driver_runs = points(a.driver_runs)
    text, est, options = estimate_md(paths, runs, main_run, footer_us, merge_task, driver_runs)
    fit_lines = [
        "| run | documents | tasks | tasks' CPU s measured | fitted | fitted / measured |",
        "|---|---|---|---|---|---|",
        *check_fit(runs, est),
    ]
    return Estimate(scale, runs, merge_task, text, est, options, "\n".join(fit_lines), per_core_hour(main_run, est))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    e = estimate(add_args(ap).parse_args())
    print(e.text + "\n\n" + e.fit + "\n\n" + e.per_core_hour)
    return 0


if __name__ == "__main__":
    sys.exit(main())
