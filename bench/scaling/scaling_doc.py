"""docs/scaling.md from bench/scaling/scaling_doc.md (the prose), the measured JSONs and bench/scaling/cost_model.py's estimate
(the historical pre-issue-48 section from bench/scaling/pre48_model.py).

    python -m bench.scaling.scaling_doc --scale bench/results/scale.json --fit bench/results/scale_fit.json \\
        --explain bench/results/explain_files.json --write docs/scaling.md
    python -m bench.scaling.scaling_doc --scale bench/results/scale.json --crawl-only --write docs/scaling.md \
        --crawl bench/results/crawl_proportions_10tb.json bench/results/crawl_proportions_100tb.json \\
        --driver bench/results/driver_scale.json

The models print their estimates alone and import nothing of this file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.scaling.pre48_model import PARTITIONS, TOKENS_PER_PACK_TASK, add_args, estimate
from bench.scaling.scale import acceptance_rows, describe, phase_order

TEMPLATE = Path(__file__).with_name("scaling_doc.md")


def _mib(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def acceptance_md(scale: dict[str, Any]) -> str:
    env, runs = scale["env"], scale["extra"]["scales"]
    first, last = runs[0], runs[-1]
    s0, s1 = first["scale"], last["scale"]
    head = (
        f"## Measured: {s0}x and {s1}x\n\n"
        f"`{' '.join(env.get('argv', []))}`, {env['date_utc']} UTC, commit {env['git_commit']}, {env['cores']} cores "
        f"({env['cpu_model']}) shared with other sessions: load average {first['loadavg_before'][0]:.0f}-"
        f"{max(r['loadavg_after'][0] for r in runs):.0f} during the runs, so CPU seconds (which do not depend on "
        f"the load, apart from cache and context-switch effects) are the figures, wall seconds are not. "
        f"{first['docs']:,} and {last['docs']:,} documents, {first['map_tasks']} and {last['map_tasks']} map tasks "
        f"and as many dedup and MinHash partitions (one input file per map task: the same documents per task and "
        f"per partition at both scales), inputs and run folder on the counting loopback S3 server, the run under "
        f"strace counting opens. Small corpora: a task holds {first['docs'] // first['map_tasks']:,} documents, so "
        f"per-task costs dominate the CPU per document at both scales (the estimate below separates them).\n\n"
        f"| measure (per document unless said) | {s0}x | {s1}x | {s1}x/{s0}x | limit | |\n|---|---|---|---|---|---|"
    )
    rows = [head]
    for row in acceptance_rows(runs):
        limit = f"<= {row['limit']}" if row["limit"] else "-"
        ok = "" if row["limit"] is None or row["ratio"] is None else ("met" if row["ratio"] <= row["limit"] else "**not met**")
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        rows.append(f"| {row['measure']} | {row['first']} | {row['last']} | {ratio} | {limit} | {ok} |")
    rows += [
        "",
        "Per phase: tasks, the tasks' CPU per document, the largest task's peak RSS (MiB):",
        "",
        f"| phase | {s0}x tasks | {s0}x us/doc | {s0}x task MiB | {s1}x tasks | {s1}x us/doc | {s1}x task MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in phase_order([first, last]):
        if p == "stats":
            continue
        cells = []
        for r in (first, last):
            ph = r["phases"].get(p)
            cells += (
                ["-", "-", "-"]
                if ph is None
                else [str(ph["tasks"]), f"{ph['cpu_us_per_doc']:,.0f}", _mib(ph["task_peak_rss_mib_max"])]
            )
        rows.append(f"| {p} ({describe(p)}) | " + " | ".join(cells) + " |")
    if "opens" in first and "opens" in last:
        folders = sorted(set(first["opens"]["by_folder"]) | set(last["opens"]["by_folder"]))
        rows += [
            "",
            "Files opened (read) per 1,000 documents, by run-folder area:",
            "",
            f"| area | {s0}x | {s1}x | {s1}x/{s0}x |",
            "|---|---|---|---|",
        ]
        for f in folders:
            a = first["opens"]["by_folder"].get(f, {}).get("opened", 0) * 1000 / first["docs"]
            b = last["opens"]["by_folder"].get(f, {}).get("opened", 0) * 1000 / last["docs"]
            if a or b:
                rows.append(f"| {f} | {a:,.1f} | {b:,.1f} | {b / a:.2f} |" if a else f"| {f} | 0 | {b:,.1f} | - |")
    return "\n".join(rows)


def explain_md(explain: list[dict[str, Any]] | None) -> str:
    if not explain:
        return "Not measured in this run."
    rows = [
        "`bench/scaling/explain_files.py` runs `datapipe explain RUN ID` under strace on the run folders of the runs "
        "above (downloaded from the store after the run), for 5 ids spread over the run (the first row of kept "
        "files spread over `docs/`) and 3 kept documents that have copies, and counts the files under the run "
        "folder it opens and the bytes it reads from them (range over the ids). The Parquet files split in "
        "three: those read to find the document's own row, the dedup/MinHash reject files (a run without the "
        "copies index scanned them for a kept document's copies, `select ... where dup_of = id`), and the "
        "copies index files (`copies/`) that list them now:",
        "",
        "| documents | document files (with dup_of) | files opened per explain | Parquet: the row | Parquet: reject "
        "files with dup_of | Parquet: copies index | bytes read | of them Parquet |",
        "|---|---|---|---|---|---|---|---|",
    ]
    none = {"min": 0, "max": 0}
    for r in explain:
        f, b, pb = r["files_opened"], r["bytes_read"], r["parquet_bytes_read"]
        row, dup, cop = r["row_files_opened"], r["dup_files_opened"], r.get("copies_files_opened", none)
        rows.append(
            f"| {r['documents']:,} | {r['document_files']:,} ({r['dup_files']}) | {f['min']}-{f['max']} | "
            f"{row['min']}-{row['max']} | {dup['min']}-{dup['max']} | {cop['min']}-{cop['max']} | "
            f"{b['min'] / 1e6:,.2f}-{b['max'] / 1e6:,.2f} MB | {pb['min'] / 1e3:,.0f}-{pb['max'] / 1e3:,.0f} kB |"
        )
    others = sorted({o for r in explain for i in r["ids"] for o in i["other_files"]})
    rows += [
        "",
        f"Besides Parquet it opens {', '.join(f'`{o}`' for o in others)} (the index of the document files, one "
        "row per file, and the run's record). **Finding the row is bounded**: only the files whose recorded id "
        "range holds the id are opened. **So is listing the copies**: the task that decides a copy hands its row "
        "to the survivor's map task too, which writes the copies of its documents to one file per dedup stage "
        "(`copies/`, its `dup_of` range recorded in `stats.duckdb`'s `copies_files`), and explain reads only the "
        "copies files whose range holds the id, those of the survivor's own task (engine/tasks/copies.py). Before "
        "the index, a kept document's copies could be in any task's reject file, and explain opened most of the "
        "files with a `dup_of` column (100-130 of 151 at 16x; bench/results/explain_files_before_index.json).",
    ]
    return "\n".join(rows)


# The 1x/16x run of 2026-11-27 02:50 UTC (commit 593ee29), before markers came back with their results.
BEFORE_RETURNED_MARKERS = {
    1: {"GET": 0.1386, "HEAD": 0.1523},
    16: {"GET": 0.1307, "HEAD": 0.1350, "driver_cpu_s": 25.55, "tasks": 1490},
}


def gets_md(runs: list[dict[str, Any]]) -> str:
    parts = []
    for r in runs:
        old = BEFORE_RETURNED_MARKERS.get(r["scale"])
        if old is None or "s3" not in r:
            continue
        get, head = (r["s3"].get(k, 0) / r["docs"] for k in ("GET", "HEAD"))
        parts.append(
            f"at {r['scale']}x store GETs per document {old['GET']:.3f} → {get:.3f}, HEADs {old['HEAD']:.3f} → {head:.3f}"
        )
    last, old = runs[-1], BEFORE_RETURNED_MARKERS.get(runs[-1]["scale"], {})
    if "driver_cpu_s" in old:
        parts.append(
            f"the driver's CPU at {last['scale']}x {old['driver_cpu_s']:.1f} → {last['driver_cpu_s']:.1f} s for "
            f"{old['tasks']:,} → {last['tasks']:,} tasks (the run of 2026-11-27 02:50 UTC before, the run above after)"
        )
    return "; ".join(parts)


def driver_threads_md(runs: list[dict[str, Any]]) -> str:
    parts = [
        f"{r['scale']}x of {r['docs'] // r['scale']:,} ({r['tasks']:,} tasks, wall {r['wall_s']:,.0f} s): "
        f"{r['driver_cpu_s']:,.1f} CPU s, {r['driver_own_cpu_s']:,.1f} in its own threads and "
        f"{r['driver_ray_threads_cpu_s']:,.1f} in Ray's"
        for r in runs
        if "driver_own_cpu_s" in r
    ]
    return "The runs above: " + "; ".join(parts) + "." if parts else ""


def merge_task_md(mt: dict[str, Any] | None) -> str:
    """bench/scaling/merge_task.py's figures: one crawl-sized MinHash decisions merge task."""
    if not mt:
        return "Not measured."
    c, fit = mt["crawl"], mt["fit"]
    sizes = sorted({m["files"] for m in mt["measured"]})
    rows = [
        f"`python -m bench.scaling.merge_task --files {','.join(map(str, sizes))} --json bench/results/merge_task.json`, "
        f"{mt['date']}, {mt['env']['cores']} cores ({mt['env']['cpu_model']}), shared. Inputs at crawl proportions: "
        f"{mt['decisions_per_doc']:.4f} MinHash decisions per document (the 16x run above), and per decision "
        + ", ".join(f"{v / mt['decisions_per_doc']:.2f} {k} rows" for k, v in mt["rows_per_doc"].items())
        + f" (a small real run's partition outputs, all written in round "
        f"{', '.join(str(r) for r in mt['decisions_by_round'])}); a crawl partition output holds "
        + ", ".join(f"{v:,.0f} {k} rows" for k, v in mt["rows_per_output"].items())
        + f" ({c['docs'] / c['partitions'] / 1e6:.2f}M documents per partition), shards drawn over {c['shards']:,}, "
        f"written as a partition writes them. One range task ({c['ranges']} per group) of N outputs of each kind, "
        f"its output split into files of {mt['keys_per_file']} shards:",
        "",
        "| outputs of each kind (N) | rows read (whole row groups) | rows written | CPU s (min-max over ranges and repeats) |",
        "|---|---|---|---|",
    ]
    for n in sizes:
        ms = [m for m in mt["measured"] if m["files"] == n]
        cpu = [m["cpu_s"] for m in ms]
        rows.append(
            f"| {n} | {ms[0]['rows_in_files']:,} | {min(m['rows_out'] for m in ms):,}-{max(m['rows_out'] for m in ms):,} | "
            f"{min(cpu):.2f}-{max(cpu):.2f} |"
        )
    from bench.scaling.merge_task import task_sizes

    rows += [
        "",
        f"Fitted: {fit['task_s']:.2f} s per task (writing a row group per shard of its range, "
        f"{-(-c['shards'] // c['ranges']):,} of them, per kind) + {fit['per_file_s']:.3f} s per output of each kind "
        f"({fit['per_row_us']:.2f} us per row of the outputs); peak RSS of the bench process {mt['peak_rss_mib']:,.0f} MiB. "
        f"The crawl's outputs cut into groups by rows (the code) and by count (before), for two "
        f"`split.shuffle_groups` (`task_sizes`):",
        "",
        "| G | groups cut | groups holding rows | outputs per group (max) | rows per task mean / max | "
        "task CPU s mean / max | straggler |",
        "|---|---|---|---|---|---|---|",
    ]
    for g, by_rows in ((64, True), (64, False), (256, True), (256, False)):
        d = task_sizes(mt, g, by_rows)
        what = "by rows (`output_bounds`, the code)" if by_rows else "by count (before)"
        rows.append(
            f"| {g} | {what} | {d['groups_with_rows']} of {g} | {d['files_per_group_max']} | "
            f"{d['rows_per_task_mean']:,.0f} / {d['rows_per_task_max']:,.0f} | {d['task_cpu_s_mean']:.1f} / "
            f"{d['task_cpu_s_max']:.1f} | {d['straggler']:.2f} |"
        )
    return "\n".join(rows)


def driver_fit_md(est: dict[str, Any]) -> str:
    """The driver's fit by section in a sentence (bench/scaling/cost_model.py ``driver_sections``)."""
    sec = est.get("driver_sections")
    if sec is None:
        return "(no run recorded the driver's sections)"
    kinds = ", ".join(
        f"{k} {f['per_task_s'] * 1e3:.2f} ms per task"
        for k, f in sorted(sec["kinds"].items())
        if k in ("map", "partition", "merge")
    )
    upper = est["driver_upper_s"]
    return (
        f"{kinds}, {sec['per_wall_s'] * 1e3:.2f} ms per second of wall, the end of the run "
        f"{sec['end'][0] * 1e3:.2f} ms per task of the run + {sec['end'][1]:.2f} s ({sec['runs']} runs of "
        f"{min(sec['tasks']):,}-{max(sec['tasks']):,} tasks); over the crawl's {est['total_tasks']:,} tasks "
        f"{est['driver_s']:,.0f} s, {_all_share(est):.1%} of the run were all of it serial, and without the part per "
        f"second {upper:,.0f} s, {upper / (est['rest_s'] + upper):.1%}"
    )


def _all_share(est: dict[str, Any]) -> float:
    """The driver's whole own CPU as a share of the run, were all of it serial (the estimate before the
    phases were recorded by part charged it so)."""
    held = est.get("driver_held")
    return held["all_share"] if held else est["driver_s"] / est["total_s"]


def held_runs_md(est: dict[str, Any]) -> str:
    """Each run that recorded the phases by part: its parts summed over the phases."""
    sec = est.get("driver_sections") or {}
    runs = (sec.get("split") or {}).get("per_run", [])
    if not runs:
        return "(no run recorded the phases by part)"
    return (
        "Own CPU summed over the phases, per run: "
        + "; ".join(
            f"{r['tasks']:,} tasks (wall {r['wall_s']:,.0f} s): plan {r['plan']:.2f} s, submit {r['submit']:.2f}, "
            f"results {r['results']:.2f}, commit {r['commit']:.2f}; start {r['start']:.2f}, end {r['end']:.2f}"
            for r in runs
        )
        + "."
    )


def _held_verdict(est: dict[str, Any]) -> str:
    """What of the driver's CPU holds the run up, where the runs recorded each phase by part."""
    held = est.get("driver_held")
    if held is None:
        return ""
    top = max(held["beside"], key=lambda b: b["core_share"])
    return (
        f"Of the driver's CPU, what holds the run up (its start, each phase's plan and commit, handing over a "
        f"phase's first {est['cores']:,} tasks, the end of the run) is {held['held_s']:,.0f} s, "
        f"{held['held_s'] / est['total_s']:.1%} of the run; the rest runs beside the tasks on the head's own "
        f"core, at most {top['core_share']:.1%} of it in any phase ({top['phase']}). "
    )


def verdict_md(est: dict[str, Any], split: dict[str, Any]) -> str:
    total_h = est["total_s"] / 3600
    worst = max(est["serial"], key=lambda s: s[1])
    phases = sorted(est["phases"], key=lambda ph: ph["wall_s"], reverse=True)
    top = ", ".join(f"{ph['phase']} {ph['wall_s'] / est['total_s']:.0%}" for ph in phases[:3])
    footer_h = sum(ph["footer_s_per_task"] * ph["crawl_tasks"] for ph in est["phases"]) / 3600
    before_h = sum(ph["footer_s_per_task"] * ph["crawl_tasks"] for ph in split["phases"]) / 3600
    by_phase = {ph["phase"]: ph["footer_s_per_task"] * ph["crawl_tasks"] / 3600 for ph in est["phases"]}
    footer_top = sorted(by_phase.items(), key=lambda kv: -kv[1])[:2]
    ok = total_h <= 1.5 and worst[1] / est["total_s"] <= 0.05
    return (
        f"**Verdict: {total_h:.2f} h end to end ({'within' if total_h <= 1.5 else 'over'} the 1.5 h target); the "
        f"largest serial step is {worst[0]}, {worst[1]:,.0f} s = {worst[1] / est['total_s']:.1%} of the run "
        f"({'within' if worst[1] / est['total_s'] <= 0.05 else 'over'} 5%).** {'Both targets are met.' if ok else ''} "
        f"The phases that take the most time: {top}. Footer parsing of the merged shuffle and decision files is "
        f"{footer_h:,.0f} core-hours of it ({', '.join(f'{k} {v:,.1f}' for k, v in footer_top)}: a map task "
        f"parses G files of each kind of decisions it applies); with one file per merge task (before) it was {before_h:,.0f} "
        f"core-hours at the same `split.shuffle_groups` and the estimate {split['total_s'] / 3600:.2f} h. "
        + _held_verdict(est)
        + f"The driver's CPU in its own threads ({est['driver_fit'][0] * 1e3:.2f} ms per "
        f"task) over {est['total_tasks']:,} tasks is {est['driver_s']:,.0f} s, {_all_share(est):.1%} of the "
        f"run{' were all of it serial' if est.get('driver_held') else ''}; within 5% of 1.5 h it must stay under "
        f"{0.05 * 5400 / est['total_tasks'] * 1e3:.2f} ms per task "
        f"(here: {est['map_tasks']:,} per map phase, "
        f"{next(ph['crawl_tasks'] for ph in est['phases'] if ph['kind'] == 'pack'):,} pack tasks of "
        f"2^{TOKENS_PER_PACK_TASK.bit_length() - 1} tokens, "
        f"{PARTITIONS:,} per shuffle round). "
        + (
            f"Its upper bound, every phase section charged per task and per phase (no part per second of wall), "
            f"is {est['driver_upper_s']:,.0f} s, {est['driver_upper_s'] / (est['rest_s'] + est['driver_upper_s']):.1%}, "
            "and the load of the 2 shared cores moves the driver's CPU for the same work by up to ~2x (above). "
            if est.get("driver_sections") is not None
            else ""
        )
        + "The estimate inherits the bench's per-task figures measured on 2 shared cores with small tasks; "
        "it assumes the crawl's per-document CPU of every phase is the fitted one (the shuffle rounds' work "
        "grows with the candidate pairs and clusters, here 5% exact and 5% near copies) and the same number of "
        "MinHash rounds as measured."
    )


def crawl_md(paths: list[Path], driver: Path | None = None) -> str:
    """The crawl-proportion tables (bench/scaling/crawl_proportions.py JSONs), the driver at the crawls' task
    counts (bench/scaling/driver_crawl.py) and the estimate built from them (bench/scaling/cost_model.py)."""
    from bench.scaling import cost_model

    if not paths:
        return "Not recorded: no `--crawl` JSON given."
    docs = [json.loads(p.read_text()) for p in paths]
    results, drivers = cost_model.load(paths, driver)
    runs = []
    for p, d in zip(paths, docs):
        env, load = d["env"], d.get("loadavg")
        where = (
            f"load average {load['start'][0]:.1f} at the start, {load['end'][0]:.1f} at the end" if load else "load not recorded"
        )
        if load and "min" in load:
            where += f" ({load['min']:.1f}-{load['max']:.1f} during the run)"
        partial = f"; **partial**: {d['partial']}" if d.get("partial") else ""
        runs.append(f"`{p.name}`: {env['date_utc']} UTC, commit {env['git_commit']}, {env['cores']} cores, {where}{partial}")
    parts = [
        "Measured (" + "; ".join(runs) + "). Every phase's largest task (its real code in a fresh process, "
        "on files of the crawl's counts): CPU seconds and peak RSS; tasks as the engine plans the phase at that size:",
        _tasks_md(results),
        "The driver (`bench/scaling/driver_crawl.py`: every phase through the runner's loop on a run folder in "
        "object storage, each task's marker at the crawl's counts adopted as it comes back; CPU of the driver's "
        "own threads by part of each phase; planning and commit hold the run up, adoption overlaps the tasks):",
        cost_model.driver_md(drivers) if drivers else "Not measured.",
        "The estimate (`bench/scaling/cost_model.py`): every task of a phase charged its phase's largest task's CPU "
        "(which includes its reads per row group and per open file), its store requests one after another, its "
        "bytes through its node's link; waves of 64 x 64 cores; slowed to the store's throttling per prefix and to "
        "the driver's adoption; the driver's planning, commit and end of the run serial. Phases not measured are "
        "charged a stand-in, named per phase below. Each assumption in turn:",
        cost_model.sensitivity_md(results, drivers),
    ]
    for crawl in cost_model.crawls_of(results):
        parts += [
            f"Per phase at {crawl}, 50 ms per request, 10 Gbit/s per node, throttled:",
            cost_model.phases_md(results, drivers, crawl),
        ]
    return "\n\n".join(parts)


def _tasks_md(results: list[dict[str, Any]]) -> str:
    """Every phase's largest task per crawl: its CPU seconds and peak RSS (**over**: above the issue's bound)."""
    from bench.scaling import cost_model
    from bench.scaling.crawl_proportions import LIMIT_CPU_S, LIMIT_MIB  # 2 GB (1,907 MiB) and 10 min

    crawls = cost_model.crawls_of(results)
    order = list(dict.fromkeys(r["phase"] for r in results))
    head = " | ".join(f"{c} tasks | {c} largest task CPU s | {c} peak RSS MiB" for c in crawls)
    lines = [f"| phase | {head} |", "|---" * (1 + 3 * len(crawls)) + "|"]
    for phase in order:
        cells = []
        for c in crawls:
            got = [r for r in results if r["phase"] == phase and r["crawl"] == c]
            if not got:
                cells.append("not measured | - | -")
                continue
            r = max(got, key=lambda x: x["cpu_s"])
            n = cost_model.tasks_in_how(r)
            cpu_over = " **over**" if r["cpu_s"] > LIMIT_CPU_S else ""
            rss_over = " **over**" if r["peak_mib"] > LIMIT_MIB else ""
            cells.append(f"{'-' if n is None else f'{n:,}'} | {r['cpu_s']:,.1f}{cpu_over} | {r['peak_mib']:,.0f}{rss_over}")
        lines.append(f"| {phase} | {' | '.join(cells)} |")
    return "\n".join(lines)


def render(
    scale: dict[str, Any],
    runs: list[dict[str, Any]],
    estimate: str,
    fit: str,
    per_core_hour: str,
    est: dict[str, Any],
    split: dict[str, Any],
    explain: list[dict[str, Any]] | None,
    merge_task: dict[str, Any] | None = None,
    crawl: str = "",
) -> str:
    text = TEMPLATE.read_text()
    for key, value in (
        ("DRIVER_THREADS", driver_threads_md(runs)),
        ("DRIVER_FIT", driver_fit_md(est)),
        ("HELD_RUNS", held_runs_md(est)),
        ("GETS", gets_md(scale["extra"]["scales"])),
        ("ACCEPTANCE", acceptance_md(scale)),
        ("EXPLAIN", explain_md(explain)),
        ("ESTIMATE", estimate),
        ("FIT", fit),
        ("PER_CORE_HOUR", per_core_hour),
        ("VERDICT", verdict_md(est, split)),
        ("MERGE_TASK", merge_task_md(merge_task)),
        ("CRAWL", crawl),
    ):
        text = text.replace("{{" + key + "}}", value)
    return text


CRAWL_START, CRAWL_END = "## At a crawl's proportions", "How the estimate is computed (`bench/scaling/pre48_model.py`)"


def splice_crawl(page: Path, crawl: str) -> None:
    """Only the page's crawl section (from its heading to the old estimate's method) rewritten from the
    template: the old estimate's inputs (``merge1d``: bench/scaling/merge_task.py) left with the sorted runs."""
    text, template = page.read_text(), TEMPLATE.read_text()
    section = template[template.index(CRAWL_START) : template.index(CRAWL_END)].replace("{{CRAWL}}", crawl)
    page.write_text(text[: text.index(CRAWL_START)] + section + text[text.index(CRAWL_END) :])


def main() -> int:
    ap = add_args(argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    ap.add_argument("--explain", type=Path, help="bench/scaling/explain_files.py JSON")
    ap.add_argument("--write", type=Path, required=True, help="the page to write (docs/scaling.md)")
    ap.add_argument("--crawl", type=Path, nargs="*", default=[], help="bench/scaling/crawl_proportions.py JSONs (10 TB, 100 TB)")
    ap.add_argument("--driver", type=Path, help="bench/scaling/driver_crawl.py's JSON (bench/results/driver_scale.json)")
    ap.add_argument(
        "--crawl-only", action="store_true", help="rewrite only the page's crawl section (the old estimate is not rebuilt)"
    )
    a = ap.parse_args()
    if a.crawl_only:
        splice_crawl(a.write, crawl_md(a.crawl, a.driver))
        print(f"wrote the crawl section of {a.write}")
        return 0
    e = estimate(a)
    explain = json.loads(a.explain.read_text()) if a.explain else None
    before = next(o for o in e.options if not o["split"])
    page = render(
        e.scale, e.runs, e.text, e.fit, e.per_core_hour, e.est, before, explain, e.merge_task, crawl_md(a.crawl, a.driver)
    )
    a.write.write_text(page)
    print(f"wrote {a.write}: {e.est['total_s'] / 3600:.2f} h for the crawl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
