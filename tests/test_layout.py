"""The file layout of ``datapipe/``: a folder per concept, few loose modules, no stdlib names.

A module named like a standard-library one (``tokenize``, ``code``, ``html``, ``types``...) shadows it
for any script run from its folder and confuses readers and tools about which one an import means.
"""

from __future__ import annotations

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
