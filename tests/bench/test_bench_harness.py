"""The bench harness's accounting: per-pair ratios, and process-tree CPU/memory that includes orphans."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench._support.harness import Harness, pair_ratios, summary
from bench._support.proctree import run_tree


def test_summary_and_pair_ratios() -> None:
    s = summary([3.0, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"]) == (2.0, 1.0, 3.0)
    assert summary([5.0, 5.0])["cv"] == 0.0
    assert pair_ratios([2.0, 9.0], [1.0, 3.0]) == [2.0, 3.0]


def test_harness_interleaves_and_writes_json(tmp_path: Path) -> None:
    calls: list[str] = []

    class Args:
        repeats = 3
        json = tmp_path / "out.json"

    h = Harness("unit", Args())
    runs = h.interleave({"base": lambda: calls.append("b") or 2.0, "ours": lambda: calls.append("d") or 1.0})
    assert calls == ["b", "d"] * 3  # alternating, baseline first
    h.ratio("base/ours", pair_ratios(runs["base"], runs["ours"]))
    h.finish()
    res = json.loads((tmp_path / "out.json").read_text())
    assert res["ratios"][0]["median"] == 2.0
    assert res["env"]["cores"] and res["env"]["cpu_model"]
    assert res["noise"]["baseline_cv"][0]["baseline"] == "base"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_tree_counts_an_orphaned_grandchild(tmp_path: Path) -> None:
    # The child starts a grandchild and exits at once; the grandchild (an orphan by then) burns
    # CPU, holds ~200 MB, and records the CPU time it used itself. A timer around the child
    # alone would see almost nothing.
    report = tmp_path / "grandchild.json"
    grandchild = textwrap.dedent(f"""
        import json, os, time
        block = bytearray(200 * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        t = time.process_time()
        x = 0
        while time.process_time() - t < 0.5:
            x += 1
        time.sleep(0.5)  # hold the memory across a few samples
        json.dump({{"cpu": sum(os.times()[:2])}}, open({str(report)!r}, "w"))
    """)
    child = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {grandchild!r}])"
    r = run_tree([sys.executable, "-c", child], interval=0.05)
    own = json.loads(report.read_text())["cpu"]
    assert r["rc"] == 0
    assert r["cpu_s"] >= own * 0.95, (r, own)
    assert r["peak_rss_mib"] >= 200, r
    assert r["processes_seen"] >= 2


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_tree_leaves_the_callers_own_children_alone() -> None:
    # A test session's embedded Ray (GCS, raylet) are children of the pytest process: measuring a
    # command from that process must neither count them nor wait for or kill them (it once killed
    # them, and the session's Ray runs died a minute later).
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        r = run_tree([sys.executable, "-c", "pass"], interval=0.05)
        assert r["rc"] == 0
        assert bystander.poll() is None, "run_tree killed a process that is not of the measured tree"
        assert r["drained_s"] < 20, r  # it did not wait for the bystander either
    finally:
        bystander.kill()
        bystander.wait()
