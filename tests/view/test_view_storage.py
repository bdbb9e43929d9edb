"""``datapipe view`` on a run folder in object storage: the small real run copied to a loopback S3
server (moto), opened by its URI as the command opens it (run.json, stats.duckdb and the manifest
fetched to a mirror; the documents and shards read from the store in place)."""

from __future__ import annotations

import http.client
import urllib.parse

import pytest

from datapipe.audit.sql import run_query
from tests.support.counting_s3 import serve_for_test

pytestmark = pytest.mark.slow

pytest.importorskip("moto.server", reason="needs moto[server] (the test extras)")
boto3 = pytest.importorskip("boto3")
BUCKET = "datapipe-view"


@pytest.fixture(scope="module")
def s3_run(view_runs, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:  # module-scoped: its own patch of the AWS settings, undone after
        server = serve_for_test(mp, tmp_path_factory.mktemp("cache"), BUCKET)
        try:
            client = boto3.client("s3")
            root = view_runs.run
            for path in sorted(root.rglob("*")):
                rel = path.relative_to(root).as_posix()
                if path.is_file() and not rel.startswith(("_work/", ".datapipe.lock")):
                    client.upload_file(str(path), BUCKET, f"runs/view/{rel}")
            yield f"s3://{BUCKET}/runs/view", root
        finally:
            server.stop()


def test_a_run_folder_in_object_storage_is_read_in_place(s3_run):
    from datapipe.storage.uri import local_run_dir
    from datapipe.view.launch import make_server
    from datapipe.view.server import serve_in_thread

    uri, local = s3_run
    mirror = local_run_dir(uri)
    assert not (mirror / "docs").exists()  # the documents stay in the store
    server = make_server([mirror], port=0)
    serve_in_thread(server)

    def get(path: str) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=60)
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read().decode("utf-8")
        conn.close()
        assert response.status == 200, (path, body[:2000])
        return body

    try:
        overview = get("/")
        assert uri in overview and "complete" in overview
        kept = run_query(local, "select id, text from kept_docs where source = 'en' order by id limit 1").to_pylist()[0]
        listed = get("/documents?status=kept&source=en")
        assert kept["id"].replace('"', "&#34;").replace("'", "&#39;") in listed
        page = get("/documents/" + urllib.parse.quote(kept["id"], safe="/"))
        assert "Why it was kept" in page and kept["text"][:40].replace("&", "&amp;").replace("<", "&lt;") in page
        shard = run_query(local, "select path from shards where source = 'en' order by path limit 1").to_pylist()[0]["path"]
        row = get("/shards?" + urllib.parse.urlencode({"path": shard, "row": 0}))
        assert 'id="input_ids"' in row and "docref" in row
        answer = get("/sql?" + urllib.parse.urlencode({"q": "select count(*) as n from documents where status = 'kept'"}))
        n = run_query(local, "select count(*) as n from documents where status = 'kept'").to_pylist()[0]["n"]
        assert f'<td class="n">{n:,}</td>' in answer
    finally:
        server.shutdown()
        server.server_close()
