"""The documentation's benchmarks table is the bench scripts' own output (issue 18: claims that reproduce).

``bench/readme_table.py`` renders the table from ``bench/results/*.json``, the files the bench
scripts write with ``--json``; docs/benchmarks.md must hold exactly that table, so a number typed
by hand, or a result file refreshed without regenerating the page, fails here. The README quotes
a few rows of it as a headline; each quoted row must be a row of the generated table.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADLINE_START = "<!-- bench-headline:start"
HEADLINE_END = "<!-- bench-headline:end -->"


def _table_module():
    spec = importlib.util.spec_from_file_location("readme_table", ROOT / "bench" / "readme_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(markdown: str) -> list[tuple[str, str, str]]:
    """(file, measured, median [range]) of each row of a table whose first three columns are those;
    a row with an empty file cell belongs to the file named above it, as in the generated table."""
    out, current = [], ""
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or set(cells[0]) <= {"-"} or cells[1] == "measured":
            continue
        current = cells[0] or current
        out.append((current, cells[1], cells[2]))
    return out


def test_benchmarks_page_holds_the_generated_table() -> None:
    table = _table_module()
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert table.START in page and table.END in page
    block = page.split(table.START, 1)[1].split(table.END, 1)[0]
    assert block.strip() == table.render().strip(), (
        "docs/benchmarks.md's table differs from bench/results/*.json: run `python bench/readme_table.py --write`"
    )


def test_readme_headline_quotes_rows_of_the_table() -> None:
    readme = (ROOT / "README.md").read_text()
    assert HEADLINE_START in readme and HEADLINE_END in readme
    quoted = _rows(readme.split(HEADLINE_START, 1)[1].split(HEADLINE_END, 1)[0])
    assert quoted, "the README's benchmark headline quotes no row"
    generated = set(_rows(_table_module().render()))
    for row in quoted:
        assert row in generated, f"README quotes {row}, which is not a row of docs/benchmarks.md's table"


def test_every_result_file_has_rows_with_machine_and_range(tmp_path: Path) -> None:
    table = _table_module()
    results = table.load_results()
    assert results, "bench/results/ holds no harness JSON"
    rendered = table.render()
    for stem, result in results:
        env = result["env"]
        assert env["cores"] and env["date_utc"] and env["cpu_model"], stem
        assert f"`{stem}.json`" in rendered
    # A changed result file changes the table: the check above can fail.
    stem, result = results[0]
    rec = (result.get("ratios") or result.get("figures"))[0]
    rec["median"] = (rec["median"] or 0) + 123.0
    (tmp_path / f"{stem}.json").write_text(json.dumps(result))
    assert table.render(tmp_path) not in rendered
