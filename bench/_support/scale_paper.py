"""The paper estimate of docs/scaling.md from a bench/scaling/scale.py JSON: a 10 TB, 5-billion-document crawl
on N nodes of 64 cores, from the measured per-document CPU, bytes and per-task memory.

    python -m bench.scaling.scale --paper bench/results/scale.json

Measured inputs come from the JSON's largest scale (fixed costs amortised best). Per-document CPU of
the map phases and packing is scaled by bytes per document (the crawl's 2,000 bytes against the
bench corpus's), the shuffle phases' is not (they handle keys, not text). Everything else is
computed from the code's data structures (numbers in the constants below, each with its source).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

DOCS = 5_000_000_000
BYTES = 10 * 10**12
CORES_PER_NODE = 64
NODES = (16, 64, 256)
TARGET = 256 << 20  # split.target_bytes default (datapipe/pipeline/load.py SplitConfig)
MIN_TASKS_PER_CPU = 3  # split.min_tasks_per_cpu default
PARTITIONS = 4096  # the largest `partitions` dedup and minhash accept (le=4096); the default 16 is far too few
BANDS = 14  # lsh_params(0.7, 128) = (14 bands, 9 rows)
SIG_BYTES = 4 * 128  # one MinHash signature, uint32 x num_perm
EXACT_ROW = 4 + 8 + 30 + 16  # part, row key, id (~30 chars), text hash: dedup shuffle row (stages/dedup.py)
BAND_ROW = 4 + 8 + 8  # part, row key, band key: minhash shuffle row (stages/minhash.py), BANDS per document
COMBINE_PER_DOC = 8 + 16 + 8 + 8 + SIG_BYTES + 40  # key, edge, union-find, n_chars, signature, id: combine
MAP_PHASES = ("map0", "map1", "map2", "pack")


def _target(cpus: int) -> int:
    """engine/splits.py effective_target for the whole crawl on ``cpus`` CPUs."""
    return min(TARGET, max(int(BYTES / (MIN_TASKS_PER_CPU * cpus)), min(8 << 20, TARGET)))


def estimate(path: Path) -> str:
    data = json.loads(path.read_text())
    run: dict[str, Any] = data["extra"]["scales"][-1]
    env = data["env"]
    docs = run["docs"]
    bytes_factor = (BYTES / DOCS) / (run["corpus"]["bytes"] / docs)
    phases = run["phases"]
    cpu_us = {
        p: v["cpu_us_per_doc"] * (bytes_factor if p in MAP_PHASES else 1.0)
        for p, v in phases.items()
        if p != "stats" and v.get("cpu_us_per_doc") is not None
    }
    overhead_us = run["tree_cpu_us_per_doc"] - run["task_cpu_us_per_doc"]  # Ray, driver, statistics
    parallel_us = sum(v for p, v in cpu_us.items() if p != "reduce1")
    serial_combine_s = cpu_us.get("reduce1", 0.0) * DOCS / 1e6
    stats_s = phases.get("stats", {}).get("wall_s", 0.0) / docs * DOCS
    per_doc = run["bytes_per_doc"]
    involved = (run["found"]["near"]["planted"] * 2) / docs  # near plants and their originals: clustered
    map_peak = max(phases[p]["task_peak_rss_mib_max"] or 0 for p in ("map0", "map1", "map2") if p in phases)
    task_docs_bench = docs / run["map_tasks"]
    lines = [
        f"Inputs: `{path}`, scale {run['scale']}x ({docs:,} documents, {run['corpus']['bytes'] / docs:,.0f} "
        f"bytes each), {env['date_utc']} UTC, commit {env['git_commit']}, {env['cores']} cores "
        f"({env['cpu_model']}), load average {run['loadavg_before'][0]:.1f} before the run. "
        f"Crawl: {DOCS / 1e9:.0f}B documents, {BYTES / 1e12:.0f} TB ({BYTES / DOCS:,.0f} bytes each: map CPU "
        f"scaled x{bytes_factor:.2f}).",
        "",
        "| phase | measured CPU us/doc | crawl CPU core-hours |",
        "|---|---|---|",
    ]
    for p, us in cpu_us.items():
        lines.append(f"| {p} | {phases[p]['cpu_us_per_doc']:,.0f} | {us * DOCS / 1e6 / 3600:,.0f} |")
    lines.append(
        f"| Ray + driver + statistics (tree CPU - task CPU) | {overhead_us:,.0f} | {overhead_us * DOCS / 1e6 / 3600:,.0f} |"
    )
    lines += [
        "",
        "| nodes x 64 cores | map target | map tasks | partitions | parallel phases h | minhash combine h "
        "(1 task) | statistics h (driver, as measured) | total h |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in NODES:
        cores = n * CORES_PER_NODE
        target = _target(cores)
        m = math.ceil(BYTES / target)
        par_h = (parallel_us + overhead_us) * DOCS / 1e6 / cores / 3600
        lines.append(
            f"| {n} x 64 = {cores:,} | {target / (1 << 20):.0f} MiB | {m:,} | {PARTITIONS} | {par_h:,.1f} | "
            f"{serial_combine_s / 3600:,.1f} | {stats_s / 3600:,.1f} | "
            f"{par_h + serial_combine_s / 3600 + stats_s / 3600:,.1f} |"
        )
    task_docs = TARGET / (BYTES / DOCS)
    lines += ["", "| what | per document (measured) | whole crawl |", "|---|---|---|"]
    for key, label in (
        ("_work/shuffle0", "exact dedup shuffle"),
        ("_work/shuffle1", "minhash band shuffle"),
        ("_work/reduce0-parts", "exact dedup decisions"),
        ("_work/reduce1-parts", "minhash forest edges"),
        ("_work/map0", "map0 output (documents + signals)"),
        ("_work/map1", "map1 output (+ signatures)"),
        ("_work/tokens", "token lists"),
        ("docs", "docs/"),
        ("rejected", "rejected/"),
        ("shards", "packed shards"),
        ("stats.duckdb", "stats.duckdb"),
    ):
        if key in per_doc:
            lines.append(f"| {label} | {per_doc[key]:,.0f} B | {per_doc[key] * DOCS / 1e12:,.1f} TB |")
    sig_reread = PARTITIONS * DOCS * SIG_BYTES
    lines += [
        "",
        f"Memory per task (largest map-phase task measured: {map_peak:,.0f} MiB at {task_docs_bench:,.0f} "
        f"documents per task; a {TARGET >> 20} MiB task holds {task_docs:,.0f}):",
        "",
        f"- map task: + shuffle rows held until the task ends, (exact {EXACT_ROW} + minhash {BANDS} x {BAND_ROW}) "
        f"B x 3 (concat, sort) per document = {(EXACT_ROW + BANDS * BAND_ROW) * 3 * task_docs / 2**20:,.0f} MiB",
        f"- exact dedup partition: {DOCS / PARTITIONS:,.0f} documents x {EXACT_ROW} B x 3 = "
        f"{DOCS / PARTITIONS * EXACT_ROW * 3 / 2**20:,.0f} MiB",
        f"- minhash partition: {DOCS / PARTITIONS * BANDS:,.0f} band rows x {BAND_ROW} B x 3 = "
        f"{DOCS / PARTITIONS * BANDS * BAND_ROW * 3 / 2**20:,.0f} MiB, plus the signatures of its paired "
        f"documents and the row groups of one map output holding them (at most its whole signature "
        f"column, {task_docs * SIG_BYTES / 2**20:,.0f} MiB)",
        f"- minhash combine (one task): {COMBINE_PER_DOC} B per clustered document; "
        f"{involved:.0%} clustered as in the bench: {involved * DOCS * COMBINE_PER_DOC / 2**30:,.0f} GiB, "
        f"30%: {0.3 * DOCS * COMBINE_PER_DOC / 2**30:,.0f} GiB",
        f"- signature re-reads in minhash verification: every partition reads the row groups holding its "
        f"pairs, at this scale most row groups of every map output: up to {PARTITIONS} x "
        f"{DOCS * SIG_BYTES / 1e12:,.2f} TB = {sig_reread / 1e15:,.1f} PB",
    ]
    return "\n".join(lines)
