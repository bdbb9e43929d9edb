"""WARC / ARC / WET / WAT and loose HTML on the real shared data: text, provenance, charsets, rejects."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from datapipe.readers import infer_format
from datapipe.readers.html_pages import decode_html, license_hints
from datapipe.readers.warc import skipped_records
from tests.support.ingest_helpers import read_all
from tests.support.shared_data import shared_path

WEB_COLUMNS = ["domain", "warc_record_id", "fetch_date", "content_type", "http_status", "charset", "license_hints"]


def test_whirlwind_warc_gives_the_page_with_provenance() -> None:
    path = shared_path("web", "warc", "whirlwind_whirlwind.warc.gz")
    docs, rejects = read_all(path, "web")
    assert rejects == [] and len(docs) == 1
    d = docs[0]
    assert d["id"] == "s/whirlwind_whirlwind.warc.gz#1023"  # the record's byte offset in the file
    assert d["url"] == "https://an.wikipedia.org/wiki/Escopete" and d["domain"] == "an.wikipedia.org"
    assert d["warc_record_id"] == "<urn:uuid:2aabeff2-67f5-4608-8466-e87c6296e2b6>"
    assert (d["fetch_date"], d["content_type"], d["http_status"], d["charset"]) == (
        "2024-05-18T01:58:10Z",
        "text/html",
        200,
        "utf-8",
    )
    assert d["text"].startswith("Escopete") and "<div" not in d["text"]
    hints = json.loads(d["license_hints"])
    assert any("creativecommons.org/licenses/by-sa" in h for h in hints) and len(d["license_hints"]) < 2000
    # warcinfo, request and metadata records are not documents: skipped and counted.
    assert skipped_records["whirlwind_whirlwind.warc.gz"] == {"warcinfo": 1, "request": 1, "metadata": 1}


def test_wet_is_taken_as_is_and_wat_is_rejected_with_a_reason() -> None:
    wet, _ = read_all(shared_path("web", "warc", "whirlwind_whirlwind.warc.wet.gz"), "web")
    assert infer_format(Path("x.warc.wet.gz")) == "wet" and len(wet) == 1
    assert wet[0]["url"] == "https://an.wikipedia.org/wiki/Escopete" and wet[0]["content_type"] == "text/plain"
    assert wet[0]["text"].startswith("Escopete - Biquipedia")
    docs, rejects = read_all(shared_path("web", "warc", "whirlwind_whirlwind.warc.wat.gz"), "web")
    assert infer_format(Path("x.warc.wat.gz")) == "wat"
    assert docs == [] and [r["reason"] for r in rejects] == ["wat_metadata_not_text"]


def test_warcio_files_arc_chunked_revisit_and_non_html() -> None:
    chunked, _ = read_all(shared_path("web", "warc", "warcio_example-iana.org-chunked.warc"), "web")
    assert len(chunked) == 1 and chunked[0]["domain"] == "www.iana.org"
    assert "Internet Assigned Numbers Authority" in chunked[0]["text"]
    assert "001c37" not in chunked[0]["text"]  # chunk sizes removed
    arc, _ = read_all(shared_path("web", "warc", "warcio_example.arc.gz"), "web")
    assert len(arc) == 1 and arc[0]["url"] == "http://example.com/" and arc[0]["fetch_date"] == "2014-02-16T05:02:21Z"
    assert arc[0]["text"].startswith("Example Domain") and arc[0]["http_status"] == 200
    warc, _ = read_all(shared_path("web", "warc", "warcio_example.warc.gz"), "web")
    assert len(warc) == 1  # the revisit record has no payload: skipped, not a second document
    assert skipped_records["warcio_example.warc.gz"]["revisit"] == 1
    docs, rejects = read_all(shared_path("web", "warc", "warcio_post-test.warc.gz"), "web")
    assert docs == [] and {r["reason"] for r in rejects} == {"not_html"} and len(rejects) == 3
    assert rejects[0]["content_type"] == "application/json" and rejects[0]["url"] == "http://httpbin.org/post"


def _warc_record(url: str, http: bytes, rtype: str = "response", extra: str = "") -> bytes:
    head = (
        f"WARC/1.0\r\nWARC-Type: {rtype}\r\nWARC-Record-ID: <urn:uuid:{abs(hash(url)):032x}>\r\n"
        f"WARC-Date: 2024-01-01T00:00:00Z\r\nWARC-Target-URI: {url}\r\n{extra}"
        f"Content-Type: application/http; msgtype=response\r\nContent-Length: {len(http)}\r\n\r\n"
    )
    return head.encode() + http + b"\r\n\r\n"


def _http(body: bytes, status: str = "200 OK", ctype: str = "text/html") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


PAGE = b"<html><body><article><h1>Title</h1><p>" + b"Real paragraph text here. " * 20 + b"</p></article></body></html>"


def test_status_type_truncation_and_empty_are_rejected_with_reasons(tmp_path: Path) -> None:
    data = (
        _warc_record("http://a.example/ok", _http(PAGE))
        + _warc_record("http://a.example/404", _http(PAGE, "404 Not Found"))
        + _warc_record("http://a.example/img", _http(b"\x89PNG....", ctype="image/png"))
        + _warc_record("http://a.example/cut", _http(PAGE), extra="WARC-Truncated: length\r\n")
        + _warc_record("http://a.example/empty", _http(b"<html><body></body></html>"))
    )
    path = tmp_path / "mixed.warc.gz"
    path.write_bytes(gzip.compress(data))
    docs, rejects = read_all(path, "web")
    assert [d["url"] for d in docs] == ["http://a.example/ok"]
    assert {r["url"]: r["reason"] for r in rejects} == {
        "http://a.example/404": "http_status_not_ok",
        "http://a.example/img": "not_html",
        "http://a.example/cut": "truncated_record",
        "http://a.example/empty": "extraction_empty",
    }
    assert next(r for r in rejects if r["reason"] == "http_status_not_ok")["http_status"] == 404


def test_truncated_and_garbage_warc_files_become_rejects(tmp_path: Path) -> None:
    whole = shared_path("web", "warc", "whirlwind_whirlwind.warc.gz").read_bytes()
    cut = tmp_path / "cut.warc.gz"
    cut.write_bytes(whole[:9000])  # gzip stream and the response record both end half-way
    docs, rejects = read_all(cut, "web")
    assert docs == [] and [r["reason"] for r in rejects] == ["truncated_record"]
    plain = gzip.decompress(whole)
    cut_header = tmp_path / "cut_header.warc"
    cut_header.write_bytes(plain[: plain.index(b"WARC-Type: response") + 30])  # ends inside a record header
    docs, rejects = read_all(cut_header, "web")
    assert docs == [] and rejects and rejects[-1]["reason"] in ("unreadable_input", "truncated_record")
    garbage = tmp_path / "garbage.warc"
    garbage.write_bytes(b"this is not a WARC file\n" * 10)
    docs, rejects = read_all(garbage, "web")
    assert docs == [] and [r["reason"] for r in rejects] == ["unreadable_input"]


UDHR = {"cmn_hans": ["gb18030", "gbk"], "cmn_hant": ["big5"], "jpn": ["shift_jis", "euc_jp"], "kor": ["euc_kr"]}


@pytest.mark.parametrize("page", sorted(UDHR))
def test_udhr_pages_decode_without_mojibake_in_every_encoding(tmp_path: Path, page: str) -> None:
    src = shared_path("web", "html", "udhr", f"{page}.html")
    (reference,), _ = read_all(src, "web")
    first = {"cmn_hans": "世界人权宣言", "cmn_hant": "世界人權宣言", "jpn": "世界人権宣言", "kor": "세 계 인 권 선 언"}[page]
    assert first in reference["text"].split("\n", 1)[0] and reference["charset"] == "utf-8"
    html = src.read_text(encoding="utf-8")
    for enc in UDHR[page]:
        # Characters the legacy charset lacks become character references, as real pages do.
        raw = html.encode(enc, "xmlcharrefreplace")
        undeclared = tmp_path / f"{page}-{enc}.html"
        undeclared.write_bytes(raw)  # no charset anywhere: detected from the bytes
        (doc,), _ = read_all(undeclared, "web")
        assert doc["text"] == reference["text"], f"{page} in {enc} (detected {doc['charset']})"
        declared = tmp_path / f"{page}-{enc}-meta.html"
        declared.write_bytes(raw.replace(b"<head>", f'<head><meta charset="{enc}">'.encode(), 1))
        (doc,), _ = read_all(declared, "web")
        assert doc["text"] == reference["text"]
        # In a WARC, with the charset only in the HTTP header.
        warc = tmp_path / f"{page}-{enc}.warc"
        warc.write_bytes(_warc_record("http://udhr.example/", _http(raw, ctype=f"text/html; charset={enc}")))
        (doc,), _ = read_all(warc, "web")
        assert doc["text"] == reference["text"]


def test_wrong_declared_charset_falls_back_to_the_bytes() -> None:
    raw = "<html><head><meta charset='utf-8'></head><body><p>世界人权宣言，人人生而自由</p></body></html>".encode("gbk")
    text, charset = decode_html(raw, "utf-8")
    assert "世界人权宣言" in text and charset == "gb18030"


def test_license_hints_are_short_evidence_not_pages() -> None:
    page = (
        '<html><head><link rel="license" href="https://creativecommons.org/licenses/by/4.0/"></head><body>'
        + "x" * 100_000
        + '<img alt="Creative Commons License" src="cc.png"> Licensed CC BY-SA 4.0.</body></html>'
    )
    hints = json.loads(license_hints(page) or "[]")
    assert "https://creativecommons.org/licenses/by/4.0/" in hints
    assert "Creative Commons License" in hints and "CC BY-SA 4.0" in hints
    assert all(len(h) <= 200 for h in hints)
    assert license_hints("<html><body>no evidence here</body></html>") is None


def test_html_folder_and_second_extractor(tmp_path: Path) -> None:
    (tmp_path / "site" / "sub").mkdir(parents=True)
    (tmp_path / "site" / "a.html").write_bytes(PAGE)
    (tmp_path / "site" / "sub" / "b.htm").write_bytes(PAGE.replace(b"Title", b"Other"))
    (tmp_path / "site" / "notes.txt").write_text("not html")
    assert infer_format(tmp_path / "site", "web") == "html"
    docs, rejects = read_all(tmp_path / "site", "web")
    assert [d["path"] for d in docs] == ["a.html", "sub/b.htm"] and rejects == []
    pytest.importorskip("trafilatura")
    docs2, _ = read_all(tmp_path / "site", "web", options={"extractor": "trafilatura"})
    assert len(docs2) == 2 and "Real paragraph text here." in docs2[0]["text"]
