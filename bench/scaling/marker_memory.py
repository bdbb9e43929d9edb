"""What the driver holds per committed task: a map task's marker adopted whole (before issue 48) and as
the run keeps it (``MarkerStore.compact``), by tracemalloc over ``--tasks`` adoptions.

    python -m bench.scaling.marker_memory --marker /tmp/crawl-proportions/template/out/_work/markers/map0/web/00000.json

``--marker``: a real map marker (bench/scaling/crawl_proportions.py's template run writes them); each
task's copy gets its own shard key, counts and files.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

from datapipe.run_folder import markers as marker_store
from datapipe.run_folder.layout import RunFolder


def held_kib(base: dict[str, Any], tasks: int, whole: bool) -> float:
    keep = marker_store.compact
    if whole:
        marker_store.compact = lambda m: m  # type: ignore[assignment]
    try:
        folder = RunFolder(tempfile.mkdtemp())
        bodies = []
        for i in range(tasks):
            files = [
                {"path": f"_work/map0/src/{i:06d}.parquet", "bytes": 10**8 + i, "footer": 4096},
                {"path": f"_work/shuffle0/src/{i:06d}.parquet", "bytes": 10**7 + i, "footer": 4096},
            ]
            bodies.append(json.dumps(dict(base, shard=f"src/{i:06d}", docs_in=i, files=files), sort_keys=True).encode())
        tracemalloc.start()
        for i, body in enumerate(bodies):
            folder.markers.adopt("map0", f"src/{i:06d}", body)
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return held / tasks / 1024
    finally:
        marker_store.compact = keep  # type: ignore[assignment]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--marker", type=Path, required=True)
    ap.add_argument("--tasks", type=int, default=20_000)
    a = ap.parse_args()
    base = json.loads(a.marker.read_text())
    for whole in (True, False):
        print(f"{'whole' if whole else 'compact'}: {held_kib(base, a.tasks, whole):.2f} KiB per task held")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
