"""Driver CPU per task at 100, 1,000 and 10,000 tiny tasks: does the driver's bookkeeping stay linear?

A synthetic run folder per size: N map tasks in each map phase of a real run (the demo pipeline,
run once in process unless --template names a finished run folder), every marker a copy of that
run's marker with its task key and file names changed. The files the markers name are not there,
except those of the template's own tasks: the driver reads one footer per column layout, never
the others. Per size it measures the driver's CPU (all its threads) for:

- ``old``: the bookkeeping as it was: one marker read per task for the resume check, for each
  phase's to-do list and for the counts (``RunFolder.read_marker`` one at a time, uncached);
- ``new bookkeeping``: the same questions through one listing per phase and parallel reads
  (``RunFolder.read_markers``, cached), the counts (``collect_counts``) included;
- ``new statistics``: the rest of the end of a run, ``build_stats`` (stats.duckdb from the cached
  markers) and ``check_conservation``.

    PYTHONPATH=. python bench/driver_scale.py                 # 100, 1,000, 10,000 tasks
    PYTHONPATH=. python bench/driver_scale.py --sizes 100,1000

Prints CPU µs per task and the ratio of the largest size to the smallest (flat: about 1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from datapipe.engine.finish import build_stats, check_conservation, collect_counts  # noqa: E402
from datapipe.engine.runner import _all_done  # noqa: E402
from datapipe.run_folder.layout import RunFolder  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def template_run(tmp: Path) -> Path:
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    out = tmp / "template"
    run_pipeline(
        load_pipeline(ROOT / "pipelines" / "demo.yaml"), output=out, show_progress=False, log=lambda _: None, in_process=True
    )
    return out


def synthetic(template: Path, root: Path, n: int) -> tuple[Any, list[tuple[str, str]]]:
    """A run folder of ``n`` map tasks per map phase of ``template``, and a spec standing for it."""
    markers = template / "_work" / "markers"
    phases = sorted(p.name for p in markers.iterdir() if p.name.startswith("map"))
    for sub in ("docs", "rejected"):
        shutil.copytree(template / sub, root / sub)
    tasks = []
    for phase in phases:
        path = sorted((markers / phase).rglob("*.json"))[0]
        key = path.relative_to(markers / phase).as_posix()[: -len(".json")]
        text = path.read_text()
        for i in range(n):
            new = key if i == 0 else f"{key}-{i:06d}"
            target = root / "_work" / "markers" / phase / f"{new}.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            marker = json.loads(text)
            for f in marker.get("audit_files", []):
                if i:  # a hard link: the driver opens one file per column layout, whichever it is
                    renamed = f["path"].replace(key, new)
                    os.link(template / f["path"], root / renamed)
                    f["path"] = renamed
            target.write_text(json.dumps(marker, sort_keys=True))
            tasks.append((phase, new))
    keys = [k for p, k in tasks if p == phases[0]]
    spec = SimpleNamespace(
        segments=[SimpleNamespace(index=int(p[3:]), final=p == phases[-1]) for p in phases],
        shards=[SimpleNamespace(key=k, source=SimpleNamespace(name=k.split("/")[0])) for k in keys],
        sources={k.split("/")[0]: None for k in keys},
        stages=[],
        stage_types=[],
        stage_name=lambda pos: f"stage{pos}",
        tokenizer=None,
        root=str(root),
        fingerprint="bench",
    )
    return spec, tasks


def old_bookkeeping(root: Path, tasks: list[tuple[str, str]]) -> None:
    """One uncached read per task and question, as the runner and collect_counts did."""

    def read(phase: str, key: str) -> dict[str, Any] | None:
        path = root / "_work" / "markers" / phase / f"{key}.json"
        return json.loads(path.read_text()) if path.is_file() else None

    assert all(read(p, k) is not None for p, k in tasks)  # resume check
    for _ in range(2):  # each phase's to-do list, then collect_counts
        assert all(read(p, k) is not None for p, k in tasks)


def new_bookkeeping(folder: RunFolder, spec: Any, tasks: list[tuple[str, str]]) -> dict[str, Any]:
    """The same questions through one listing per phase and the cache: resume check, to-do lists, counts."""
    assert _all_done(folder, tasks)
    for phase in dict.fromkeys(p for p, _ in tasks):
        assert len(folder.read_markers(phase)) == len(spec.shards)
    return collect_counts(folder, spec)


def new_statistics(folder: RunFolder, spec: Any, counts: dict[str, Any]) -> None:
    build_stats(folder, spec, counts)
    check_conservation(folder, counts)


def measure(fn: Any) -> tuple[float, float, Any]:
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - cpu, time.perf_counter() - wall, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--template", type=Path, help="a finished run folder (default: the demo pipeline, run now)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="driver-scale-") as tmp:
        template = args.template or template_run(Path(tmp))
        per_task: dict[int, dict[str, float]] = {}
        print(
            f"{'tasks':>7} {'markers':>8} | CPU us per task: {'old bookkeeping':>15} {'new bookkeeping':>15} "
            f"{'new statistics':>14} | {'new wall s':>10}"
        )
        for n in sizes:
            root = Path(tmp) / f"n{n}"
            spec, tasks = synthetic(template, root, n)
            folder = RunFolder(root)
            old_cpu, _, _ = measure(lambda r=root, t=tasks: old_bookkeeping(r, t))  # type: ignore[misc]
            book_cpu, book_wall, counts = measure(lambda f=folder, s=spec, t=tasks: new_bookkeeping(f, s, t))  # type: ignore[misc]
            stats_cpu, stats_wall, _ = measure(lambda f=folder, s=spec, c=counts: new_statistics(f, s, c))  # type: ignore[misc]
            per_task[n] = {k: v / n * 1e6 for k, v in (("old", old_cpu), ("book", book_cpu), ("stats", stats_cpu))}
            row = per_task[n]
            print(
                f"{n:>7} {len(tasks):>8} | {'':>16}{row['old']:>15.0f} {row['book']:>15.0f} {row['stats']:>14.0f} | "
                f"{book_wall + stats_wall:>10.2f}",
                flush=True,
            )
            shutil.rmtree(root)
        lo, hi = min(sizes), max(sizes)
        ratio = {k: per_task[hi][k] / per_task[lo][k] for k in per_task[hi]}
        print(
            f"per-task CPU, {hi} vs {lo} tasks: old bookkeeping {ratio['old']:.2f}x, new bookkeeping {ratio['book']:.2f}x, "
            f"new statistics {ratio['stats']:.2f}x; new / old bookkeeping at {hi}: "
            f"{per_task[hi]['book'] / per_task[hi]['old']:.2f}"
        )


if __name__ == "__main__":
    main()
