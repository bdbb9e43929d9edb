"""`datapipe report RUN --html FILE`: one self-contained page with the run's numbers."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

from click.testing import CliRunner

from datapipe.audit.report import Series, hbar_chart, histogram
from datapipe.audit.sql import connect as connect_stats
from datapipe.cli import main
from tests.conftest import DemoRun


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.cells: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        if data.strip():
            self.cells.append(data.strip())


def test_report_is_self_contained_and_holds_the_numbers(demo_run: DemoRun, tmp_path: Path) -> None:
    out = demo_run.out
    page_file = tmp_path / "report" / "run.html"
    result = CliRunner().invoke(main, ["report", str(out), "--html", str(page_file)])
    assert result.exit_code == 0, result.output
    page = page_file.read_text(encoding="utf-8")
    # Nothing to fetch: no URLs, no scripts, no external resources of any kind.
    assert "http" not in page and "src=" not in page and "<script" not in page and "@import" not in page
    parser = Tags()
    parser.feed(page)
    assert not [a for t, a in parser.tags if t == "link"]
    assert sum(1 for t, _ in parser.tags if t == "svg") == 5  # funnel, mixture, two length histograms, languages
    cells = set(parser.cells)

    con = connect_stats(out)
    total, kept, tokens = con.execute(
        "SELECT count(*), count(*) FILTER (status='kept'), sum(n_tokens) FILTER (status='kept') FROM documents"
    ).fetchone()
    assert {f"{total:,}", f"{kept:,}", f"{tokens:,}"} <= cells
    for _, stage, reason, dropped in con.execute(
        "SELECT position, stage, reason, dropped FROM funnel WHERE dropped > 0"
    ).fetchall():
        assert {stage, reason, f"{dropped:,}"} <= cells
    for source, t in con.execute("SELECT source, sum(tokens) FROM mixture GROUP BY source").fetchall():
        assert {source, f"{t:,}"} <= cells
    for lang, n in con.execute("SELECT lang, count(*) FROM documents WHERE status='kept' GROUP BY lang").fetchall():
        assert lang in cells and f"{n:,}" in cells
    train_rows = con.execute("SELECT sum(rows) FROM shards WHERE source='web_en' AND split='train'").fetchone()[0]
    con.close()
    assert re.search(rf"<td>web_en</td><td>train</td><td class=\"n\">\d+</td><td class=\"n\">{train_rows:,}</td>", page)


def test_bar_lengths_follow_the_values() -> None:
    svg = hbar_chart([("a", [30.0, 10.0]), ("b", [10.0, 0.0])], [Series("x", "#000"), Series("y", "#f00")])
    widths = [float(w) for w in re.findall(r'<rect x="[0-9.]+" y="\d+" width="([0-9.]+)" height="16"', svg)]
    assert widths == [390.0, 130.0, 130.0]  # 520 px for the longest bar (40); 30 -> 390, 10 -> 130
    hist = histogram([(1, 10), (10, 100)], [5.0, 10.0], "n", "#000")
    heights = [float(h) for h in re.findall(r'height="([0-9.]+)" fill="#000"', hist)]
    assert heights == [90.0, 180.0]
