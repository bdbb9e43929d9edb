"""Licence detection throughput (and accuracy on licence files) for each path.

    python -m bench.perf.license [--repeats 5] [--json PATH]   # default (phrase matcher) paths
    python -m bench.perf.license --scancode 60                 # + scancode on 60 licence files
Paths: licence files (choosealicense texts + variants), code-file headers, web pages (UDHR
HTML), the real-world layout set (tests/data/license_layouts: right / unknown / wrong), and
optionally scancode-toolkit on licence files (needs it importable; see
datapipe/license/scancode.py).  Prints files/s (median and range over --repeats rounds, the
paths taking turns in each round; there is no baseline); accuracy = exact id set, wrong = other ids.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from bench._support.harness import Harness, add_args
from bench._support.paths import SHARED
from datapipe.license import detect_code_file, detect_repository, detect_text, detect_web
from tests.support.license_layouts import detect_case, load_cases, score
from tests.support.license_variants import comment, load_choosealicense, variants

DATA = SHARED


def _ids(expr: str) -> frozenset[str]:
    # Compare families: scancode says GPL-3.0-only where the texts' front matter says GPL-3.0.
    return frozenset(
        t.removesuffix("-only").removesuffix("-or-later")
        for t in re.findall(r"[A-Za-z0-9.\-+:]+", expr)
        if t not in ("AND", "OR", "WITH", "unknown")
    )


def _licence_files(data: Path) -> list[tuple[str, str, frozenset[str]]]:
    refs = load_choosealicense(data / "licenses" / "choosealicense" / "_licenses")
    return [(f"{s}:exact", b, frozenset({s})) for s, b in refs] + variants(refs)


def _accuracy(items, got: list[frozenset[str]]) -> str:  # type: ignore[no-untyped-def]
    wants = [_ids(" AND ".join(sorted(w))) for _, _, w in items]
    right = sum(g == w for g, w in zip(got, wants))
    wrong = sum(bool(g) and g != w for g, w in zip(got, wants))
    return f"right {right / len(items):.1%}  wrong {wrong / len(items):.1%}  (n={len(items)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA, help="shared test data folder")
    ap.add_argument(
        "--scancode", type=int, default=0, metavar="N", help="also run scancode-toolkit on the first N licence files (0: skip)"
    )
    args = add_args(ap).parse_args()
    h = Harness("license", args)

    items = _licence_files(args.data)
    # Source files: a licence header (or SPDX line) then ~4 kB of code.
    code = "def f(x):\n    return x * 2\n\n" * 150
    refs = load_choosealicense(args.data / "licenses" / "choosealicense" / "_licenses")
    sources = [comment("SPDX-License-Identifier: MIT", 0) + code] * 50
    sources += [comment(b[:1500], i % 3) + code for i, (_, b) in enumerate(refs)]
    sources += [code] * 50
    pages = [
        p.read_text(encoding="utf-8", errors="replace")
        for p in sorted((args.data / "web" / "html" / "udhr").glob("*.html"))[:200]
    ]
    mb = sum(map(len, pages)) / 1e6
    cases = load_cases()
    out: dict = {}

    def files() -> None:
        out["files"] = [_ids(detect_text(text).license) for _, text, _ in items]

    def headers() -> None:
        for src in sources:
            detect_code_file(src)

    def web() -> None:
        for page in pages:
            detect_web(page)

    def layouts() -> None:
        out["layouts"] = [score(c.expected, detect_case(c, detect_repository, detect_code_file)) for c in cases]

    names = {
        "licence files": (files, len(items)),
        "code-file headers": (headers, len(sources)),
        "web pages (UDHR HTML)": (web, len(pages)),
        "real-world layouts": (layouts, len(cases)),
    }
    runs = h.interleave({k: fn for k, (fn, _) in names.items()}, warmup=True)
    for name, (_, n) in names.items():
        h.figure(f"default: {name} ({n}) files/s", [n / sec for sec in runs[name]], "files/s")
    print(f"web pages: {mb:.1f} MB, {h.figures[2]['median'] * mb / len(pages):.1f} MB/s")
    print(f"licence files: {_accuracy(items, out['files'])}")
    v, n = out["layouts"], len(cases)
    print(
        f"real-world layouts: right {v.count('right')}/{n}  unknown {v.count('unknown')}  "
        f"wrong {v.count('wrong')} ({v.count('wrong') / n:.1%})"
    )
    extra = {
        "licence_files_accuracy": _accuracy(items, out["files"]),
        "layouts": {k: v.count(k) for k in ("right", "unknown", "wrong")},
    }

    if args.scancode:
        from datapipe.license import scancode

        if not scancode.available():
            print("scancode: not importable; install scancode-toolkit-mini 'pluggy<1.7' in a venv")
        else:
            t = time.perf_counter()
            scancode.load_scancode()
            print(f"scancode: index load {time.perf_counter() - t:.1f} s")
            step = max(1, len(items) // args.scancode)
            sub = items[::step][: args.scancode]
            t = time.perf_counter()
            got = [_ids(scancode.detect_text_scancode(text).license) for _, text, _ in sub]
            h.figure("scancode: licence files files/s", len(sub) / (time.perf_counter() - t), "files/s")
            print(f"scancode: {_accuracy(sub, got)}")
    h.finish(**extra)


if __name__ == "__main__":
    main()
