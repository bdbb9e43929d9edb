"""Runs and a browser for the ``datapipe view`` tests.

``build_view_runs`` makes two small real-data runs in this process (no Ray): English web text
(data-juicer excerpts, among them its dedup demo, and Wikipedia articles, some with e-mail
addresses the pii stage replaces), Chinese (OI-wiki), and a file of hostile documents whose name is
hostile too; stages langid, length, quality, pii, exact dedup and license; tokenized and packed. The
second run re-decides the first with a stricter ``length.min_chars`` (``--from``), for /compare.

``chromium()`` finds the distribution's Chromium for Playwright: absent, the browser tests skip with
the reason, or fail when DATAPIPE_REQUIRE_BROWSER=1 (``.ci/run`` sets it, as it installs Chromium).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from tests.support.shared_data import PROJECT_ROOT, shared_path

FLAG = "__pwned"  # what any hostile document sets on window if the page ever ran it
FILLER = (
    " This paragraph is ordinary English prose about the history of the city, its rivers and its bridges. "
    "It was written so that the document is long enough for the filters and reads like a web page. The old "
    "town grew along the river, where the first bridge was built of wood and later of stone. Merchants came "
    "from the coast to sell salt and cloth, and the market square became the heart of the town for centuries. "
    "Today the square is quiet in the morning. In the evening the cafes fill with people from the new quarters."
)
HOSTILE_NAME = "hostile \"'<b>&.jsonl"  # the file's name is in every id of its documents
HOSTILE: list[dict[str, Any]] = [
    {"text": f"<script>window.{FLAG} = 'script'</script>{FILLER}", "url": "https://example.com/script"},
    {"text": f"<img src=x onerror=\"window.{FLAG}='img'\"> an image{FILLER}", "url": f"javascript:window.{FLAG}='url'"},
    {"text": f"<a href=\"javascript:window.{FLAG}='link'\">click me</a>{FILLER}"},
    {"text": f"</textarea></pre></td></tr></table><script>window.{FLAG}='textarea'</script>{FILLER}"},
    {"text": f"\u202eright-to-left override, then \u2067an isolate{FILLER}"},
    {"text": f"<svg onload=\"window.{FLAG}='svg'\"></svg>{{{{ 7*7 }}}}{{% raw %}}{FILLER}"},
    {"text": "one long line " + "x" * 1_000_000},
]


class ViewRuns(NamedTuple):
    run: Path  # the run
    strict: Path  # the same inputs re-decided with length.min_chars 400
    inputs: Path  # the folder of the input files the runs read


def _jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def write_inputs(folder: Path) -> Path:
    """The input files: real data (subsets of ../shared/data files, as they are) and the hostile file."""
    folder.mkdir(parents=True, exist_ok=True)
    for p in sorted(shared_path("en").glob("datajuicer_*.jsonl")):
        shutil.copy(p, folder / p.name)
    wiki = _lines(shared_path("corpus", "en_wikipedia.jsonl"))
    with_mail = [ln for ln in wiki if "@" in ln][:6]
    picked = wiki[:60] + with_mail + wiki[:2]  # the last two repeat the first two: exact duplicates
    (folder / "en_wikipedia_sample.jsonl").write_text("\n".join(picked) + "\n", encoding="utf-8")
    zh = _lines(shared_path("corpus", "zh_oiwiki.jsonl"))[:60]
    (folder / "zh_oiwiki_sample.jsonl").write_text("\n".join(zh) + "\n", encoding="utf-8")
    _jsonl(folder / HOSTILE_NAME, HOSTILE)
    return folder


def config(inputs: Path, output: Path, min_chars: int = 50) -> dict[str, Any]:
    return {
        "name": "view_real",
        "output": str(output),
        "sources": [
            {
                "name": "en",
                "kind": "web",
                "paths": [str(inputs / "datajuicer_*.jsonl"), str(inputs / "en_wikipedia_sample.jsonl")],
            },
            {"name": "zh", "kind": "web", "paths": [str(inputs / "zh_oiwiki_sample.jsonl")]},
            {"name": "hostile", "kind": "web", "paths": [str(inputs / HOSTILE_NAME)]},
        ],
        "stages": [
            {"langid": {"keep": ["zh", "en"], "min_score": 0.5}},
            {"length": {"min_chars": min_chars}},
            {"quality": {"rules": "auto"}},
            {"pii": {}},
            {"dedup": {"exact": True}},
            {"license": {"policy": {"web": {"deny": ["non_commercial"]}}}},
        ],
        "tokenize": {
            "tokenizer": str(PROJECT_ROOT / "tokenizer" / "demo.json"),
            "seq_len": 1024,
            "rows_per_shard": 64,
            "val_fraction": 0.05,
        },
        "mixture": {"en": 0.6, "zh": 0.3, "hostile": 0.1},
    }


def build_view_runs(folder: Path) -> ViewRuns:
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    inputs = write_inputs(folder / "inputs")
    runs = []
    for name, min_chars, reuse in (("run", 50, None), ("strict", 400, folder / "run")):
        pipeline = folder / f"{name}.yaml"
        pipeline.write_text(yaml.safe_dump(config(inputs, folder / name, min_chars), allow_unicode=True), encoding="utf-8")
        run_pipeline(load_pipeline(pipeline), in_process=True, show_progress=False, log=lambda _: None, reuse_from=reuse)
        runs.append(folder / name)
    return ViewRuns(runs[0], runs[1], inputs)


def chromium() -> str:
    """The system's Chromium, or skip (fail under DATAPIPE_REQUIRE_BROWSER=1) saying what is missing."""
    missing = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "the playwright package is not installed (pip install -e '.[test]')"
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if missing is None and path is None:
        missing = "no chromium on PATH (install the distribution's package: apt-get install -y chromium)"
    if missing is not None:
        if os.environ.get("DATAPIPE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"browser tests need a browser: {missing}; DATAPIPE_REQUIRE_BROWSER=1 forbids skipping", pytrace=False)
        pytest.skip(f"browser tests skipped: {missing}")
    assert path is not None
    return path
