"""A new in-tree stage, added as docs/development.md's "A new stage" says, touches the five files that
section lists and no other (issue 51).

In a copy of the repository, docs/plugins.md's example stage becomes a built-in one: its module, its
test, its page, one line in the stage registry and one nav line. In that copy, with nothing else
edited, the stage runs in a pipeline, its own test passes, the stage index's tables and the
reference list it, and the page checks find nothing missing; without the nav line they name it.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support import plugin_example as ex
from tests.support.shared_data import PROJECT_ROOT

COPIED = ("datapipe", "docs", "filters", "tests", "mkdocs.yml", "pyproject.toml")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".ruff_cache", ".pytest_cache")

TEST = f'''"""The {ex.NAME} stage drops what is shouted and keeps the rest."""

import pyarrow as pa

from datapipe.stages import StageContext
from datapipe.stages.{ex.MODULE} import {ex.CLASS}, ShoutingOptions


def test_shouted_documents_are_dropped() -> None:
    stage = {ex.CLASS}(ShoutingOptions(), StageContext(".", "."))
    batch = stage.compute(pa.table({{"text": ["calm words here", "LOUD WORDS HERE", None]}}))
    assert stage.decide(batch).reason.to_pylist() == [None, "shouting", None]
'''

PAGE = f"""# `{ex.NAME}`: shouted documents

| signals (columns) | drops with reason |
|---|---|
| `upper_frac` | `shouting` |

A document whose letters are more than `max_upper` upper case is dropped as `shouting`.
"""

# In the copy: the stage runs, and what the docs generate and check is asked of the copy's own code.
CHECK = f"""
import json, sys
from pathlib import Path
sys.path.insert(0, ".")
import importlib.util
from datapipe.engine.runner import run_pipeline
from datapipe.pipeline.load import load_pipeline
from datapipe.audit.sql import connect
from datapipe.stages import STAGES
from tests.docs.test_stage_pages import missing_docs

def hook(name):
    spec = importlib.util.spec_from_file_location(name, Path("docs/hooks") / f"{{name}}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

run_pipeline(load_pipeline(Path(sys.argv[1])), output=Path(sys.argv[2]), show_progress=False, log=lambda m: None, in_process=True)
with connect(Path(sys.argv[2])) as con:
    rows = con.execute("select id, status, stage, reason from documents order by id").fetchall()
index = hook("stage_index").render(Path("docs/stages/index.md").read_text())
print(json.dumps({{
    "rows": rows,
    "builtin": STAGES.builtin_names(),
    "index": index,
    "reference": hook("reference").render(),
    "missing": missing_docs(Path("."), STAGES.builtin_names()),
    "file": STAGES["{ex.NAME}"].__module__,
}}))
"""


def _copy(root: Path) -> None:
    for name in COPIED:
        src = PROJECT_ROOT / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=IGNORED)
        else:
            shutil.copy2(src, root / name)


def _add_line(path: Path, after: str, line: str) -> None:
    text = path.read_text(encoding="utf-8")
    anchor = next(a for a in text.splitlines(keepends=True) if a.strip().startswith(after))
    path.write_text(text.replace(anchor, anchor + line + "\n", 1), encoding="utf-8")


def _add_the_stage(root: Path, nav: bool = True) -> None:
    """What docs/development.md's "A new stage" lists, and nothing more."""
    (root / "datapipe" / "stages" / f"{ex.MODULE}.py").write_text(ex.example_code(), encoding="utf-8")
    (root / "tests" / "stages" / f"test_{ex.MODULE}.py").write_text(TEST, encoding="utf-8")
    (root / "docs" / "stages" / f"{ex.NAME}.md").write_text(PAGE, encoding="utf-8")
    _add_line(
        root / "datapipe" / "stages" / "__init__.py",
        '"annotate":',
        f'        "{ex.NAME}": "datapipe.stages.{ex.MODULE}:{ex.CLASS}",',
    )
    if nav:
        _add_line(root / "mkdocs.yml", "- annotate (LLM): stages/annotate.md", f"      - {ex.NAME}: stages/{ex.NAME}.md")


def _changed(root: Path) -> dict[str, list[str]]:
    """Every file of the copy that differs from the repository's: its added and removed lines."""
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        rel = path.relative_to(root)
        if rel.parts[0] == "out" or rel.name == "pipeline.yaml" or rel.name == "docs.jsonl":
            continue  # the run's own files
        before = PROJECT_ROOT / rel
        if before.is_file() and before.read_bytes() == path.read_bytes():
            continue  # unchanged, text or not (the docs' screenshots are PNG)
        old = before.read_text(encoding="utf-8").splitlines() if before.is_file() else []
        new = path.read_text(encoding="utf-8").splitlines()
        if old != new:
            out[rel.as_posix()] = [
                d for d in difflib.unified_diff(old, new, lineterm="", n=0) if d[:1] in "+-" and d[:3] not in ("+++", "---")
            ]
    return out


def _in_copy(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}  # the copy's datapipe, not this checkout's
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=600)


def test_a_new_stage_is_its_module_test_page_and_two_lines(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    _copy(root)
    _add_the_stage(root)

    changed = _changed(root)
    assert sorted(changed) == sorted(
        [
            f"datapipe/stages/{ex.MODULE}.py",
            f"tests/stages/test_{ex.MODULE}.py",
            f"docs/stages/{ex.NAME}.md",
            "datapipe/stages/__init__.py",
            "mkdocs.yml",
        ]
    ), sorted(changed)
    assert len(changed["datapipe/stages/__init__.py"]) == 1 and len(changed["mkdocs.yml"]) == 1  # one added line each

    (root / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in ex.DOCS))
    (root / "pipeline.yaml").write_text(
        json.dumps({"name": "ex", "sources": [{"name": "s", "paths": ["docs.jsonl"]}], "stages": [{ex.NAME: {}}]})
    )
    proc = _in_copy(root, "-c", CHECK, "pipeline.yaml", str(root / "out"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["file"] == f"datapipe.stages.{ex.MODULE}" and got["builtin"][-1] == ex.NAME
    statuses = {row[0]: tuple(row[1:]) for row in got["rows"]}
    assert statuses["s/docs.jsonl#L2"] == ("rejected", ex.NAME, "shouting"), got["rows"]
    assert statuses["s/docs.jsonl#L1"][0] == statuses["s/docs.jsonl#L3"][0] == "kept"
    assert f"| `{ex.NAME}` | `upper_frac` | `shouting` |" in got["index"]
    assert f"| [`{ex.NAME}`]({ex.NAME}.md) | drops shouted documents |" in got["index"]
    assert f"### `{ex.NAME}` {{#stage-{ex.NAME}}}" in got["reference"] and "| `max_upper` |" in got["reference"]
    assert got["missing"] == []

    tested = _in_copy(root, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/stages/test_{ex.MODULE}.py")
    assert tested.returncode == 0 and "1 passed" in tested.stdout, tested.stdout[-2000:] + tested.stderr[-2000:]


def test_without_its_nav_line_the_checks_name_the_line(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    _copy(root)
    _add_the_stage(root, nav=False)
    code = "import sys; sys.path.insert(0, '.')\nfrom pathlib import Path\nfrom datapipe.stages import STAGES\n"
    code += "from tests.docs.test_stage_pages import missing_docs\nprint(missing_docs(Path('.'), STAGES.builtin_names()))"
    proc = _in_copy(root, "-c", code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"add `      - {ex.NAME}: stages/{ex.NAME}.md` under `Stages:` in mkdocs.yml" in proc.stdout
