"""Where a bench script finds the checkout, the shared data and the results folder."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the datapipe checkout
SHARED = ROOT.parent / "shared" / "data"  # ../shared/data, beside the checkout
RESULTS = ROOT / "bench" / "results"  # the JSON the scripts write with --json; docs/benchmarks.md's table
