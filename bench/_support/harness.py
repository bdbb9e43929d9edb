"""What every ``bench/`` script shares: the machine it ran on, interleaved repeats, ratios, noise, JSON.

A script does::

    h = Harness("langid", args, libs=["fasttext"])       # prints machine, date, commit, versions
    runs = h.interleave({"fasttext predict": raw, "langid stage": ours})   # baseline first
    h.figure("fasttext predict docs/s", [n / s for s in runs["fasttext predict"]], unit="docs/s")
    h.ratio("stage / raw", [b / a for a, b in zip(runs["langid stage"], runs["fasttext predict"])], target=">= 0.8")
    h.finish()                                            # noise, load average, --json

Why interleaved: the machines are shared, so load comes and goes within seconds. Running the
baseline and datapipe alternately (b, d, b, d, ...) exposes both to the same load, and the ratio
of each pair cancels most of it. The median of those per-pair ratios is the figure; min-max is
its range. How noisy the run was is printed too: the load average before and after, and the
coefficient of variation of the baseline's own timings (a quiet machine gives a few percent).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from bench._support.paths import ROOT

BASE_LIBS = ("datapipe", "numpy", "pyarrow")


def add_args(ap: argparse.ArgumentParser, repeats: int = 5) -> argparse.ArgumentParser:
    """The options every bench script takes."""
    ap.add_argument(
        "--repeats",
        type=int,
        default=repeats,
        help=f"interleaved baseline/datapipe pairs (default {repeats}); median and range are reported",
    )
    ap.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON to PATH")
    return ap


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _version(lib: str) -> str:
    try:
        return metadata.version(lib)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment(libs: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Machine, date, code version and library versions: what a figure needs to be reproduced."""
    commit = _git("rev-parse", "--short=12", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "mem_total_gib": _mem_total_gib(),
        "kernel": platform.release(),
        "git_commit": commit + ("-dirty" if dirty else ""),
        "python": platform.python_version(),
        "libs": {lib: _version(lib) for lib in dict.fromkeys([*BASE_LIBS, *libs])},
        "argv": sys.argv[1:],
    }


def summary(values: list[float]) -> dict[str, Any]:
    """Median, range and coefficient of variation of a series."""
    vals = [float(v) for v in values]
    if not vals:
        return {"median": None, "min": None, "max": None, "cv": None, "values": []}
    mean = statistics.fmean(vals)
    cv = statistics.pstdev(vals) / mean if len(vals) > 1 and mean else 0.0
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "cv": cv, "values": vals}


def fmt(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "n/a"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of one call."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class Harness:
    """One bench script's run: header, interleaved measurements, figures, ratios, noise, JSON."""

    def __init__(
        self, name: str, args: argparse.Namespace | None = None, libs: list[str] | tuple[str, ...] = (), note: str = ""
    ) -> None:
        self.name = name
        self.repeats = max(1, getattr(args, "repeats", 5) or 1)
        self.json_path: Path | None = getattr(args, "json", None)
        self.env = environment(libs)
        self.load_before = os.getloadavg()
        self.figures: list[dict[str, Any]] = []
        self.ratios: list[dict[str, Any]] = []
        self.baseline_cv: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}
        e = self.env
        print(f"== bench/{name}.py  {e['date_utc']} UTC  commit {e['git_commit'] or 'unknown'}")
        print(
            f"   machine: {e['cores']} cores, {e['cpu_model']}, {e['mem_total_gib']} GiB RAM, "
            f"load average {self.load_before[0]:.1f} / {self.load_before[1]:.1f} / {self.load_before[2]:.1f}"
        )
        print(f"   python {e['python']}; " + ", ".join(f"{k} {v}" for k, v in e["libs"].items()))
        if note:
            print(f"   {note}")
        print(flush=True)

    def interleave(
        self, sides: dict[str, Callable[[], Any]], repeats: int | None = None, baseline: str | None = None, warmup: bool = False
    ) -> dict[str, list[Any]]:
        """Call each side in turn, ``repeats`` rounds: b, d, b, d, ... The first side is the baseline.

        A side returning None is timed (wall seconds); one returning a value gives that value
        (seconds it timed itself, or a dict). The baseline's own spread is recorded as noise
        when its values are numbers. ``warmup`` calls each side once, untimed, first (imports, JIT, caches).
        """
        if warmup:
            for fn in sides.values():
                fn()
        out: dict[str, list[Any]] = {k: [] for k in sides}
        for _ in range(repeats or self.repeats):
            for name, fn in sides.items():
                t0 = time.perf_counter()
                r = fn()
                out[name].append(time.perf_counter() - t0 if r is None else r)
        base = baseline or next(iter(sides))
        if all(isinstance(v, (int, float)) for v in out[base]):
            self.noise(base, out[base])
        return out

    def noise(self, label: str, values: list[float]) -> None:
        """Record the spread of a baseline's repeated timings (coefficient of variation)."""
        self.baseline_cv.append({"baseline": label, **summary(values)})

    def figure(
        self, label: str, values: list[float] | float, unit: str = "", show: bool = True, target: str = ""
    ) -> dict[str, Any]:
        """An absolute figure (docs/s, MiB, seconds); ``target`` when the figure itself has one (< 2 s)."""
        vals = values if isinstance(values, list) else [values]
        rec = {"label": label, "unit": unit, **summary(vals)}
        if target:
            rec["target"] = target
        self.figures.append(rec)
        if show:
            rng = f"  (range {fmt(rec['min'])}-{fmt(rec['max'])}, n={len(vals)})" if len(vals) > 1 else ""
            tgt = f"  target {target}" if target else ""
            print(f"{label:<52} {fmt(rec['median']):>10} {unit}{rng}{tgt}")
        return rec

    def ratio(self, label: str, values: list[float], target: str = "") -> dict[str, Any]:
        """A per-pair ratio: prints its median and min-max range."""
        rec = {"label": label, "target": target, **summary(values)}
        self.ratios.append(rec)
        tgt = f"  target {target}" if target else ""
        print(
            f"ratio {label}: {fmt(rec['median'])} median, range {fmt(rec['min'])}-{fmt(rec['max'])} over {len(values)} pairs{tgt}"
        )
        return rec

    def finish(self, **extra: Any) -> dict[str, Any]:
        """Print how noisy the run was and write the JSON (when --json was given)."""
        self.extra.update(extra)
        after = os.getloadavg()
        cores = self.env["cores"] or 1
        print(f"\nnoise: load average {self.load_before[0]:.1f} before, {after[0]:.1f} after (1-min, {cores} cores)", end="")
        for n in self.baseline_cv:
            print(f"; {n['baseline']} CV {n['cv']:.1%} over {len(n['values'])} runs", end="")
        print()
        result = {
            "bench": self.name,
            "env": self.env,
            "repeats": self.repeats,
            "noise": {"loadavg_before": self.load_before, "loadavg_after": after, "baseline_cv": self.baseline_cv},
            "figures": self.figures,
            "ratios": self.ratios,
            "extra": self.extra,
        }
        if self.json_path:
            self.json_path.parent.mkdir(parents=True, exist_ok=True)
            self.json_path.write_text(json.dumps(result, indent=1, default=str, ensure_ascii=False) + "\n")
            print(f"results written to {self.json_path}")
        return result


def pair_ratios(num: list[float], den: list[float]) -> list[float]:
    """num[i] / den[i] for each interleaved pair."""
    return [a / b for a, b in zip(num, den) if b]
