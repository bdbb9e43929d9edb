"""The real-world licence layout set (tests/data/license_layouts): load it, detect, score.

Each case folder holds a repository's licence-relevant files as found in public
repositories (SOURCES.md says where each came from) and an expected.json:
{"license": SPDX expression or "unknown", "file": a source file whose own licence is
asked (else the repository's), "layout": what the case is about}.  Scoring compares
licence families (GPL-3.0, GPL-3.0-only and GPL-3.0-or-later are one family), as
bench/perf/license.py does: right = the same set (and the same AND/OR shape), unknown = we
said nothing, wrong = any other answer, including an id for an `unknown` case.
Used by tests/license/test_license_layouts.py and bench/perf/license.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

LAYOUTS = Path(__file__).resolve().parents[1] / "data" / "license_layouts"


@dataclass(frozen=True)
class Case:
    name: str
    files: dict[str, str]  # repository-relative path -> text
    expected: str
    file: str | None  # ask this file's licence (header first), else the repository's
    layout: str


def load_cases(root: Path = LAYOUTS) -> list[Case]:
    cases = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        meta = json.loads((folder / "expected.json").read_text(encoding="utf-8"))
        files = {
            p.relative_to(folder).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "expected.json"
        }
        cases.append(Case(folder.name, files, meta["license"], meta.get("file"), meta.get("layout", "")))
    return cases


def families(expr: str) -> tuple[frozenset[str], bool]:
    """(licence families, whether it is a choice) of an expression; unknown -> empty."""
    toks = [t for t in re.findall(r"[A-Za-z0-9.\-+:]+", expr) if t not in ("AND", "OR", "WITH", "unknown")]
    fams = frozenset(t.removesuffix("-only").removesuffix("-or-later").removesuffix("+") for t in toks)
    return fams, " OR " in expr


def detect_case(case: Case, detect_repository, detect_code_file) -> str:  # type: ignore[no-untyped-def]
    repo_files = {p: t for p, t in case.files.items() if p != case.file}
    repo = detect_repository(repo_files)
    if case.file is None:
        return repo.license
    return detect_code_file(case.files[case.file], repo).license


def score(expected: str, got: str) -> str:
    """'right', 'unknown' (we said nothing) or 'wrong'."""
    want, have = families(expected), families(got)
    if have == want:
        return "right"
    return "unknown" if not have[0] else "wrong"
