"""MkDocs hook: the two tables of the stage index (``docs/stages/index.md``), from the stage registry.

Each built-in stage says in its own module what the index shows of it (``Stage.summary``,
``Stage.signals``, ``Stage.reasons``); the registry (``datapipe.stages.STAGES``) gives the
stages and their order. When MkDocs builds the index, this hook puts the tables where the page
has their markers, so a new stage appears on the next build and nothing generated is committed.
Plugins installed where the site is built are left out: the page documents datapipe.

``tests/docs/test_stage_pages.py`` renders the tables without MkDocs and checks that every built-in
stage has its page, its nav line and its three declarations.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGE = "stages/index.md"
SIGNALS = "<!-- stages:signals -->"  # stage | signals (columns) | drops with reason
PAGES = "<!-- stages:pages -->"  # stage (linked to its page) | what it does


def _stages() -> list[Any]:
    """The built-in stage classes in registry order."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # this checkout's datapipe, not another installed copy
    from datapipe.stages import STAGES

    return [STAGES[name] for name in STAGES.builtin_names()]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def signals_table() -> str:
    rows = ["| stage | signals (columns) | drops with reason |", "|---|---|---|"]
    for stage in _stages():
        reasons = ", ".join(f"`{r}`" for r in stage.reasons) or "none"
        rows.append(f"| `{stage.name}` | {_cell(stage.signals)} | {_cell(reasons)} |")
    return "\n".join(rows)


def pages_table() -> str:
    rows = ["| stage | what it does |", "|---|---|"]
    rows += [f"| [`{s.name}`]({s.name}.md) | {_cell(s.summary)} |" for s in _stages()]
    return "\n".join(rows)


def render(markdown: str) -> str:
    """The index page with its tables in place of their markers."""
    for marker, table in ((SIGNALS, signals_table), (PAGES, pages_table)):
        if marker not in markdown:
            from mkdocs.exceptions import PluginError

            raise PluginError(f"docs/{PAGE} lost its {marker} marker: the generated table has nowhere to go")
        markdown = markdown.replace(marker, table())
    return markdown


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return render(markdown) if page.file.src_uri == PAGE else markdown
