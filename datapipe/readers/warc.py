"""WARC / ARC / WET / WAT files (plain or gzipped) to web documents with provenance.

Formats: ``warc`` (.warc, .warc.gz, and ARC files .arc/.arc.gz, told apart by their first
bytes), ``wet`` (.warc.wet.gz: conversion records taken as they are) and ``wat``
(.warc.wat.gz: metadata JSON, never page text; each metadata record is rejected as
``wat_metadata_not_text`` so a source pointed at WAT files says why it yields nothing).

A record that cannot be a document (warcinfo, request, metadata, revisit, continuation) is
skipped, not rejected: it was never a document. Skips are counted per type and logged at
INFO once per file (``datapipe.readers.warc``). Response and resource records ARE documents:
non-200 (``http_status_not_ok``), non-HTML (``not_html``), cut off (``truncated_record``:
``WARC-Truncated`` set or fewer bytes than Content-Length) or with no text left after
extraction (``extraction_empty``) are rejected with that reason.

Hostile framing (warc_framing.py): a record whose Content-Length lies (too large, too small,
negative, not a number) or whose header or gzip member is cut off is ``truncated_record``, with
what was declared and found, and reading resynchronises on the next ``WARC/1.x`` header. Bytes
between records are one ``malformed_record``; a gzip member that does not decompress is one
``corrupt_member`` (only its records are lost). Pages over ``max_bytes`` are ``page_too_large``
(over ``limits.max_record_bytes``: ``record_too_large``), nested deeper than
``limits.max_html_depth``: ``too_deeply_nested``; none of them is held in memory or extracted.
"""

from __future__ import annotations

import gzip
import io
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

from datapipe.config.limits import ReadLimits
from datapipe.readers.base import InputFile, LimitExceeded, ReadBatch, describe_error
from datapipe.readers.columns import ColumnsBuilder
from datapipe.readers.html_pages import (
    HtmlOptions,
    WebColumns,
    decode_html,
    extract_text,
    license_hints,
    parse_checked,
    web_builder,
)
from datapipe.readers.spec import ReaderSpec
from datapipe.readers.warc_framing import DecompressedStream, Framed, WarcFramer
from datapipe.readers.warc_splits import split_points
from datapipe.storage.uri import open_input

log = logging.getLogger(__name__)
HTML_TYPES = ("text/html", "application/xhtml+xml")
DOC_TYPES = ("response", "resource", "conversion")


@dataclass
class WebRecord:
    offset: int | str  # byte offset of the record in the (decompressed, for ARC) stream: the record id in doc ids
    type: str  # warcinfo | response | resource | request | metadata | revisit | conversion | ...
    url: str | None
    record_id: str | None
    date: str | None
    warc_content_type: str | None
    status: int | None = None
    content_type: str | None = None  # HTTP Content-Type without parameters
    charset: str | None = None  # from the HTTP Content-Type
    payload: bytes = b""
    truncated: str | None = None  # why the payload is incomplete, if it is
    encoding: tuple[str, ...] = ()  # transfer/content encodings still to undo
    too_large: bool = False
    member: int | None = None  # compressed offset of the gzip member (the offset itself for plain files)
    framing: str | None = None  # why the record's framing is wrong (lying Content-Length, corrupt member, ...)


def iter_warc_records(
    path: Path,
    max_bytes: int,
    need_payload: tuple[str, ...] = DOC_TYPES,
    max_total: int = 1 << 62,
    start: int = 0,
    stop: int | None = None,
) -> Iterator[WebRecord]:
    """Records in file order; a record whose framing is wrong comes out with ``framing`` set and
    bytes that are no record as type ``garbage`` (see warc_framing). ``start``: a record boundary
    (a gzip member or a plain record start, engine/splits.py) to begin at instead of the file start;
    ``stop``: where the caller's range ends (a hint for reading ahead on object storage)."""
    with open_input(path, stop=stop) as f:  # an object in object storage is read in place (ranged reads)
        head = f.read(64 * 1024)
        f.seek(0)
        if _is_arc(head):
            yield from _iter_arc(f, max_bytes)
            return
        stream = DecompressedStream(f, gzipped=head.startswith(b"\x1f\x8b"), max_total=max_total, start=start)
        framer = WarcFramer(stream, max_bytes, lambda h: h.get("warc-type", "") in need_payload)
        for fr in framer:
            yield _from_framed(fr)


def _from_framed(fr: Framed) -> WebRecord:
    h = fr.headers
    rtype = ("corrupt_member" if fr.corrupt_member else "garbage") if fr.garbage else h.get("warc-type", "unknown")
    out = WebRecord(
        fr.start,
        rtype,
        h.get("warc-target-uri"),
        h.get("warc-record-id"),
        h.get("warc-date"),
        h.get("content-type"),
        member=fr.member,
    )
    out.framing = fr.problem
    out.too_large = fr.too_large
    if fr.problem or fr.payload is None:
        return out
    out.truncated = h.get("warc-truncated")
    wct = (out.warc_content_type or "").lower()
    if out.type in ("response", "revisit") and wct.startswith("application/http"):
        _parse_http(out, fr.payload)
    else:
        out.payload = fr.payload
        out.content_type, out.charset = _split_ctype(out.warc_content_type)
    return out


def _split_ctype(value: str | None) -> tuple[str | None, str | None]:
    if not value:
        return None, None
    parts = [p.strip() for p in value.split(";")]
    charset = next((p.split("=", 1)[1].strip().strip("\"'") for p in parts[1:] if p.lower().startswith("charset=")), None)
    return parts[0].lower() or None, charset


def _undo_encodings(payload: bytes, encodings: tuple[str, ...], max_bytes: int) -> bytes:
    from fastwarc.stream_io import BrotliReader, ChunkedReader, GzipReader

    for enc in encodings:  # transfer encoding first (it wraps the content encoding), then content
        reader = {"chunked": ChunkedReader, "gzip": GzipReader, "x-gzip": GzipReader, "br": BrotliReader}.get(enc)
        if enc == "deflate":
            import zlib

            payload = zlib.decompressobj().decompress(payload, max_bytes)
        elif reader is not None:
            payload = reader(io.BytesIO(payload)).read(max_bytes + 1)
    return payload


# ARC v1 (the pre-WARC Internet Archive format): "URL IP DATE MIME LENGTH\n" then LENGTH bytes.
def _is_arc(head: bytes) -> bool:
    if head.startswith(b"\x1f\x8b"):
        try:
            head = gzip.GzipFile(fileobj=io.BytesIO(head)).read(16)
        except Exception:  # noqa: BLE001 - a corrupt first member (zlib.error, ...): not ARC; the WARC reader reports it
            return False
    return head.startswith(b"filedesc://")


def _iter_arc(f: IO[bytes], max_bytes: int) -> Iterator[WebRecord]:
    head = f.read(2)
    f.seek(0)
    stream: IO[bytes] | gzip.GzipFile = gzip.GzipFile(fileobj=f) if head == b"\x1f\x8b" else f
    offset = 0
    while True:
        line = stream.readline(8192)
        if not line:
            return
        start = offset
        offset += len(line)
        if not line.strip():
            continue
        fields = line.decode("latin-1").split()
        if len(fields) < 5 or not fields[-1].isdigit():
            raise ValueError(f"invalid ARC record header at offset {start}: {line[:100]!r}")
        length = int(fields[-1])
        body = stream.read(length) if length <= max_bytes else b""
        too_large = length > max_bytes
        if too_large:
            left = length
            while left > 0 and (chunk := stream.read(min(1 << 20, left))):
                left -= len(chunk)  # skip the oversized payload without holding it
        truncated = f"payload ends after {len(body)} of {length} bytes" if not too_large and len(body) < length else None
        offset += length
        url, date = fields[0], fields[2]
        if url.startswith("filedesc://"):
            yield WebRecord(start, "warcinfo", None, None, _arc_date(date), "text/plain")
            continue
        rec = WebRecord(start, "response", url, None, _arc_date(date), fields[3], truncated=truncated, too_large=too_large)
        _parse_http(rec, body)
        yield rec


def _arc_date(d: str) -> str | None:
    return f"{d[0:4]}-{d[4:6]}-{d[6:8]}T{d[8:10]}:{d[10:12]}:{d[12:14]}Z" if len(d) == 14 and d.isdigit() else None


def _parse_http(rec: WebRecord, block: bytes) -> None:
    sep = block.find(b"\r\n\r\n")
    head, body = (block[:sep], block[sep + 4 :]) if sep >= 0 else block.split(b"\n\n", 1) if b"\n\n" in block else (block, b"")
    lines = head.decode("latin-1").splitlines()
    parts = lines[0].split() if lines else []
    rec.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    rec.content_type, rec.charset = _split_ctype(headers.get("content-type"))
    rec.encoding = tuple(
        e.strip().lower()
        for key in ("transfer-encoding", "content-encoding")
        for e in headers.get(key, "").split(",")
        if e.strip() and e.strip().lower() != "identity"
    )
    rec.payload = body


def _looks_html(payload: bytes) -> bool:
    head = payload[:1024].lstrip().lower()
    return head.startswith((b"<!doctype html", b"<html")) or b"<html" in head


def _handle(out: ColumnsBuilder, rec: WebRecord, opts: HtmlOptions, fmt: str, skipped: Counter[str], limits: ReadLimits) -> None:
    if rec.type in ("garbage", "corrupt_member"):  # bytes between records, a corrupt gzip member: one row each
        out.reject_row(
            rec.offset, "malformed_record" if rec.type == "garbage" else "corrupt_member", rec.framing or "not a WARC record"
        )
        return
    domain = (urlsplit(rec.url).hostname or None) if rec.url else None
    cols: WebColumns = {
        "domain": domain,
        "warc_record_id": rec.record_id,
        "fetch_date": rec.date,
        "content_type": rec.content_type or rec.warc_content_type,
        "http_status": rec.status,
    }
    where = {"url": rec.url}
    if rec.framing:  # a lying Content-Length, a header cut off, a broken gzip member: never a document
        out.reject_row(rec.offset, "truncated_record", f"{rec.type} record: {rec.framing}", **where, **cols)
        return
    if fmt == "wat":
        if rec.type == "metadata":
            out.reject_row(
                rec.offset,
                "wat_metadata_not_text",
                "WAT records hold link/header metadata as JSON, not page text: read the matching WARC or WET file",
                **where,
                **cols,
            )
        else:
            skipped[rec.type] += 1
        return
    if rec.type not in DOC_TYPES:
        skipped[rec.type] += 1
        return
    if rec.too_large:
        if opts.max_bytes <= limits.max_record_bytes:
            out.reject_row(rec.offset, "page_too_large", f"record larger than max_bytes {opts.max_bytes}", **where, **cols)
        else:
            out.reject_row(
                rec.offset,
                "record_too_large",
                f"record larger than limits.max_record_bytes {limits.max_record_bytes}",
                **where,
                **cols,
            )
        return
    if rec.truncated:
        out.reject_row(rec.offset, "truncated_record", f"WARC-Truncated: {rec.truncated}", **where, **cols)
        return
    if rec.type == "conversion":  # WET: already text, taken as it is
        text = rec.payload.decode("utf-8", "replace").strip()
        cols["charset"] = "utf-8"
        if text:
            out.add_row(rec.offset, text, **where, **cols)
        else:
            out.reject_row(rec.offset, "extraction_empty", "empty conversion record", **where, **cols)
        return
    if rec.status is not None and rec.status != 200:
        out.reject_row(rec.offset, "http_status_not_ok", f"HTTP status {rec.status}", **where, **cols)
        return
    try:
        payload = _undo_encodings(rec.payload, rec.encoding, opts.max_bytes) if rec.encoding else rec.payload
    except Exception as exc:  # broken chunking or compression inside one record: only that record
        out.reject_row(rec.offset, "malformed_record", f"cannot undo {rec.encoding}: {describe_error(exc)}", **where, **cols)
        return
    if rec.content_type not in HTML_TYPES and not (rec.content_type is None and _looks_html(payload)):
        out.reject_row(rec.offset, "not_html", f"content type {rec.content_type!r}", **where, **cols)
        return
    html, charset = decode_html(payload, rec.charset)
    cols["charset"] = charset
    tree, bad = parse_checked(html, limits)
    if bad:  # pathological nesting or size: rejected before extraction
        out.reject_row(rec.offset, bad[0], bad[1], **where, **cols)
        return
    cols["license_hints"] = license_hints(html)
    text = extract_text(html, opts.extractor, opts.main_content, tree)
    if text:
        out.add_row(rec.offset, text, **where, **cols)
    else:
        out.reject_row(rec.offset, "extraction_empty", "no main text in the page", **where, **cols)


def _read(file: InputFile, batch_size: int, fmt: str) -> Iterator[ReadBatch]:
    opts = HtmlOptions.model_validate(file.source.options) if fmt == "warc" else HtmlOptions()
    max_bytes = min(opts.max_bytes, file.limits.max_record_bytes)
    out = web_builder(file, batch_size)
    skipped: Counter[str] = Counter()
    per_member: Counter[int | str] = Counter()
    last_end: int | str = 0
    leading: WebRecord | None = None  # garbage at offset 0: "not a WARC file" if nothing else follows
    need = () if fmt == "wat" else DOC_TYPES  # WAT metadata is rejected unread
    try:
        start = file.start if file.ranged else 0
        for rec in iter_warc_records(
            file.path, max_bytes, need, file.limits.max_file_decompressed_bytes, start, file.end if file.ranged else None
        ):
            # The id is the record's gzip member offset (what a CDX index points at), numbered
            # within the member when it holds several records (a file gzipped as one member).
            key = rec.member if rec.member is not None else rec.offset
            if file.ranged and file.end is not None and isinstance(key, int) and key >= file.end:
                break  # the next range's first record
            n = per_member[key]
            per_member[key] += 1
            rec.offset = key if n == 0 else f"{key}.{n}"
            last_end = rec.offset
            if rec.type in ("garbage", "corrupt_member") and rec.member == 0 and n == 0:
                leading = rec
                continue
            if leading is not None:
                _handle(out, leading, opts, fmt, skipped, file.limits)
                leading = None
            _handle(out, rec, opts, fmt, skipped, file.limits)
            if out.full():
                yield out.flush()  # type: ignore[misc]
        if leading is not None:
            out.reject_row(leading.offset, "unreadable_input", f"not a WARC file: {leading.framing}")
    except LimitExceeded as exc:  # a decompression bomb: the rest is one reject, as in every format
        out.reject_row(f"{last_end}-", exc.reason, f"reading stopped after record {last_end}: {exc.detail}")
    except Exception as exc:  # an I/O error, or ARC framing: the rest is one reject
        out.reject_row(f"{last_end}-", "unreadable_input", f"reading stopped after record {last_end}: {describe_error(exc)}")
    if skipped:
        log.info("%s: skipped %d non-document record(s): %s", file.name, sum(skipped.values()), dict(skipped))
    if (last := out.flush()) is not None:
        yield last
    skipped_records[file.name] = dict(skipped)


# The last skip counts per input name in this process: what tests and benchmarks inspect.
skipped_records: dict[str, dict[str, int]] = {}


def read_warc(file: InputFile, batch_size: int) -> Iterator[ReadBatch]:
    return _read(file, batch_size, "warc")


def read_wet(file: InputFile, batch_size: int) -> Iterator[ReadBatch]:
    return _read(file, batch_size, "wet")


def read_wat(file: InputFile, batch_size: int) -> Iterator[ReadBatch]:
    return _read(file, batch_size, "wat")


# WARC and ARC (told apart by their first bytes); WET and WAT take no options.
WARC = ReaderSpec(
    "warc", read_warc, HtmlOptions, suffixes=(".warc.gz", ".warc", ".arc.gz", ".arc"), streamed=True, split_points=split_points
)
WET = ReaderSpec("wet", read_wet, suffixes=(".warc.wet.gz", ".wet.gz", ".wet"), streamed=True, split_points=split_points)
WAT = ReaderSpec("wat", read_wat, suffixes=(".warc.wat.gz", ".wat.gz", ".wat"), streamed=True, split_points=split_points)
