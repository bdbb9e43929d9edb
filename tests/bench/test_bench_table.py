"""The documentation's benchmarks table is the bench scripts' own output (issue 18: claims that reproduce).

``bench/readme_table.py`` renders the table from ``bench/results/*.json``, the files the bench
scripts write with ``--json``; docs/benchmarks.md must hold exactly that table, so a number typed
by hand, or a result file refreshed without regenerating the page, fails here. The README quotes
a few rows of it as a headline; each quoted row must be a row of the generated table.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench import readme_table

ROOT = Path(__file__).resolve().parents[2]
HEADLINE_START = "<!-- bench-headline:start"
HEADLINE_END = "<!-- bench-headline:end -->"


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
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert readme_table.START in page and readme_table.END in page
    block = page.split(readme_table.START, 1)[1].split(readme_table.END, 1)[0]
    assert block.strip() == readme_table.render().strip(), (
        "docs/benchmarks.md's table differs from bench/results/*.json: run `python -m bench.readme_table --write`"
    )


def test_readme_headline_quotes_rows_of_the_table() -> None:
    readme = (ROOT / "README.md").read_text()
    assert HEADLINE_START in readme and HEADLINE_END in readme
    quoted = _rows(readme.split(HEADLINE_START, 1)[1].split(HEADLINE_END, 1)[0])
    assert quoted, "the README's benchmark headline quotes no row"
    generated = set(_rows(readme_table.render()))
    for row in quoted:
        assert row in generated, f"README quotes {row}, which is not a row of docs/benchmarks.md's table"


def test_every_result_file_has_rows_with_machine_and_range(tmp_path: Path) -> None:
    results = readme_table.load_results()
    assert results, "bench/results/ holds no harness JSON"
    rendered = readme_table.render()
    for stem, result in results:
        env = result["env"]
        assert env["cores"] and env["date_utc"] and env["cpu_model"], stem
        assert f"`{stem}.json`" in rendered
    # A changed result file changes the table: the check above can fail.
    stem, result = results[0]
    rec = (result.get("ratios") or result.get("figures"))[0]
    rec["median"] = (rec["median"] or 0) + 123.0
    (tmp_path / f"{stem}.json").write_text(json.dumps(result))
    assert readme_table.render(tmp_path) not in rendered
