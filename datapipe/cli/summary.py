"""The summary a finished run prints: the funnel per stage and tokens per source."""

from __future__ import annotations

from rich.console import Console

from datapipe.audit.textout import data_table, make_console
from datapipe.engine.runner import RunResult


def print_summary(result: RunResult, console: Console | None = None) -> None:
    # Stage, reason and source names and the run folder's path are printed as they are (no markup).
    console = console or make_console()
    counts = result.run["counts"]
    # skipped: passed untouched because their kind is not in the stage's kinds (langid skips code);
    # they count in "in" and "kept", so one row's kept is the next row's in.
    funnel = data_table(
        ("#", "stage", "in", "skipped", "kept", "dropped", "by reason"),
        title="Documents per stage",
        right=("#", "in", "skipped", "kept", "dropped"),
    )
    for s in counts["stages"]:
        dropped = sum(s["rejected"].values())
        reasons = ", ".join(f"{r} {n:,}" for r, n in sorted(s["rejected"].items(), key=lambda kv: -kv[1]))
        funnel.add_row(
            str(s["position"]),
            s["stage"],
            f"{s['in']:,}",
            f"{s.get('skipped', 0):,}",
            f"{s['in'] - dropped:,}",
            f"{dropped:,}",
            reasons or "-",
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
    console.print(
        f'Try:\n  datapipe sql {root} "select stage, reason, count(*) as n from documents group by all order by n desc"',
        soft_wrap=True,
    )
