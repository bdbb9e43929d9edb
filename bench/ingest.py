"""WARC-to-text throughput: datapipe's WARC reader against the extractor library called directly.

    PYTHONPATH=. python bench/ingest.py --repeat 20 --udhr 60 --rounds 3

Builds one WARC (a gzip member per record, as Common Crawl writes them) in a temporary
folder from the whirlwind response record and UDHR pages (CJK included) wrapped as HTTP
responses, repeated to get stable numbers. Then, in one process on the same file, alternating:
  direct:   FastWARC ArchiveIterator (responses, HTTP decoded) + resiliparse detect_encoding
            + extract_plain_text(main_content=True), the library's own recipe;
  datapipe: READERS["warc"] (charset, provenance columns, license hints, Arrow batches).
Prints documents per second of each (best of --rounds) and the ratio datapipe / direct, by
process CPU time (both paths are single-threaded; CPU time is stable on a shared machine where
wall time swings with other people's load) and by wall time.
"""

from __future__ import annotations

import argparse
import gzip
import tempfile
import time
import uuid
from pathlib import Path

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def response_record(url: str, body: bytes, ctype: str = "text/html; charset=utf-8") -> bytes:
    http = f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    head = (f"WARC/1.0\r\nWARC-Type: response\r\nWARC-Record-ID: <urn:uuid:{uuid.uuid4()}>\r\n"
            f"WARC-Date: 2024-05-18T01:58:10Z\r\nWARC-Target-URI: {url}\r\n"
            f"Content-Type: application/http; msgtype=response\r\nContent-Length: {len(http)}\r\n\r\n").encode()
    return gzip.compress(head + http + b"\r\n\r\n", compresslevel=6)


def build_warc(path: Path, repeat: int, udhr: int) -> int:
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    pages: list[tuple[str, bytes]] = []
    with open(SHARED / "web" / "warc" / "whirlwind_whirlwind.warc.gz", "rb") as f:
        for rec in ArchiveIterator(f, record_types=WarcRecordType.response, parse_http=True):
            pages.append((rec.headers.get("WARC-Target-URI"), rec.reader.read()))
    udhr_dir = SHARED / "web" / "html" / "udhr"
    preferred = ["cmn_hans", "cmn_hant", "jpn", "kor", "eng", "yue"]
    names = preferred + sorted(p.stem for p in udhr_dir.glob("*.html") if p.stem not in preferred)
    for name in names[:udhr]:
        pages.append((f"https://udhr.example/{name}", (udhr_dir / f"{name}.html").read_bytes()))
    n = 0
    with path.open("wb") as out:
        for r in range(repeat):
            for url, body in pages:
                out.write(response_record(f"{url}?r={r}", body))
                n += 1
    return n


def run_direct(path: Path) -> int:
    from fastwarc.warc import ArchiveIterator, WarcRecordType
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding
    from resiliparse.parse.html import HTMLTree

    docs = 0
    with path.open("rb") as f:
        for rec in ArchiveIterator(f, record_types=WarcRecordType.response, parse_http=True, auto_decode="all"):
            body = rec.reader.read()
            html = bytes_to_str(body, detect_encoding(body))
            if extract_plain_text(HTMLTree.parse(html), main_content=True, alt_texts=False).strip():
                docs += 1
    return docs


def run_datapipe(path: Path) -> int:
    from datapipe.config import SourceConfig
    from datapipe.readers import READERS, InputFile

    src = SourceConfig(name="bench", kind="web", paths=["x"])
    return sum(b.docs.num_rows for b in READERS["warc"](InputFile(path, path.name, src), 1000))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=20, help="copies of the page set in the WARC")
    ap.add_argument("--udhr", type=int, default=60, help="UDHR pages in the page set (plus the whirlwind page)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds of each path; the best counts")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.warc.gz"
        n = build_warc(path, args.repeat, args.udhr)
        print(f"WARC: {n} response records, {path.stat().st_size / 1e6:.1f} MB gzipped")
        run_direct(path), run_datapipe(path)  # warm-up: imports, caches
        cpu = {"direct": 0.0, "datapipe": 0.0}
        wall = dict(cpu)
        counts = {}
        for _ in range(args.rounds):
            for name, fn in (("direct", run_direct), ("datapipe", run_datapipe)):
                t, c = time.perf_counter(), time.process_time()
                counts[name] = fn(path)
                cpu[name] = max(cpu[name], counts[name] / (time.process_time() - c))
                wall[name] = max(wall[name], counts[name] / (time.perf_counter() - t))
        for name in cpu:
            print(f"{name:>9}: {cpu[name]:8.1f} docs/CPU-s  {wall[name]:8.1f} docs/s wall  ({counts[name]} documents)")
        print(f"    ratio: {cpu['datapipe'] / cpu['direct']:.3f} by CPU time, {wall['datapipe'] / wall['direct']:.3f} "
              "by wall time  (datapipe / direct; goal >= 0.8)")


if __name__ == "__main__":
    main()
