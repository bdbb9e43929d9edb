"""Every built-in stage is documented where a reader looks, and says so in its own module.

The stage index's tables are generated from the registry (``docs/hooks/stage_index.py``); what no
generator can write is the stage's own page and its line in the site's navigation. These tests
name the file or line a new stage lacks, instead of leaving it to a strict docs build's warning.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import yaml

from datapipe.stages import STAGES

ROOT = Path(__file__).resolve().parents[2]


def _hook():
    name = "datapipe_docs_stage_index_hook"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "hooks" / "stage_index.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _nav_pages(nav: object) -> set[str]:
    """Every page path the nav names, at any depth."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(_nav_pages(item) for item in nav))
    if isinstance(nav, dict):
        return set().union(*(_nav_pages(value) for value in nav.values()))
    return set()


def missing_docs(root: Path, names: list[str]) -> list[str]:
    """What a stage lacks, as instructions: its page, its nav line, its declarations."""
    config = yaml.safe_load((root / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = _nav_pages(config["nav"])
    problems = []
    for name in names:
        page = root / "docs" / "stages" / f"{name}.md"
        if not page.is_file():
            problems.append(f"stage {name!r} has no page: write docs/stages/{name}.md")
        if f"stages/{name}.md" not in nav:
            problems.append(
                f"stage {name!r} is not in the site's navigation: add `      - {name}: stages/{name}.md` under `Stages:` in mkdocs.yml"
            )
        cls = STAGES[name]
        for attr in ("summary", "signals"):
            if not getattr(cls, attr).strip():
                problems.append(
                    f'stage {name!r} declares no {attr}: set `{attr} = "..."` on {cls.__qualname__} (the stage index shows it)'
                )
        text = page.read_text(encoding="utf-8") if page.is_file() else ""
        for reason in cls.reasons:
            if f"`{reason}`" not in text:
                problems.append(f"stage {name!r} drops with `{reason}`, which docs/stages/{name}.md does not mention")
    return problems


def test_every_builtin_stage_has_its_page_nav_line_and_declarations() -> None:
    problems = missing_docs(ROOT, STAGES.builtin_names())
    assert not problems, "\n".join(problems)


def test_a_stage_without_page_or_nav_line_is_named_with_the_line_to_add(tmp_path: Path) -> None:
    (tmp_path / "docs" / "stages").mkdir(parents=True)
    (tmp_path / "mkdocs.yml").write_text("nav:\n  - Stages:\n      - stages/index.md\n")
    problems = missing_docs(tmp_path, ["length"])
    assert "stage 'length' has no page: write docs/stages/length.md" in problems
    assert "add `      - length: stages/length.md` under `Stages:` in mkdocs.yml" in problems[1]
    (tmp_path / "docs" / "stages" / "length.md").write_text("# length\n\nDrops `too_short`.\n")
    (tmp_path / "mkdocs.yml").write_text("nav:\n  - Stages:\n      - length: stages/length.md\n")
    assert missing_docs(tmp_path, ["length"]) == [
        "stage 'length' drops with `too_long`, which docs/stages/length.md does not mention"
    ]


def test_the_index_tables_list_every_builtin_stage_in_registry_order() -> None:
    hook = _hook()
    page = hook.render((ROOT / "docs" / "stages" / "index.md").read_text(encoding="utf-8"))
    names = STAGES.builtin_names()
    signals = re.findall(r"^\| `([a-z_]+)` \|", page, flags=re.M)
    linked = re.findall(r"^\| \[`([a-z_]+)`\]\(\1\.md\) \|", page, flags=re.M)
    assert signals == names and linked == names
    length = STAGES["length"]
    assert f"| `length` | {length.signals} | `too_short`, `too_long` |" in page
    assert f"| [`length`](length.md) | {length.summary} |" in page
    assert "| `pii` |" in page and page.split("| `pii` |", 1)[1].split("\n", 1)[0].endswith("| none |")


def test_a_page_without_its_marker_fails_the_build() -> None:
    pytest.importorskip("mkdocs")
    from mkdocs.exceptions import PluginError

    with pytest.raises(PluginError, match="lost its <!-- stages:pages --> marker"):
        _hook().render("# Stages\n\n<!-- stages:signals -->\n")
