"""The summary a finished run prints: the funnel per stage, what stages changed, and tokens per source.

It is read in logs as often as on a terminal (cluster runs, CI, nohup), so it is fitted to a log's
width: off a terminal the tables are at most ``LOG_WIDTH`` characters wide (long cells fold onto
more lines), and each stage names its ``TOP_REASONS`` most frequent drop reasons and how many
more it has; the full breakdown is in the run's audit database (the ``funnel`` view and the
``stage_edits`` table), as the last lines say. Everything comes from the run record's counts, summed
from the tasks' markers: nothing here reads the corpus.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from datapipe.audit.textout import data_table, make_console
from datapipe.engine.runner import RunResult

LOG_WIDTH = 160  # characters, off a terminal: a log line stays readable (and under 200)
TOP_REASONS = 3  # drop reasons named per stage; the rest are "… N more"


def print_summary(result: RunResult, console: Console | None = None) -> None:
    # Stage, reason and source names and the run folder's path are printed as they are (no markup).
    console = console or make_console(pipe_width=LOG_WIDTH)
    counts = result.run["counts"]
    # skipped: passed untouched because their kind is not in the stage's kinds (langid skips code);
    # they count in "in" and "kept", so one row's kept is the next row's in.
    funnel = data_table(
        ("#", "stage", "in", "skipped", "kept", "dropped", "by reason", "changed"),
        title="Documents per stage",
        right=("#", "in", "skipped", "kept", "dropped"),
    )
    for s in counts["stages"]:
        dropped = sum(s["rejected"].values())
        funnel.add_row(
            str(s["position"]),
            s["stage"],
            f"{s['in']:,}",
            f"{s.get('skipped', 0):,}",
            f"{s['in'] - dropped:,}",
            f"{dropped:,}",
            reasons_cell(s["rejected"]),
            changes_cell(s),
        )
    console.print(funnel)
    sources = data_table(("source", "documents", "kept", "tokens"), title="Per source", right=("documents", "kept", "tokens"))
    for name, s in counts["sources"].items():
        sources.add_row(name, f"{s['documents']:,}", f"{s['kept']:,}", f"{s['tokens']:,}")
    console.print(sources)
    ran = f"{result.executed_tasks} tasks run" + (
        f", {result.skipped_tasks} already done (resumed)" if result.skipped_tasks else ""
    )
    console.print(f"{counts['documents']:,} documents in = {counts['kept']:,} kept + {counts['rejected']:,} rejected ({ran}).")
    from datapipe.storage.uri import remote_of

    root = remote_of(result.root) or result.root  # a run folder in object storage by its URI
    console.print(f"\nOutputs in {root}:\n  docs/  rejected/  shards/  stats.duckdb  run.json")
    queries = ['"select stage, reason, dropped, drop_share from funnel"']  # every reason of every stage
    if any(s.get("edits") for s in counts["stages"]):
        queries.append('"select * from stage_edits"')
    console.print("Try:\n" + "\n".join(f"  datapipe sql {root} {q}" for q in queries), soft_wrap=True)


def reasons_cell(rejected: dict[str, int]) -> str:
    """``zh:too_short 12, c4:curly_bracket 9, … 31 more``: the most frequent reasons first."""
    ranked = sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ", ".join(f"{r} {n:,}" for r, n in ranked[:TOP_REASONS])
    more = len(ranked) - TOP_REASONS
    return (shown + (f", … {more} more" if more > 0 else "")) or "-"


def changes_cell(stage: dict[str, Any]) -> str:
    """``1,020 docs: 43,210 lines removed, 2,310,455 chars removed`` for a stage that changes documents."""
    if "changed" not in stage:
        return "-"  # a stage that only judges documents (or a run recorded before stages counted edits)
    done = [f"{e['total']:,} {e['what']}" for e in stage.get("edits", []) if e["total"]]
    return f"{stage['changed']:,} docs" + (": " + ", ".join(done) if done else "")
