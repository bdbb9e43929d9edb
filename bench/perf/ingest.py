"""WARC-to-text throughput: datapipe's WARC reader against the extractor library called directly.

    python -m bench.perf.ingest --repeat 20 --udhr 60 --repeats 5 [--json PATH]

Builds one WARC (a gzip member per record, as Common Crawl writes them) in a temporary
folder from the whirlwind response record and UDHR pages (CJK included) wrapped as HTTP
responses, repeated to get stable numbers. Then, in one process on the same file, alternating:
  direct:   FastWARC ArchiveIterator (responses, HTTP decoded) + resiliparse detect_encoding
            + extract_plain_text(main_content=True), the library's own recipe;
  datapipe: reader_spec("warc").read (charset, provenance columns, license hints, Arrow batches).
Prints documents per second of each (median and range over --repeats alternating pairs) and the
per-pair ratio datapipe / direct, by process CPU time (both paths are single-threaded; CPU time
is stable on a shared machine where wall time swings with other people's load) and by wall time.
"""

from __future__ import annotations

import argparse
import gzip
import tempfile
import time
import uuid
from pathlib import Path

from bench._support.harness import Harness, add_args, pair_ratios
from bench._support.paths import SHARED


def response_record(url: str, body: bytes, ctype: str = "text/html; charset=utf-8") -> bytes:
    http = f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    head = (
        f"WARC/1.0\r\nWARC-Type: response\r\nWARC-Record-ID: <urn:uuid:{uuid.uuid4()}>\r\n"
        f"WARC-Date: 2024-05-18T01:58:10Z\r\nWARC-Target-URI: {url}\r\n"
        f"Content-Type: application/http; msgtype=response\r\nContent-Length: {len(http)}\r\n\r\n"
    ).encode()
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
    from datapipe.pipeline.load import SourceConfig
    from datapipe.readers import InputFile, reader_spec

    src = SourceConfig(name="bench", kind="web", paths=["x"])
    return sum(b.docs.num_rows for b in reader_spec("warc").read(InputFile(path, path.name, src), 1000))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=20, help="copies of the page set in the WARC")
    ap.add_argument("--udhr", type=int, default=60, help="UDHR pages in the page set (plus the whirlwind page)")
    args = add_args(ap).parse_args()
    h = Harness("ingest", args, libs=["FastWARC", "Resiliparse"])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.warc.gz"
        n = build_warc(path, args.repeat, args.udhr)
        print(f"WARC: {n} response records, {path.stat().st_size / 1e6:.1f} MB gzipped")
        counts: dict[str, int] = {}

        def side(name: str, fn):  # noqa: ANN001,ANN202 - a closure for the harness
            def run() -> dict:
                t, c = time.perf_counter(), time.process_time()
                counts[name] = fn(path)
                return {"cpu": time.process_time() - c, "wall": time.perf_counter() - t}

            return run

        runs = h.interleave({"direct": side("direct", run_direct), "datapipe": side("datapipe", run_datapipe)}, warmup=True)
        cpu = {k: [r["cpu"] for r in v] for k, v in runs.items()}
        wall = {k: [r["wall"] for r in v] for k, v in runs.items()}
        h.noise("direct (CPU s)", cpu["direct"])
        for name in runs:
            h.figure(f"{name} docs/CPU-s", [counts[name] / s for s in cpu[name]], "docs/CPU-s")
            h.figure(f"{name} docs/s wall", [counts[name] / s for s in wall[name]], "docs/s")
        h.ratio("datapipe / direct by CPU time", pair_ratios(cpu["direct"], cpu["datapipe"]), target=">= 0.8")
        h.ratio("datapipe / direct by wall time", pair_ratios(wall["direct"], wall["datapipe"]), target=">= 0.8")
        h.finish(records=n, documents=counts)


if __name__ == "__main__":
    main()
