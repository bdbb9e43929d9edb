"""A crawl's run time from what its own tasks cost at its proportions (issue 48), not from bench-sized tasks.

    python -m bench.scaling.crawl_estimate bench/results/crawl_proportions.json [--md]

Input: bench/scaling/crawl_proportions.py's JSON: for each crawl size, every phase's largest task as the
engine plans it at that size (its real code on files of the crawl's counts), its CPU seconds and peak
RSS, and how many tasks the phase has; the driver's planning and commit per phase.

The model, in wall seconds on ``nodes`` x ``cores`` (one task per core, a core's CPU second is a wall
second: the tasks are single-threaded and CPU-bound):

- every task of a phase is charged its phase's **largest** task's CPU (an upper bound: the tasks of a
  merge level or a round are equal by construction, within their key ranges' rows);
- plus its store requests at ``latency`` each, one after another (the reads of a merge or partition
  task: a footer and one range per input run, ``REQUESTS_PER_INPUT``; a map task's input and outputs);
- a phase of n tasks takes ceil(n / cores) waves of that, then the driver's planning of the next phase
  (measured: list, place, hand inputs) and its commit of each marker (measured per task), serial;
- request throttling: a phase issuing more requests per second than ``put_limit`` / ``get_limit`` per
  prefix across its prefixes is slowed to that rate (a phase's files sit under one prefix per phase).

Not modelled: bytes through the store (each node's link: a map task reads 256 MiB, a merge task moves
its inputs' bytes once), which the sensitivity table leaves to the request terms; Ray's start.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any

NODES, CORES_PER_NODE = 64, 64
REQUESTS_PER_INPUT = 2  # a run's footer (cached from the writer's marker: none) and one byte range
MAP_REQUESTS = 6  # a 256 MiB input in 64 MiB ranges, its outputs and marker
OUTPUT_REQUESTS = 2  # a task's output file and its marker
PHASE_PREFIXES = 1
TB_DOCS = 500_000_000  # 2,000-byte documents per TB
TOKENS_PER_DOC = 600
PACK_TOKENS = 1 << 30


def tasks_of(row: dict[str, Any]) -> int:
    """A phase's task count, as the bench's row says it (its plan), or from the crawl's size."""
    if m := re.search(r"\(([\d,]+) tasks\)", row.get("how", "")):
        return int(m.group(1).replace(",", ""))
    tb = int(row["crawl"].split()[0])
    if row["phase"].startswith("map"):
        return -(-tb * 10**12 // (256 << 20))
    if row["phase"] == "pack":
        return -(-tb * TB_DOCS * TOKENS_PER_DOC // PACK_TOKENS)
    return 1


def inputs_of(row: dict[str, Any]) -> int:
    m = re.search(r"measured: ([\d,]+) ", row.get("how", ""))
    return int(m.group(1).replace(",", "")) if m else 1


def requests_of(row: dict[str, Any]) -> int:
    if row["phase"].startswith("map"):
        return MAP_REQUESTS
    return REQUESTS_PER_INPUT * inputs_of(row) + OUTPUT_REQUESTS


def estimate(
    results: list[dict[str, Any]], crawl: str, latency: float, cores: int, get_limit: float, put_limit: float
) -> dict[str, Any]:
    """Per phase: tasks, the largest task's CPU, wall; the run's total and its serial part."""
    tasks = [r for r in results if r["crawl"] == crawl and "cpu_s" in r]
    driver = next((r for r in results if r["crawl"] == crawl and r["phase"] == "driver"), None)
    plans = {p["phase"]: p for run in (driver or {}).get("runs", []) for p in run.get("phases", [])}
    adopt = driver["adopt_s_per_task"] if driver else 0.0
    phases = []
    for r in tasks:
        n = tasks_of(r)
        req = requests_of(r)
        task_s = r["cpu_s"] + req * latency
        waves = math.ceil(n / cores)
        wall = waves * task_s
        rate = n * req / max(wall, 1e-9)  # requests per second the phase issues
        limit = (get_limit + put_limit) * PHASE_PREFIXES
        if rate > limit:
            wall = n * req / limit
        name = r["phase"].split(":")[0]
        serial = plans.get(name, {}).get("plan_s", 0.0) + n * adopt
        phases.append(
            {"phase": r["phase"], "tasks": n, "task_s": task_s, "wall_s": wall, "serial_s": serial, "peak_mib": r["peak_mib"]}
        )
    total = sum(p["wall_s"] + p["serial_s"] for p in phases)
    serial = sum(p["serial_s"] for p in phases)
    longest = max((p["task_s"] for p in phases), default=0.0)
    return {
        "crawl": crawl,
        "hours": total / 3600,
        "serial_share": serial / total if total else 0.0,
        "longest_task_s": longest,
        "phases": phases,
    }


def table_md(results: list[dict[str, Any]]) -> str:
    crawls = sorted({r["crawl"] for r in results if "cpu_s" in r}, key=lambda c: int(c.split()[0]))
    cores = NODES * CORES_PER_NODE
    lines = [
        "| crawl | S3 latency | throttling (GET/PUT per s per prefix) | hours on 64 x 64 cores | serial share | longest task |",
        "|---|---|---|---|---|---|",
    ]
    for crawl in crawls:
        for latency in (0.020, 0.050, 0.100):
            for limits in ((5500, 3500), (1e12, 1e12)):
                e = estimate(results, crawl, latency, cores, *limits)
                throttle = "none" if limits[0] > 1e9 else f"{limits[0]:,} / {limits[1]:,}"
                lines.append(
                    f"| {crawl} | {latency * 1000:.0f} ms | {throttle} | {e['hours']:.2f} | {e['serial_share']:.1%}"
                    f" | {e['longest_task_s']:.0f} s |"
                )
    return "\n".join(lines)


def phases_md(results: list[dict[str, Any]], crawl: str) -> str:
    e = estimate(results, crawl, 0.050, NODES * CORES_PER_NODE, 5500, 3500)
    lines = [
        "| phase | tasks | largest task (CPU + requests at 50 ms) | peak RSS | phase wall | driver (serial) |",
        "|---|---|---|---|---|---|",
    ]
    for p in e["phases"]:
        lines.append(
            f"| {p['phase']} | {p['tasks']:,} | {p['task_s']:.1f} s | {p['peak_mib']:,.0f} MiB"
            f" | {p['wall_s'] / 60:.1f} min | {p['serial_s']:.1f} s |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", type=Path, nargs="+", help="crawl_proportions JSON files (their results are joined)")
    a = ap.parse_args()
    results = [r for path in a.json for r in json.loads(path.read_text())["results"]]
    print(table_md(results))
    for crawl in sorted({r["crawl"] for r in results if "cpu_s" in r}, key=lambda c: int(c.split()[0])):
        print(f"\n{crawl}, 50 ms, throttled:\n")
        print(phases_md(results, crawl))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
