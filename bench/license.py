"""Licence detection throughput (and accuracy on licence files) for each path.

    PYTHONPATH=. python bench/license.py                 # default (phrase matcher) paths
    PYTHONPATH=. python bench/license.py --scancode 60   # + scancode on 60 licence files
Paths: licence files (choosealicense texts + variants), code-file headers, web pages (UDHR
HTML), the real-world layout set (tests/data/license_layouts: right / unknown / wrong), and
optionally scancode-toolkit on licence files (needs it importable; see
datapipe/license/scancode.py).  Prints files/s; accuracy = exact id set, wrong = other ids.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from datapipe.license import detect_code_file, detect_repository, detect_text, detect_web  # noqa: E402
from tests.license_layouts import detect_case, load_cases, score  # noqa: E402
from tests.license_variants import comment, load_choosealicense, variants  # noqa: E402

DATA = ROOT.parent / "shared" / "data"


def _ids(expr: str) -> frozenset[str]:
    # Compare families: scancode says GPL-3.0-only where the texts' front matter says GPL-3.0.
    return frozenset(t.removesuffix("-only").removesuffix("-or-later")
                     for t in re.findall(r"[A-Za-z0-9.\-+:]+", expr)
                     if t not in ("AND", "OR", "WITH", "unknown"))


def _licence_files(data: Path) -> list[tuple[str, str, frozenset[str]]]:
    refs = load_choosealicense(data / "licenses" / "choosealicense" / "_licenses")
    return [(f"{s}:exact", b, frozenset({s})) for s, b in refs] + variants(refs)


def _rate(label: str, n: int, seconds: float, extra: str = "") -> None:
    print(f"{label:<34} {n:>6} files {seconds:8.3f} s {n / seconds:>10.1f} files/s  {extra}")


def bench_files(items, detect, label: str, repeat: int = 1) -> None:
    t = time.perf_counter()
    for _ in range(repeat):
        got = [_ids(detect(text).license) for _, text, _ in items]
    dt = time.perf_counter() - t
    wants = [_ids(" AND ".join(sorted(w))) for _, _, w in items]
    right = sum(g == w for g, w in zip(got, wants))
    wrong = sum(bool(g) and g != w for g, w in zip(got, wants))
    _rate(label, len(items) * repeat, dt,
          f"right {right / len(items):.1%}  wrong {wrong / len(items):.1%}  (n={len(items)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA, help="shared test data folder")
    ap.add_argument("--repeat", type=int, default=3, help="passes over the default-path inputs")
    ap.add_argument("--scancode", type=int, default=0, metavar="N",
                    help="also run scancode-toolkit on the first N licence files (0: skip)")
    args = ap.parse_args()

    items = _licence_files(args.data)
    bench_files(items, detect_text, "default: licence files", args.repeat)

    # Source files: a licence header (or SPDX line) then ~4 kB of code.
    code = "def f(x):\n    return x * 2\n\n" * 150
    refs = load_choosealicense(args.data / "licenses" / "choosealicense" / "_licenses")
    sources = [comment("SPDX-License-Identifier: MIT", 0) + code] * 50
    sources += [comment(b[:1500], i % 3) + code for i, (_, b) in enumerate(refs)]
    sources += [code] * 50
    t = time.perf_counter()
    for _ in range(args.repeat):
        for s in sources:
            detect_code_file(s)
    _rate("default: code-file headers", len(sources) * args.repeat, time.perf_counter() - t)

    pages = [p.read_text(encoding="utf-8", errors="replace")
             for p in sorted((args.data / "web" / "html" / "udhr").glob("*.html"))[:200]]
    mb = sum(map(len, pages)) / 1e6
    t = time.perf_counter()
    for _ in range(args.repeat):
        for p in pages:
            detect_web(p)
    _rate("default: web pages (UDHR HTML)", len(pages) * args.repeat, time.perf_counter() - t,
          f"{mb * args.repeat / (time.perf_counter() - t):.1f} MB/s")

    cases = load_cases()
    t = time.perf_counter()
    for _ in range(args.repeat):
        verdicts = [score(c.expected, detect_case(c, detect_repository, detect_code_file)) for c in cases]
    n = len(cases)
    _rate("default: real-world layouts", n * args.repeat, time.perf_counter() - t,
          f"right {verdicts.count('right')}/{n}  unknown {verdicts.count('unknown')}  "
          f"wrong {verdicts.count('wrong')} ({verdicts.count('wrong') / n:.1%})")

    if args.scancode:
        from datapipe.license import scancode
        if not scancode.available():
            print("scancode: not importable; install scancode-toolkit-mini 'pluggy<1.7' in a venv")
            return
        t = time.perf_counter()
        scancode._scancode()
        print(f"scancode: index load {time.perf_counter() - t:.1f} s")
        step = max(1, len(items) // args.scancode)
        bench_files(items[::step][: args.scancode], scancode.detect_text_scancode, "scancode: licence files")


if __name__ == "__main__":
    main()
