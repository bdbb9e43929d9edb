"""A crawl's run time on a cluster, from what its own tasks and its driver cost at its proportions (issue 48).

    python -m bench.scaling.cost_model bench/results/crawl_proportions_10tb.json \\
        bench/results/crawl_proportions_100tb.json --driver bench/results/driver_scale.json

Inputs, all measured at a crawl's real counts (synthetic rows), none at bench size:

* bench/scaling/crawl_proportions.py's JSONs: each phase's largest task as the engine plans it at 10 TB
  and 100 TB, its real code on files of the crawl's counts (input runs, row groups, rows): its CPU seconds
  (which include what it pays per row group and per open file, since it opened and read them all) and
  peak RSS, and how many inputs it reads;
* bench/scaling/driver_crawl.py's figures (``--driver``, the key ``crawl``): the driver running every
  phase through the runner's loop at the crawl's task counts: per phase its tasks, its planning and
  commit CPU (serial: nothing runs meanwhile) and its adoption CPU per task (overlapping the running
  tasks), and the end of the run's steps over every marker (serial).

The model, in wall seconds on ``nodes`` x ``cores`` (one single-threaded task per core):

* a task's time = its CPU (the phase's largest task's: an upper bound) + its store requests one after
  another at ``latency`` each (``requests``: a GET per input run's byte range and footer, PUTs of its
  outputs and marker) + its bytes through its node's link (``task_bytes``; the link shared by the node's
  ``cores`` tasks), not overlapped with the CPU;
* a phase of n tasks takes ceil(n / (nodes x cores)) waves of that; slowed to the store's throttling
  (``get_limit`` GETs and ``put_limit`` PUTs per second per prefix, one prefix per phase: S3 splits
  prefixes only as load persists) and to the driver's adoption (n x its CPU per marker);
* serial: each phase's planning and commit in the driver, the end of the run, and a phase of one task
  (a combine step: nothing else runs meanwhile).

Unmeasured phases are charged explicitly (``charged``): a phase measured at the other crawl size costs the
same per task (per-task CPU was flat from 10 to 100 TB in every phase measured at both); a phase measured
at neither size costs its kind's largest measured task (``STAND_IN``); the table says which.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any

NODES, CORES_PER_NODE = 64, 64
TB_BYTES = 10**12
MAP_BYTES = 256 << 20  # split.target_bytes: a crawl's map task
RANGE_BYTES = 64 << 20  # a map task reads its input in ranges of this size (a GET each)
MAP_OUT_FACTOR = 1.5  # a map task's outputs (kept + rejected documents, its runs), bytes per input byte: stand-in
MAP_PUTS = 6  # a map task's output files and its marker
MERGE_TASK_BYTES = 256 << 20  # engine/shuffles.py: a merge task's key range
PARTITION_ROW_BYTES = 60  # bytes per shuffle row a partition task reads (bench/scaling/driver_crawl.py ROW_BYTES): stand-in
OUTPUT_PUTS = 2  # a merge or partition task's output and its marker
LINKS_GBITS = (10, 25)
LATENCIES_S = (0.020, 0.050, 0.100)
THROTTLE = (5500.0, 3500.0)  # GET, PUT per second per prefix (S3's documented rates)
LIMIT_SERIAL = 0.05  # no serial step above 5% of the run (issue 48)
# Phases measured at neither size: the kind's largest measured task (CPU s, peak MiB) stands in.
STAND_IN = {
    "merge": "the largest merge task measured at this size",
    "shuffle": "the largest partition task measured at this size",
    "pack": "map2's task (a pack task reads 2^30 tokens: a fraction of one map task's output)",
    "aggregates": "merge0's task (a tree merge of <= 64 small aggregate files)",
    "reduce": "merge0's task (the clusters left open: a few rows)",
}


# Phases neither measured nor reached by the driver's run (its stand-in rows stop forwarding after MinHash's
# round 8): (tasks, CPU s of a task, why). MinHash's rounds 9 and 10 (shuffle1r8, shuffle1r9): round 9's
# task at 10 TB ran past 230 CPU s at 1.4 GiB without finishing (crawl_proportions_10tb.json's note): 230 s
# per task, one wave, a lower bound.
UNREACHED = {
    "shuffle1r8": (160, 230.0, "stand-in: ran past 230 CPU s unfinished at 10 TB (a lower bound), one wave"),
    "shuffle1r9": (160, 230.0, "stand-in: as shuffle1r8 (not reached by any bench), one wave"),
}


def kind_of(phase: str) -> str:
    return next((k for k in ("merge", "shuffle", "map", "pack", "aggregates", "reduce") if phase.startswith(k)), phase)


def inputs_of(row: dict[str, Any]) -> tuple[int, int]:
    """(input runs, rows per run) of a measured merge or partition task, from its row's description."""
    m = re.search(r"measured: ([\d,]+) runs x ([\d,]+) rows", row.get("how", ""))
    return (int(m.group(1).replace(",", "")), int(m.group(2).replace(",", ""))) if m else (1, 0)


def tasks_in_how(row: dict[str, Any]) -> int | None:
    m = re.search(r"\(([\d,]+) tasks\)", row.get("how", ""))
    return int(m.group(1).replace(",", "")) if m else None


def requests(phase: str, runs: int) -> tuple[int, int]:
    """(GETs, PUTs) of one task of ``phase`` reading ``runs`` input runs."""
    if phase.startswith("map"):
        return math.ceil(MAP_BYTES / RANGE_BYTES), MAP_PUTS
    return 2 * runs, OUTPUT_PUTS


def task_bytes(phase: str, runs: int, rows: int) -> float:
    """Bytes one task of ``phase`` moves through the store (read + written)."""
    if phase.startswith("map"):
        return MAP_BYTES * (1 + MAP_OUT_FACTOR)
    if phase.startswith("merge"):
        return 2 * MERGE_TASK_BYTES
    return runs * rows * PARTITION_ROW_BYTES * 1.1  # its inputs and (at most) a tenth more out


def load(paths: list[Path], driver: Path | None) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    results = [r for p in paths for r in json.loads(p.read_text())["results"] if "cpu_s" in r and r["phase"] != "driver"]
    drivers: dict[str, dict[str, Any]] = {}
    if driver is not None and driver.is_file():
        for row in json.loads(driver.read_text()).get("crawl", {}).get("rows", []):
            drivers[row["crawl"]] = row
    return results, drivers


def phases_of(results: list[dict[str, Any]], drivers: dict[str, dict[str, Any]], crawl: str, tb: int) -> list[dict[str, Any]]:
    """Every phase of the crawl's run: its tasks and its task's cost, measured or charged (``charged``)."""
    measured = {r["phase"]: r for r in results if r["crawl"] == crawl}
    others = {r["phase"]: r for r in results if r["crawl"] != crawl}
    plan = _driver_row(drivers, crawl)  # the driver's phases: the engine's plan
    scale = 1.0 if plan is None or plan["crawl"] == crawl else tb / float(plan["crawl"].split()[0])
    names = [p["phase"] for p in plan["phases"]] if plan else list(measured)
    names += [p for p in measured if p not in names]
    names += [p for p in UNREACHED if p not in names and p not in others]
    out = []
    for name in names:
        base = re.sub(r"l\d+$", "", name)  # a merge's second level (merge0l2) counts as its phase's
        if name in UNREACHED and name not in measured and name not in others:
            n, cpu, why = UNREACHED[name]
            gets, puts = requests(name, 8)
            out.append(
                {"phase": name, "tasks": n, "cpu_s": cpu, "peak_mib": 1433.0, "gets": gets, "puts": puts,
                 "bytes": task_bytes(name, 8, 500_000), "charged": why}
            )  # fmt: skip
            continue
        row = measured.get(name)
        how = "measured"
        if row is None and name in others:
            row, how = others[name], f"measured at {others[name]['crawl']} (per task flat in size)"
        if row is None:
            kind = kind_of(base)
            pool = [r for r in measured.values() if kind_of(r["phase"]) == kind] or [
                r for r in measured.values() if r["phase"] == "merge0"
            ]
            if kind in ("pack",):
                pool = [r for r in measured.values() if r["phase"] == "map2"] or pool
            if kind in ("aggregates", "reduce"):
                pool = [r for r in measured.values() if r["phase"] == "merge0"] or pool
            if not pool:
                continue
            row = max(pool, key=lambda r: r["cpu_s"])
            how = f"stand-in: {STAND_IN.get(kind, 'its kind')} ({row['phase']})"
        n = tasks_in_how(row) if how == "measured" else None
        if n is None and plan is not None:
            got = next((p for p in plan["phases"] if p["phase"] == name), None)
            n = None if got is None else got["tasks"] if got["tasks"] == 1 else round(got["tasks"] * scale)  # a combine step: one
        if name.startswith("map"):
            n = math.ceil(tb * TB_BYTES / MAP_BYTES)  # one per 256 MiB of input, at any size
        if n is None:
            n = 1
        runs, rows = inputs_of(row)
        gets, puts = requests(name, runs)
        out.append(
            {
                "phase": name,
                "tasks": n,
                "cpu_s": row["cpu_s"],
                "peak_mib": row["peak_mib"],
                "gets": gets,
                "puts": puts,
                "bytes": task_bytes(name, runs, rows),
                "charged": how,
            }
        )
    return out


def _driver_row(drivers: dict[str, dict[str, Any]], crawl: str) -> dict[str, Any] | None:
    """The driver's figures at this crawl's size, else at the largest size measured."""
    if crawl in drivers:
        return drivers[crawl]
    return max(drivers.values(), key=lambda r: float(r["crawl"].split()[0]), default=None)


def driver_of(drivers: dict[str, dict[str, Any]], crawl: str, tb: int) -> tuple[dict[str, dict[str, float]], float, str]:
    """Per phase the driver's serial CPU and adoption CPU per task, its end of the run (serial), and how
    they were had (measured at this size, or scaled linearly in tasks from another)."""
    row = _driver_row(drivers, crawl)
    if row is None:
        return {}, 0.0, "not measured: charged nothing"
    scale = 1.0 if row["crawl"] == crawl else tb / float(row["crawl"].split()[0])
    how = "measured" if scale == 1.0 else f"measured at {row['crawl']}, scaled x{scale:g} (linear in tasks)"
    per = {
        p["phase"]: {
            "serial_s": (p["plan_cpu_s"] + p["submit_cpu_s"] + p["commit_cpu_s"]) * scale,
            "adopt_s": p["adopt_cpu_us_per_task"] * 1e-6,
        }
        for p in row["phases"]
    }
    return per, sum(row["end_of_run"].values()) * scale, how


def estimate(
    results: list[dict[str, Any]],
    drivers: dict[str, dict[str, Any]],
    crawl: str,
    latency: float,
    gbits: float,
    throttled: bool,
    nodes: int = NODES,
    cores: int = CORES_PER_NODE,
) -> dict[str, Any]:
    tb = int(crawl.split()[0])
    slots = nodes * cores
    per_core = gbits * 1e9 / 8 / cores  # bytes per second a task gets of its node's link
    drv, end_s, drv_how = driver_of(drivers, crawl, tb)
    phases = []
    for p in phases_of(results, drivers, crawl, tb):
        task_s = p["cpu_s"] + (p["gets"] + p["puts"]) * latency + p["bytes"] / per_core
        wall = math.ceil(p["tasks"] / slots) * task_s
        limits = {"waves": wall}
        if throttled:
            limits["GET throttling"] = p["tasks"] * p["gets"] / THROTTLE[0]
            limits["PUT throttling"] = p["tasks"] * p["puts"] / THROTTLE[1]
        d = drv.get(p["phase"], {"serial_s": 0.0, "adopt_s": 0.0})
        limits["driver adoption"] = p["tasks"] * d["adopt_s"]
        bound = max(limits, key=lambda k: limits[k])
        phases.append({**p, "task_s": task_s, "wall_s": limits[bound], "bound": bound, "serial_s": d["serial_s"]})
    serial = [(f"driver: {p['phase']} planning and commit", p["serial_s"]) for p in phases] + [("driver: end of the run", end_s)]
    serial += [(f"{p['phase']}: its one task", p["wall_s"]) for p in phases if p["tasks"] == 1]  # nothing else runs meanwhile
    total = sum(p["wall_s"] for p in phases if p["tasks"] > 1) + sum(s for _, s in serial)
    worst = max(serial, key=lambda s: s[1])
    return {
        "crawl": crawl,
        "hours": total / 3600,
        "serial_share": sum(s for _, s in serial) / total,
        "worst_serial": worst[0],
        "worst_serial_share": worst[1] / total,
        "driver": drv_how,
        "phases": phases,
    }


def crawls_of(results: list[dict[str, Any]]) -> list[str]:
    return sorted({r["crawl"] for r in results}, key=lambda c: int(c.split()[0]))


def sensitivity_md(results: list[dict[str, Any]], drivers: dict[str, dict[str, Any]]) -> str:
    goal = {"10 TB": 1.5, "100 TB": 15.0}
    lines = [
        "| crawl | S3 latency | link per node | throttling (GET / PUT per s per prefix) | hours on 64 x 64 cores | goal "
        "| serial share | largest serial step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for crawl in crawls_of(results):
        for latency in LATENCIES_S:
            for gbits in LINKS_GBITS:
                for throttled in (True, False):
                    e = estimate(results, drivers, crawl, latency, gbits, throttled)
                    g = goal.get(crawl)
                    ok = "-" if g is None else ("met" if e["hours"] <= g else "**not met**")
                    step_ok = "" if e["worst_serial_share"] <= LIMIT_SERIAL else " **over 5%**"
                    lines.append(
                        f"| {crawl} | {latency * 1000:.0f} ms | {gbits} Gbit/s | "
                        f"{f'{THROTTLE[0]:,.0f} / {THROTTLE[1]:,.0f}' if throttled else 'none'} | {e['hours']:.2f} | "
                        f"{'-' if g is None else f'<= {g:g} h'}: {ok} | {e['serial_share']:.1%} | "
                        f"{e['worst_serial']} {e['worst_serial_share']:.1%}{step_ok} |"
                    )
    return "\n".join(lines)


def phases_md(results: list[dict[str, Any]], drivers: dict[str, dict[str, Any]], crawl: str) -> str:
    e = estimate(results, drivers, crawl, 0.050, 10, True)
    lines = [
        f"Driver figures: {e['driver']}.",
        "",
        "| phase | tasks | task CPU s | requests (GET + PUT) | MB moved per task | task s | phase wall | bound by "
        "| driver serial s | charged as |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in e["phases"]:
        lines.append(
            f"| {p['phase']} | {p['tasks']:,} | {p['cpu_s']:.1f} | {p['gets']} + {p['puts']} | {p['bytes'] / 1e6:,.0f}"
            f" | {p['task_s']:.1f} | {p['wall_s'] / 60:.1f} min | {p['bound']} | {p['serial_s']:.2f} | {p['charged']} |"
        )
    return "\n".join(lines)


def driver_md(drivers: dict[str, dict[str, Any]]) -> str:
    """The driver per crawl (bench/scaling/driver_crawl.py): the slowest phase's serial CPU, adoption per
    marker, the end of the run, its peak RSS."""
    lines = [
        "| crawl | tasks | slowest phase's planning + commit (CPU s) | phases over 1 s | adoption per marker (max) "
        "| end of the run (CPU s) | driver RSS growth per task | peak RSS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for crawl, r in sorted(drivers.items(), key=lambda kv: int(kv[0].split()[0])):
        ser = [(p["plan_cpu_s"] + p["submit_cpu_s"] + p["commit_cpu_s"], p["phase"]) for p in r["phases"]]
        worst = max(ser)
        over = sum(1 for s, _ in ser if s > 1.0)
        adopt = max(p["adopt_cpu_us_per_task"] for p in r["phases"] if p["tasks"] >= 100)
        lines.append(
            f"| {crawl} | {r['tasks']:,} | {worst[0]:.2f} ({worst[1]}) | {over} of {len(ser)} | {adopt:,.0f} us "
            f"| {sum(r['end_of_run'].values()):.1f} | {r['rss_kib_per_task']:.2f} KiB | {r['peak_mib']:,.0f} MiB |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", type=Path, nargs="+", help="crawl_proportions JSON files (their results are joined)")
    ap.add_argument("--driver", type=Path, default=Path(__file__).parents[1] / "results" / "driver_scale.json")
    a = ap.parse_args()
    results, drivers = load(a.json, a.driver)
    print(driver_md(drivers))
    print()
    print(sensitivity_md(results, drivers))
    for crawl in crawls_of(results):
        print(f"\n{crawl}, 50 ms, 10 Gbit/s, throttled:\n")
        print(phases_md(results, drivers, crawl))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
