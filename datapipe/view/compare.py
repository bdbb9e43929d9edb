"""Two runs of the same documents (``datapipe view RUN_A RUN_B``, ``/compare``): which documents got
another decision, grouped by what A decided and what B decided (kept, or the stage and reason that
dropped it). How a re-decide (``datapipe run --from``) or a new threshold is reviewed before training
on it.

The per-stage and per-reason counts of both runs come from their indexes (exact, no file read). The
documents themselves are compared map task by map task: a task's kept and rejected files in A against
the files of B with the same task key (a re-decided run keeps the old run's tasks), or, for runs split
otherwise, B's files whose id ranges overlap the task's. A page compares tasks until its time is up
and links to the next task, so any page of a run of any size costs about the same.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from datapipe.view.runs import DocFile, RunView

PAGE_SECONDS = 1.0
EXAMPLES = 5

Decision = tuple[str, str | None, str | None]  # status, stage, reason


@dataclass
class ChangeGroup:
    a: Decision
    b: Decision
    count: int = 0
    examples: list[str] = field(default_factory=list)


@dataclass
class Comparison:
    groups: list[ChangeGroup]
    reason_counts: list[dict[str, Any]]  # stage, reason, a, b (dropped documents per run, exact)
    tasks_done: int
    tasks_total: int
    next_task: int | None  # where the next page goes on; None: done
    first_task: int
    compared: int = 0
    same: int = 0
    only_a: int = 0
    only_b: int = 0


def _tasks(files: list[DocFile]) -> list[tuple[tuple[str, str], list[DocFile]]]:
    tasks: dict[tuple[str, str], list[DocFile]] = {}
    for f in files:
        tasks.setdefault((f.source, f.task), []).append(f)
    return sorted(tasks.items())


def _decisions(run: RunView, files: list[DocFile], lo: str | None = None, hi: str | None = None) -> dict[str, Decision]:
    out: dict[str, Decision] = {}
    for f in files:
        columns = ["id"] + [c for c in ("stage", "reason") if c in f.columns]
        with run.parquet(f) as pf:
            table = pf.read(columns=columns)
        ids = table["id"].to_pylist()
        stages = table["stage"].to_pylist() if "stage" in table.column_names else [f.stage] * len(ids)
        reasons = table["reason"].to_pylist() if "reason" in table.column_names else [None] * len(ids)
        for i, s, r in zip(ids, stages, reasons):
            if (lo is None or i >= lo) and (hi is None or i <= hi):
                out[i] = ("kept", None, None) if f.status == "kept" else ("rejected", s or f.stage, r)
    return out


def reason_counts(a: RunView, b: RunView) -> list[dict[str, Any]]:
    """Dropped documents per stage and reason in each run, from their indexes."""
    rows: dict[tuple[str, str | None], dict[str, Any]] = {}
    for label, run in (("a", a), ("b", b)):
        for r in run.index().reasons:
            key = (str(r["stage"]), r["reason"])
            rows.setdefault(key, {"stage": key[0], "reason": key[1], "a": 0, "b": 0})[label] += int(r["dropped"] or 0)
    kept = {"stage": "", "reason": "(kept)", "a": 0, "b": 0}
    for label, run in (("a", a), ("b", b)):
        kept[label] = sum(f.rows for f in run.index().files if f.status == "kept")
    return [kept] + sorted(rows.values(), key=lambda r: (r["stage"], str(r["reason"])))


def compare(a: RunView, b: RunView, first_task: int = 0, seconds: float = PAGE_SECONDS) -> Comparison:
    tasks_a = _tasks(a.index().files)
    tasks_b = dict(_tasks(b.index().files))
    deadline = time.perf_counter() + seconds
    groups: dict[tuple[Decision, Decision], ChangeGroup] = {}
    out = Comparison([], reason_counts(a, b), 0, len(tasks_a), None, first_task)
    for t in range(first_task, len(tasks_a)):
        if t > first_task and time.perf_counter() > deadline:
            out.next_task = t
            break
        key, files = tasks_a[t]
        lo = min((f.min_id for f in files if f.min_id is not None), default=None)
        hi = max((f.max_id for f in files if f.max_id is not None), default=None)
        if key in tasks_b:
            theirs, bounded = tasks_b[key], False
        else:  # split otherwise: B's files whose ids overlap this task's
            theirs = [
                f
                for f in b.index().files
                if f.min_id is not None
                and f.max_id is not None
                and lo is not None
                and hi is not None
                and f.min_id <= hi
                and f.max_id >= lo
            ]
            bounded = True
        mine = _decisions(a, files)
        other = _decisions(b, theirs, lo, hi) if bounded else _decisions(b, theirs)
        for doc_id, da in mine.items():
            db = other.get(doc_id)
            if db is None:
                out.only_a += 1
                continue
            out.compared += 1
            if da == db:
                out.same += 1
                continue
            g = groups.setdefault((da, db), ChangeGroup(da, db))
            g.count += 1
            if len(g.examples) < EXAMPLES:
                g.examples.append(doc_id)
        out.only_b += sum(1 for i in other if i not in mine)
        out.tasks_done += 1
    out.groups = sorted(groups.values(), key=lambda g: (-g.count, str(g.a), str(g.b)))
    return out
