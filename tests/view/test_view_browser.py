"""``datapipe view`` in a real browser: Playwright driving the distribution's Chromium over two small
real-data runs (tests/support/view_runs.py), the second a re-decide of the first with a stricter
length threshold.

Every page loads without a console error (a Content-Security-Policy violation is one); filters in the
URL change the list; a rejected document shows its stage, reason, value and threshold; a pii edit's
diff shows the text before and after; a duplicate links to its survivor and back; a decoded shard row
is the loader's; the SQL page refuses COPY and a file read; hostile documents run no script.

With DATAPIPE_VIEW_SCREENSHOTS=<folder>, the screenshots of docs/view.md are written there
(``DATAPIPE_VIEW_SCREENSHOTS=docs/images/view python -m pytest tests/view/test_view_browser.py``).
"""

from __future__ import annotations

import os
import re
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

from datapipe.audit.sql import run_query
from tests.support.view_runs import FLAG, HOSTILE, HOSTILE_NAME, chromium

SCREENSHOTS = os.environ.get("DATAPIPE_VIEW_SCREENSHOTS")

# two whole (small, in-process) runs for the session, a browser or servers: tens of seconds on 2 cores
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(view_runs):
    return view_runs


@pytest.fixture(scope="module")
def base(runs):
    from datapipe.view.launch import make_server
    from datapipe.view.server import serve_in_thread

    server = make_server([runs.run, runs.strict], port=0)
    serve_in_thread(server)
    yield server.url.rstrip("/")
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    path = chromium()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, chromium_sandbox=False, args=["--disable-gpu"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 860}, accept_downloads=True)
    pg = context.new_page()
    pg.errors = []  # console errors (a CSP violation is one) and uncaught exceptions
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("dialog", lambda d: (pg.errors.append(f"dialog: {d.message}"), d.dismiss()))
    yield pg
    context.close()


def doc_url(base: str, doc_id: str, **params: str) -> str:
    query = ("?" + urllib.parse.urlencode(params)) if params else ""
    return f"{base}/documents/{urllib.parse.quote(doc_id, safe='/')}{query}"


def visit(page, url: str, shot: str | None = None, part: str | None = None):
    response = page.goto(url)
    assert response is not None and response.status == 200, f"{url}: {response and response.status}"
    page.wait_for_load_state("load")
    assert page.evaluate(f"typeof window.{FLAG}") == "undefined", f"{url} ran a document's script"
    assert not page.errors, f"{url}: {page.errors}"
    if SCREENSHOTS and shot:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        where = str(Path(SCREENSHOTS) / f"{shot}.png")
        page.locator(part).screenshot(path=where) if part else page.screenshot(path=where)
    return response


def one(run: Path, sql: str):
    rows = run_query(run, sql).to_pylist()
    assert rows, sql
    return rows[0]


def test_every_page_loads(runs, base, page):
    kept = one(runs.run, "select id from documents where status = 'kept' order by id limit 1")["id"]
    shard = one(runs.run, "select path from shards where split = 'train' order by path limit 1")["path"]
    pages = {
        "overview": ("/", "Funnel"),
        "documents": ("/documents?status=kept&hist=n_chars", "Documents"),
        "document": (doc_url("", kept), "Why it was kept"),
        "sql": ("/sql?" + urllib.parse.urlencode({"q": "select stage, reason, dropped from funnel"}), "SQL"),
        "shards": ("/shards", "Shards"),
        "shard-row": ("/shards?" + urllib.parse.urlencode({"path": shard, "row": 1}), "Row 1"),
        "compare": ("/compare", "Compare runs"),
        "overview-b": ("/?run=b", "Funnel"),
    }
    for shot, (path, text) in pages.items():
        visit(page, base + path, shot=shot if shot != "overview-b" else None)
        assert text in page.inner_text("main"), f"{path}: no {text!r}"
    assert page.get_by_text("complete", exact=True).count() >= 1  # the run's state is shown


def test_filters_in_the_url_change_the_list(runs, base, page):
    def listed(query: dict[str, str]) -> list[dict[str, str]]:
        visit(page, f"{base}/documents?{urllib.parse.urlencode(query)}")
        rows = page.locator("table.docs tbody tr")
        out = []
        for i in range(rows.count()):
            cells = rows.nth(i).locator("td")
            if cells.count() < 8:
                continue
            out.append(
                {
                    "id": cells.nth(0).inner_text(),
                    "status": cells.nth(1).inner_text(),
                    "stage": cells.nth(2).inner_text(),
                    "lang": cells.nth(3).inner_text(),
                    "n_chars": cells.nth(4).inner_text(),
                }
            )
        return out

    everything = listed({})
    rejected = listed({"status": "rejected", "stage": "quality"})
    assert rejected and rejected != everything[: len(rejected)]
    assert all(r["status"] == "rejected" and r["stage"].startswith("quality") for r in rejected)
    expected = run_query(runs.run, "select count(*) as n from documents where stage = 'quality'").to_pylist()[0]["n"]
    assert len(rejected) == min(expected, 50)
    zh = listed({"status": "kept", "source": "zh"})
    assert zh and all(r["id"].startswith("zh/") and r["status"] == "kept" for r in zh)
    long = listed({"status": "kept", "n_chars_min": "3000", "n_chars_max": "6000"})
    ids = {r["id"] for r in long}
    want = {
        r["id"]
        for r in run_query(
            runs.run, "select id from documents where status = 'kept' and n_chars between 3000 and 6000"
        ).to_pylist()
    }
    assert ids == want or (len(ids) == 50 and ids <= want)
    assert all(3000 <= int(r["n_chars"].replace(",", "")) <= 6000 for r in long)
    # the histogram of the chosen signal, with the run's thresholds on it (length.min_chars, max_chars)
    visit(page, f"{base}/documents?hist=n_chars")
    labels = page.locator("svg.histogram line.threshold title").all_text_contents()
    assert "length.min_chars >= 50" in labels
    # its bars link to their range, and dragging across it selects one
    visit(page, f"{base}/documents?status=kept&hist=n_chars")
    svg = page.locator("svg.histogram")
    box = svg.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.5)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.5, steps=5)
    with page.expect_navigation():
        page.mouse.up()
    query = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)
    lo, hi = float(query["n_chars_min"][0]), float(query["n_chars_max"][0])
    assert lo < hi and query["status"] == ["kept"]
    values = [int(c.replace(",", "")) for c in page.locator("table.docs tbody td:nth-child(5)").all_inner_texts() if c]
    assert values and all(lo <= v <= hi for v in values)


def test_a_rejected_documents_page_shows_stage_reason_value_and_threshold(runs, base, page):
    from datapipe.audit.explain import document_row, recorded_run
    from datapipe.stages.quality.explain import rule_checks

    row = one(runs.run, "select id from documents where stage = 'quality' and reason like 'gopher_quality:%' order by id limit 1")
    full = document_row(runs.run, row["id"])
    failed = [c for c in rule_checks(full, recorded_run(runs.run))[0] if c.failed and f"{c.filter}:{c.rule}" == full["reason"]]
    assert failed
    visit(page, doc_url(base, row["id"]), shot="document-rejected")
    assert page.inner_text("#status") == "rejected"
    assert page.inner_text("#stage").startswith("quality")
    assert page.inner_text("#reason") == full["reason"]
    fail = page.locator("table.rules tr.fail", has_text=full["reason"])
    assert fail.count() == 1
    value, threshold = fail.locator("td.value").inner_text(), fail.locator("td.threshold").inner_text()
    assert float(value.replace(",", "")) == pytest.approx(float(failed[0].value), rel=1e-3)
    assert threshold.split()[-1].replace(",", "") == f"{failed[0].threshold:g}"
    # a length reject: its detail holds the value, the stage's recorded options the threshold
    short = one(
        runs.strict, "select id, detail from documents where stage = 'length' and reason = 'too_short' order by id limit 1"
    )
    visit(page, doc_url(base, short["id"], run="b"))
    assert page.inner_text("#detail") == short["detail"]
    assert "min_chars=400" in page.inner_text("section.decision")


def test_a_pii_edits_diff_shows_both_texts(runs, base, page):
    row = one(runs.run, "select id from documents where pii_email > 0 and source = 'en' order by id limit 1")
    visit(page, doc_url(base, row["id"]), shot="document-edits", part="section.edits")
    before = " ".join(page.locator(".diff .dl.del").all_inner_texts())
    after = " ".join(page.locator(".diff .dl.add").all_inner_texts())
    emails = re.findall(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+", before)
    assert emails, before
    assert "<EMAIL>" in after and not any(e in after for e in emails)
    line = int(row["id"].rsplit("#L", 1)[1])
    original = (runs.inputs / "en_wikipedia_sample.jsonl").read_text(encoding="utf-8").splitlines()[line - 1]
    assert all(e in original for e in emails)  # the "before" is the input as it was read


def test_a_duplicate_links_to_its_survivor_and_back(runs, base, page):
    row = one(runs.run, "select id, dup_of from documents where reason = 'exact_duplicate' order by id limit 1")
    visit(page, doc_url(base, row["id"]))
    link = page.locator("a.survivor")
    assert link.inner_text() == row["dup_of"]
    with page.expect_navigation():
        link.click()
    assert page.inner_text("#status") == "kept"
    assert row["id"] in page.locator("ul.copies").inner_text()
    back = page.locator("ul.copies a", has_text=row["id"])
    with page.expect_navigation():
        back.click()
    assert page.inner_text("#reason") == "exact_duplicate"


def test_a_decoded_shard_row_is_what_the_loader_yields(runs, base, page):
    from tokenizers import Tokenizer

    from datapipe.loader import PackedDataset
    from tests.support.shared_data import PROJECT_ROOT

    ds = PackedDataset(str(runs.run), split="train", batch_size=1, backend="numpy", verify="open")
    tokenizer = Tokenizer.from_file(str(PROJECT_ROOT / "tokenizer" / "demo.json"))
    # rows to open: the first, middle and last of a middle shard, and the first row anywhere that holds a
    # whole document (most documents here are longer than a row)
    i = len(ds.manifest.paths) // 2
    picks = {(i, r) for r in (0, int(ds.manifest.rows[i]) // 2, int(ds.manifest.rows[i]) - 1)}
    whole = next(
        (s, r)
        for s in range(len(ds.manifest.paths))
        for r in range(int(ds.manifest.rows[s]))
        if _whole_document(ds.read(np.asarray([s]), np.asarray([r])), ds.table.shard(s), r)
    )
    checked_documents = 0
    for s, row in sorted(picks | {whole}):
        path = ds.manifest.paths[s]
        visit(
            page,
            f"{base}/shards?{urllib.parse.urlencode({'path': path, 'row': row})}",
            shot="shard-row" if (s, row) == whole else None,
        )
        want = ds.read(np.asarray([s]), np.asarray([row]))
        shown = [int(x) for x in page.text_content("#input_ids").split()]
        assert shown == want["input_ids"][0].tolist()
        n = int(want["num_segments"][0])
        assert [int(x) for x in page.inner_text("#cu_seqlens").split()] == want["cu_seqlens"][0][: n + 1].tolist()
        segments = page.locator("tr.seg")
        assert segments.count() == n
        n_tokens = int(ds.table.shard(s).n_tokens[row])
        for k in range(n):
            seg = segments.nth(k)
            a, b = int(seg.get_attribute("data-start")), int(seg.get_attribute("data-end"))
            ids = want["input_ids"][0][a:b].tolist()
            assert [int(x) for x in seg.locator("code.ids").text_content().split()] == ids
            assert seg.locator("pre.segtext").inner_text() == tokenizer.decode(ids, skip_special_tokens=False)
            ref = seg.locator("a.docref")
            if "document" in (seg.get_attribute("class") or "") and b < n_tokens:
                doc_id = ref.inner_text()  # a whole document inside the row: its tokens are the document's
                text = run_query(runs.run, f"select text from kept_docs where id = '{doc_id}'").to_pylist()[0]["text"]
                assert ids == tokenizer.encode(text).ids + [ds.table.shard(s).meta.eos_id]
                checked_documents += 1
    assert checked_documents >= 1


def _whole_document(batch: dict, shard, row: int) -> bool:
    """Whether a row holds a document from its start to its end (one that starts and is followed by another)."""
    starts = shard.doc_values[shard.doc_offsets[row] : shard.doc_offsets[row + 1]]
    return len(starts) >= 2


def test_the_sql_page_refuses_copy_and_file_reads(runs, base, page, tmp_path):
    target = tmp_path / "out.csv"
    for query, says in (
        (f"COPY (select * from documents) TO '{target}'", "read-only"),
        ("select * from read_text('/etc/passwd')", "refused"),
        (f"select * from read_csv('{runs.inputs / 'zh_oiwiki_sample.jsonl'}')", "refused"),
        ("ATTACH '/tmp/x.duckdb' AS x", "read-only"),
    ):
        visit(page, f"{base}/sql?{urllib.parse.urlencode({'q': query})}")
        assert says in page.inner_text("#sql-error"), query
    assert not target.exists()
    counts = "select source, count(*) as n from documents group by source order by source"
    visit(page, f"{base}/sql?" + urllib.parse.urlencode({"q": counts}), shot="sql")
    assert page.locator("#result tbody tr").count() == 3
    with page.expect_download() as download:
        page.click("#csv")
    lines = Path(download.value.path()).read_text(encoding="utf-8").splitlines()
    assert lines[0] == "source,n" and [ln.split(",")[0] for ln in lines[1:]] == ["en", "hostile", "zh"]


def test_hostile_documents_run_no_script_and_do_not_break_the_page(runs, base, page):
    rows = run_query(runs.run, "select id, status from documents where source = 'hostile' order by id").to_pylist()
    assert len(rows) == len(HOSTILE) and all(HOSTILE_NAME in r["id"] for r in rows)
    visit(page, f"{base}/documents?source=hostile")
    assert page.locator("table.docs tbody tr").count() == len(HOSTILE)
    texts = (
        "select id, text, url from documents join (select id, text from rejected_docs union all "
        "select id, text from kept_docs) using (id) where source = 'hostile'"
    )
    visit(page, f"{base}/sql?" + urllib.parse.urlencode({"q": texts}))
    assert page.locator("#result tbody tr").count() == len(HOSTILE)
    for r in rows:
        visit(page, doc_url(base, r["id"]))
        line = int(r["id"].rsplit("#L", 1)[1])
        text = HOSTILE[line - 1]["text"]
        shown = page.locator("#doctext").inner_text()
        assert shown == text[: len(shown)] and len(shown) == min(len(text), 300_000)  # as text, tags and all
        assert page.locator("h1.docid").inner_text().endswith(r["id"])  # the hostile file name, as text
        assert page.locator("a[href^='javascript:']").count() == 0
        assert page.evaluate("getComputedStyle(document.getElementById('doctext')).unicodeBidi") == "isolate"
        # the page around the text is intact: nothing wider than the window, the sections after the text there
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
        assert page.locator("section.group h2").count() >= 1
    long = next(r for r in rows if HOSTILE[int(r["id"].rsplit("#L", 1)[1]) - 1]["text"].startswith("one long line"))
    visit(page, doc_url(base, long["id"]))
    link = page.get_by_role("link", name="the whole text")
    response = page.request.get(base + link.get_attribute("href"))
    assert response.headers["content-type"].startswith("text/plain") and "sandbox" in response.headers["content-security-policy"]
    assert len(response.text()) == len(HOSTILE[-1]["text"])


def test_hostile_documents_in_the_shards_decode_to_text(runs, base, page):
    """The kept hostile documents are in the token shards: the rows holding them show their markup as text."""
    from tokenizers import Tokenizer

    from datapipe.loader import PackedDataset
    from tests.support.shared_data import PROJECT_ROOT

    tokenizer = Tokenizer.from_file(str(PROJECT_ROOT / "tokenizer" / "demo.json"))
    ds = PackedDataset(str(runs.run), split="train", batch_size=1, backend="numpy", verify="open")
    rows = [
        (ds.manifest.paths[s], r)
        for s in range(len(ds.manifest.paths))
        if ds.manifest.sources[s] == "hostile"
        for r in range(int(ds.manifest.rows[s]))
        if FLAG in tokenizer.decode(ds.read(np.asarray([s]), np.asarray([r]))["input_ids"][0].tolist())
    ]
    assert rows
    for path, row in rows:
        visit(page, f"{base}/shards?{urllib.parse.urlencode({'path': path, 'row': row})}")
        assert FLAG in " ".join(page.locator("pre.segtext").all_inner_texts())
        assert any(HOSTILE_NAME in t for t in page.locator("a.docref").all_inner_texts())


def test_compare_groups_the_documents_decided_otherwise(runs, base, page):
    visit(page, f"{base}/compare", shot="compare")
    a = {r["id"]: r for r in run_query(runs.run, "select id, status, stage, reason from documents").to_pylist()}
    b = {r["id"]: r for r in run_query(runs.strict, "select id, status, stage, reason from documents").to_pylist()}
    changed = [i for i in a if (a[i]["status"], a[i]["stage"], a[i]["reason"]) != (b[i]["status"], b[i]["stage"], b[i]["reason"])]
    assert changed
    table = page.locator("#changes tbody")
    group = table.locator("tr", has_text="too_short")
    assert group.count() >= 1
    shown = sum(int(t.replace(",", "")) for t in table.locator("td.n").all_inner_texts())
    assert shown == len(changed)
    example = group.first.locator("a").first.inner_text()
    assert example in changed
