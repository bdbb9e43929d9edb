"""``datapipe view``'s server without a browser: who may connect (loopback by default, a token on any
other address, the Host header on loopback), that nothing but GET and HEAD is served, the headers
every response carries, a run still going labelled as such, the command line, and the Documents
page's filters against SQL on the real run of tests/support/view_runs.py (the demo run's shape)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse

import pytest

from datapipe.audit.sql import run_query

# two whole (small, in-process) runs for the session, a browser or servers: tens of seconds on 2 cores
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(view_runs):
    return view_runs.run


def serve(folders, host="127.0.0.1"):
    from datapipe.view.launch import make_server
    from datapipe.view.server import serve_in_thread

    server = make_server(list(folders), host=host, port=0)
    serve_in_thread(server)
    return server


def get(server, path, host_header=None, method="GET", headers=None, address=None):
    addr = address or server.server_address[0]
    conn = http.client.HTTPConnection(addr, server.server_address[1], timeout=30)
    hdrs = dict(headers or {})
    if host_header is not None:
        hdrs["Host"] = host_header
    conn.request(method, path, headers=hdrs)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response, body


def other_address() -> str | None:
    """An address of this machine that is not loopback (the one its default route leaves from), if any."""
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(("192.0.2.1", 9))  # no packet is sent: the kernel only picks the source address
        address = s.getsockname()[0]
        s.close()
    except OSError:
        return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_loopback_by_default_and_not_reachable_from_another_address(run):
    server = serve([run])
    try:
        assert server.server_address[0] == "127.0.0.1" and server.token is None
        response, body = get(server, "/")
        assert response.status == 200 and b"Funnel" in body
        other = other_address()
        if other is not None:  # the machine's own other address: nothing listens there
            with pytest.raises(OSError):
                get(server, "/", address=other)
        # a page whose domain name was rebound to 127.0.0.1 sends its own Host: refused
        response, body = get(server, "/", host_header="attacker.example:80")
        assert response.status == 403 and b"Host" in body
    finally:
        server.shutdown()
        server.server_close()


def test_any_other_address_needs_the_printed_token(run):
    host = other_address() or "0.0.0.0"
    server = serve([run], host=host)
    address = host if host != "0.0.0.0" else "127.0.0.1"
    try:
        assert server.token and len(server.token) >= 24 and f"token={server.token}" in server.url
        for path in ("/", "/documents", "/sql?q=select%201", "/static/view.css", "/shards"):
            response, body = get(server, path, address=address)
            assert response.status == 403 and b"token" in body, path
        response, _ = get(server, "/?token=wrong", address=address)
        assert response.status == 403
        response, body = get(server, f"/?token={server.token}", address=address)
        assert response.status == 200 and b"Funnel" in body
        cookie = response.getheader("Set-Cookie")
        assert cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        response, body = get(server, "/documents", address=address, headers={"Cookie": cookie.split(";")[0]})
        assert response.status == 200 and b"Documents" in body
    finally:
        server.shutdown()
        server.server_close()


def test_read_only_and_the_headers_of_every_response(run):
    server = serve([run])
    try:
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            response, _ = get(server, "/sql?q=select%201", method=method)
            assert response.status == 405, method
        for path in ("/", "/documents", "/static/view.js", "/nope"):
            response, _ = get(server, path)
            csp = response.getheader("Content-Security-Policy")
            assert "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp, path
            assert response.getheader("X-Content-Type-Options") == "nosniff"
            assert response.getheader("X-Frame-Options") == "DENY"
        response, _ = get(server, "/nope")
        assert response.status == 404
        # a download asked for and not read (HEAD) frees the query: the next one runs
        response, _ = get(server, "/sql.csv?q=select%201", method="HEAD")
        assert response.status == 200 and response.getheader("Content-Disposition")
        response, body = get(server, "/sql.csv?q=select%2042%20as%20x")
        assert response.status == 200 and body.decode().splitlines() == ["x", "42"], body.decode()
        response, body = get(server, "/sql.csv?q=COPY%20documents%20TO%20%27x.csv%27")
        assert response.status == 400 and b"read-only" in body
    finally:
        server.shutdown()
        server.server_close()


def test_a_run_still_going_is_labelled_as_such(run, tmp_path):
    """A copy of the run whose run.json says running and whose lock record names a live process (this one)."""
    import shutil

    copy = tmp_path / "going"
    shutil.copytree(run, copy)
    record = json.loads((copy / "run.json").read_text())
    record["status"] = "running"
    (copy / "run.json").write_text(json.dumps(record))
    from datapipe.run_folder.lock import process_start

    pid = os.getpid()
    (copy / ".datapipe.lock.json").write_text(
        json.dumps(
            {
                "host": socket.gethostname(),
                "pid": pid,
                "pid_start": process_start(pid),
                "started": "now",
                "command": ["datapipe", "run"],
            }
        )
    )
    server = serve([copy])
    try:
        _, body = get(server, "/")
        assert b"in progress" in body and b"a driver holds the run folder" in body
        (copy / ".datapipe.lock.json").unlink()  # the driver is gone: a stopped run, not a running one
        _, body = get(server, "/")
        assert b"stopped before it finished" in body
    finally:
        server.shutdown()
        server.server_close()


def test_documents_page_filters_match_sql(run):
    """The Documents page's candidate files and row filters give the rows SQL gives."""
    from datapipe.view import listing
    from datapipe.view.runs import RunView

    view = RunView(run)
    index = view.index()
    cases = [
        ({"status": "rejected", "stage": "quality"}, "status = 'rejected' and stage = 'quality'"),
        ({"reason": "too_short"}, "reason = 'too_short'"),
        ({"lang": "zh", "status": "kept"}, "lang = 'zh' and status = 'kept'"),
        ({"lang_score_min": "0.9", "lang_score_max": "0.99"}, "lang_score between 0.9 and 0.99"),
        ({"n_chars_min": "1000", "source": "en"}, "n_chars >= 1000 and source = 'en'"),
        ({"q": "SQL"}, "contains(lower(text), 'sql')"),
    ]
    for params, where in cases:
        f = listing.Filters.from_query(params, set(index.numeric_columns()))
        files = listing.candidate_files(index, f)
        got = listing.scan_page(view, files, f, rows=10_000, seconds=60).rows
        text = "text" in where
        sql = (
            f"select id from documents join (select id, text from kept_docs union all select id, text from rejected_docs) "
            f"using (id) where {where}"
            if text
            else f"select id from documents where {where}"
        )
        want = sorted(r["id"] for r in run_query(run, sql).to_pylist())
        assert sorted(r["id"] for r in got) == want, params
        assert want, params
    # a page starts where the last one stopped: pages of 7 give the rows of one page of all
    f = listing.Filters(status="kept")
    files = listing.candidate_files(index, f)
    whole = [r["id"] for r in listing.scan_page(view, files, f, rows=10_000, seconds=60).rows]
    paged, after = [], (0, 0)
    while True:
        page = listing.scan_page(view, files, f, after=after, rows=7, seconds=60)
        paged += [r["id"] for r in page.rows]
        if page.stopped_at is None:
            break
        after = page.stopped_at
    assert paged == whole
    with pytest.raises(listing.FilterError, match="text_min"):
        listing.Filters.from_query({"text_min": "3"}, set(index.numeric_columns()))
    with pytest.raises(listing.FilterError, match="not a number"):
        listing.Filters.from_query({"n_chars_min": "many"}, set(index.numeric_columns()))


def test_the_overview_is_exact_from_the_aggregate_tables_and_every_count_links_to_its_documents(run):
    """Languages, characters per reason and the distributions come from the run's agg_ tables: each equals
    SQL over documents, and each histogram bar's link (its range) selects exactly the documents it counts."""
    from datapipe.view import listing
    from datapipe.view.aggregates import RunAggregates, TableAggregates
    from datapipe.view.charts import hist_chart
    from datapipe.view.runs import RunView

    view = RunView(run)
    agg = RunAggregates(view)
    assert isinstance(agg.chosen, TableAggregates) and agg.exact
    cells = {(r["source"], r["lang"], r["status"]): (r["documents"], r["chars"], r["tokens"]) for r in agg.source_lang()}
    want = run_query(
        run,
        "select source, lang, status, count(*) as n, coalesce(sum(n_chars), 0) as c, coalesce(sum(n_tokens), 0) as t "
        "from documents group by all",
    ).to_pylist()
    assert cells == {(r["source"], r["lang"], r["status"]): (r["n"], r["c"], r["t"]) for r in want}
    reasons = {(r["position"], r["reason"]): (r["documents"], r["chars"]) for r in agg.reasons()}
    positions = {r["stage"]: r["position"] for r in view.index().stages}
    want = run_query(
        run, "select stage, reason, count(*) as n, sum(n_chars) as c from documents where status = 'rejected' group by all"
    ).to_pylist()
    assert reasons == {(positions[r["stage"]], r["reason"]): (r["n"], r["c"]) for r in want}
    assert agg.distribution_columns() == ["n_chars", "n_tokens", "lang_score"]
    for column, status in (("n_chars", "kept"), ("n_chars", "rejected"), ("n_tokens", "kept"), ("lang_score", None)):
        hist = agg.histogram(column, status)
        assert hist is not None and hist.exact
        ranges: list[tuple[float, float]] = []
        chart = hist_chart(hist, lambda lo, hi, r=ranges: r.append((lo, hi)) or "")
        assert len(chart.bars) == len(hist.counts) == len(ranges)
        where = f"status = '{status}' and " if status else ""
        for (lo, hi), count in zip(ranges, hist.counts):
            # the values as doubles (lang_score is a float32: compared as such, 0.95 would be rounded)
            sql = f"select count(*) as n from documents where {where}{column}::DOUBLE between {lo!r} and {hi!r}"
            assert run_query(run, sql).to_pylist()[0]["n"] == count, (column, status, lo, hi)
            # and the Documents page the bar links to lists them
            params = {"status": status or "", f"{column}_min": repr(lo), f"{column}_max": repr(hi)}
            f = listing.Filters.from_query(params, set(view.index().numeric_columns()))
            page = listing.scan_page(view, listing.candidate_files(view.index(), f), f, rows=10_000, seconds=60)
            assert len(page.rows) == count, (column, status, lo, hi)
        total = run_query(run, f"select count({column}) as n from documents where {where}true").to_pylist()[0]["n"]
        assert sum(hist.counts) == hist.total == total, column
    server = serve([run])
    try:
        _, body = get(server, "/")
        assert b"exact, from the counts every task kept" in body and "≈".encode() not in body
    finally:
        server.shutdown()
        server.server_close()


def test_a_run_folder_without_aggregate_tables_has_the_overview_from_a_sample_and_says_so(run, tmp_path):
    """A database of a datapipe before the tasks counted their documents (its agg_ tables dropped here):
    the Overview reads the run's files instead, and says where its numbers come from."""
    import shutil

    import duckdb

    copy = tmp_path / "older"
    shutil.copytree(run, copy)
    with duckdb.connect(str(copy / "stats.duckdb")) as con:
        for (name,) in con.execute("select table_name from duckdb_tables() where table_name like 'agg%'").fetchall():
            con.execute(f'drop table "{name}" cascade')
    from datapipe.view.aggregates import RunAggregates, SampledAggregates
    from datapipe.view.runs import RunView

    agg = RunAggregates(RunView(copy))
    assert isinstance(agg.chosen, SampledAggregates)
    assert "no aggregate tables" in agg.description
    server = serve([copy])
    try:
        response, body = get(server, "/")
        assert response.status == 200 and b"no aggregate tables" in body and b"Funnel" in body
    finally:
        server.shutdown()
        server.server_close()


def test_the_command_prints_its_url_serves_and_stops_on_ctrl_c(run):
    """`datapipe view RUN --no-browser --port 0` in a subprocess: the URL it prints answers; SIGINT stops it."""
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "datapipe.cli", "view", str(run), "--no-browser", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if "open http://" in line:
                url = line.split("open ", 1)[1].strip()
        assert url is not None, proc.stderr.read()
        parts = urllib.parse.urlsplit(url)
        assert parts.hostname == "127.0.0.1"
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        conn.request("GET", "/")
        assert conn.getresponse().status == 200
        conn.close()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_folder_that_is_not_a_run_is_refused(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "datapipe.cli", "view", str(tmp_path), "--no-browser"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "no run.json" in done.stderr and "Traceback" not in done.stderr


def test_the_templates_escape_what_they_are_given():
    """Autoescaping is on for every template (also ones a later change adds)."""
    from datapipe.view.pages import _env

    env = _env()
    assert env.autoescape is True or env.autoescape("x.html")
    assert env.from_string("{{ x }}").render(x="<script>") == "&lt;script&gt;"


def test_a_documents_signals_are_grouped_for_reading():
    """License with its evidence, classifier scores and buckets, an annotate stage's answers before their
    provenance (model, endpoint, prompt hash, tokens), the edits, then every other signal."""
    from datapipe.view.document import _groups

    row = {
        "id": "web/a.jsonl#L1",
        "status": "kept",
        "text": "x",
        "license": "CC-BY-4.0",
        "license_class": "permissive",
        "license_evidence": "rel=license link",
        "cls_quality_hq": 0.91,
        "bucket_quality": 18,
        "llm_topic": "math",
        "llm_model": "tiny",
        "llm_prompt_sha256": "ab12",
        "llm_prompt_tokens": 31,
        "pii_email": 1,
        "gopher_words": 120,
        "dup_of": None,
    }
    run = {"config": {"stages": [{"annotate": {"prefix": "llm", "model": "tiny"}}]}}
    groups = {g.title: g for g in _groups(row, run)}
    assert [k for k, _ in groups["License"].items] == ["license", "license_class", "license_evidence"]
    assert [k for k, _ in groups["Classifier scores and buckets"].items] == ["bucket_quality", "cls_quality_hq"]
    annotation = groups["Annotation (stage 1, llm_*)"]
    assert [k for k, _ in annotation.items] == ["llm_topic", "llm_model", "llm_prompt_sha256", "llm_prompt_tokens"]
    assert "tiny" in annotation.note
    assert [k for k, _ in groups["Edits (pii)"].items] == ["pii_email"]
    assert [k for k, _ in groups["Signals"].items] == ["gopher_words"]
    assert "Duplicates" not in groups  # nothing to show: dup_of is null


def test_a_damaged_documents_file_is_named_not_shown(run, tmp_path):
    """One bit flipped in a data page of a kept documents file (size kept): the document's page says
    the file is damaged, names it and points at `datapipe run`, and shows no text from it (before: an
    internal error, or the page rendered whatever the flipped page decoded to)."""
    import shutil

    import pyarrow.parquet as pq

    from tests.support.damage import flip_data_page

    copy = tmp_path / "damaged"
    shutil.copytree(run, copy)
    victim = sorted((copy / "docs").glob("*/*.parquet"))[0]
    doc_id = pq.read_table(victim, columns=["id"])["id"][0].as_py()
    flip_data_page(victim)
    server = serve([copy])
    try:
        response, body = get(server, "/documents/" + urllib.parse.quote(doc_id, safe=""))
    finally:
        server.shutdown()
        server.server_close()
    page = body.decode("utf-8")
    assert response.status == 400, page
    rel = victim.relative_to(copy).as_posix()
    assert f"{copy.resolve()}/{rel} is damaged" in page and "`datapipe run` command again" in page, page
