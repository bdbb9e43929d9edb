"""The README's "Measured" table is the bench scripts' own output (issue 18: claims that reproduce).

``bench/readme_table.py`` renders the table from ``bench/results/*.json``, the files the bench
scripts write with ``--json``; README.md must hold exactly that table, so a number typed by hand,
or a result file refreshed without regenerating the README, fails here.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _table_module():
    spec = importlib.util.spec_from_file_location("readme_table", ROOT / "bench" / "readme_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_holds_the_generated_table() -> None:
    table = _table_module()
    readme = (ROOT / "README.md").read_text()
    assert table.START in readme and table.END in readme
    block = readme.split(table.START, 1)[1].split(table.END, 1)[0]
    assert block.strip() == table.render().strip(), (
        "README.md's Measured table differs from bench/results/*.json: run `python bench/readme_table.py --write`")


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
