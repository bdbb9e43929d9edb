"""The file layout of ``datapipe/``: a folder per concept, few loose modules, no stdlib names, short functions.

A module named like a standard-library one (``tokenize``, ``code``, ``html``, ``types``...) shadows it
for any script run from its folder and confuses readers and tools about which one an import means.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "datapipe"
MAX_ROOT_MODULES = 5  # .py files directly under datapipe/ besides __init__.py


def test_few_modules_directly_under_datapipe():
    loose = sorted(p.name for p in ROOT.glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= MAX_ROOT_MODULES, (
        f"{len(loose)} modules directly under datapipe/ (at most {MAX_ROOT_MODULES}): {loose}; give them a folder"
    )


def test_no_module_or_package_is_named_like_a_standard_library_module():
    stdlib = set(sys.stdlib_module_names)
    clashes = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent)
        names = [path.stem] if path.stem != "__init__" else []
        names += [part for part in rel.parts[1:-1]]  # the folders it is in (datapipe itself excepted)
        clashes += [f"{rel}: {n}" for n in names if n in stdlib and not n.startswith("__")]
    assert not clashes, "named like a standard-library module:\n" + "\n".join(sorted(set(clashes)))


MAX_FUNCTION_LINES = 100  # from its `def` line to its last, docstring included
# Files whose long functions are still to be split: empty since issue 51, and it should stay so. An
# entry whose file no longer has a long function fails the test, so the list only shrinks.
LONG_FUNCTIONS_ALLOWED: set[str] = set()


def _long_functions() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), rel)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.setdefault(rel, []).append(f"{rel}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_over_100_lines():
    found = _long_functions()
    bad = [f for rel, funcs in found.items() if rel not in LONG_FUNCTIONS_ALLOWED for f in funcs]
    assert not bad, f"functions over {MAX_FUNCTION_LINES} lines: split them into named steps\n" + "\n".join(bad)
    done = sorted(LONG_FUNCTIONS_ALLOWED - set(found))
    assert not done, f"no function over {MAX_FUNCTION_LINES} lines left in {done}: remove them from LONG_FUNCTIONS_ALLOWED"
