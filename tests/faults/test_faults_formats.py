"""Fault suite for the format readers (issue 12): hostile WARC framing, HTML nesting, LaTeX
macros and archives, each mixed with real good records and run through the map task.

For every hostile input the suite shows: the task completes; each bad record has exactly one
reject row with its reason; every good record comes out as in a clean run of the same input
without the bad record; conservation holds (records in = kept + rejected, ids unique and the
same on a rerun); nothing is written outside the run folder; and for the worst cases, peak
memory measured in a subprocess stays bounded.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from datapipe.engine.plan import make_spec
from datapipe.engine.tasks.map import map_shard
from datapipe.pipeline.load import load_pipeline
from tests.conftest import write_pipeline
from tests.support.shared_data import PROJECT_ROOT, shared_path

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore:Duplicate name")]


# ---------------------------------------------------------------- running the map task in-process


@dataclass
class Run:
    docs: list[dict[str, Any]]
    rejects: list[dict[str, Any]]

    def of(self, input_name: str) -> tuple[list[dict], list[dict]]:
        """(docs, rejects) of one input file (ids are <source>/<input>#<record>)."""

        def mine(r: dict) -> bool:
            return r["id"].split("/", 1)[1].split("#", 1)[0] == input_name

        return [d for d in self.docs if mine(d)], [r for r in self.rejects if mine(r)]


def _tree(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")}


def run_map(project: Path, sources: list[dict[str, Any]], tag: str, limits: dict[str, int] | None = None) -> Run:
    """Every input shard through map_shard (no stages): the reading stage as the engine runs it."""
    config: dict[str, Any] = {"name": "faults", "sources": sources}
    if limits:
        config["limits"] = limits
    pipeline = load_pipeline(write_pipeline(project, config, name=f"{tag}.yaml"))
    out, cache = project / f"out-{tag}", project / f"cache-{tag}"
    before, outside = _tree(project), sorted(os.listdir(project.parent))
    spec = make_spec(pipeline, out, cache)
    markers = [map_shard(spec, shard, spec.segments[0]) for shard in spec.shards]
    # Nothing written outside the run folder (and its cache): not beside the inputs, not above them.
    after = {p for p in _tree(project) - before if not p.startswith((f"out-{tag}", f"cache-{tag}"))}
    assert after == set() and sorted(os.listdir(project.parent)) == outside
    docs = [r for f in sorted((out / "docs").rglob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    rejects = [r for f in sorted((out / "rejected").rglob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    for r in rejects:
        assert r["reason"] and r["stage"] == "read", r  # every reject says why
    ids = [r["id"] for r in docs + rejects]
    assert len(ids) == len(set(ids)), Counter(i for i in ids if ids.count(i) > 1)
    # Conservation: what each task read = what it kept + what it rejected.
    assert sum(m["docs_in"] for m in markers) == len(docs) + len(rejects)
    assert sum(m["kept"] for m in markers) == len(docs)
    return Run(docs, rejects)


def extra_rejects(bad: list[dict], clean: list[dict]) -> list[tuple[str | None, str]]:
    """(url, reason) of the rejects the hostile input has beyond its clean twin's."""
    left = Counter((r["url"], r["reason"]) for r in bad)
    left.subtract(Counter((r["url"], r["reason"]) for r in clean))
    assert all(n >= 0 for n in left.values()), f"clean rejects missing from the hostile run: {left}"
    return sorted(left.elements(), key=str)


# ---------------------------------------------------------------- WARC / WET framing


def _members(path: Path) -> list[bytes]:
    """The decompressed records of a per-record gzipped WARC (one per member)."""
    data, out = path.read_bytes(), []
    while data:
        d = zlib.decompressobj(31)
        out.append(d.decompress(data))
        data = d.unused_data
    return out


def _record(
    url: str, http: bytes, rtype: str = "response", length: object = None, ctype: str = "application/http; msgtype=response"
) -> bytes:
    clen = "" if length == "missing" else f"Content-Length: {len(http) if length is None else length}\r\n"
    head = (
        f"WARC/1.0\r\nWARC-Type: {rtype}\r\nWARC-Record-ID: <urn:uuid:{abs(hash(url)) % 10**12:032d}>\r\n"
        f"WARC-Date: 2024-01-01T00:00:00Z\r\nWARC-Target-URI: {url}\r\nContent-Type: {ctype}\r\n{clen}\r\n"
    )
    return head.encode() + http + b"\r\n\r\n"


def _page(i: int) -> bytes:
    body = (
        f"<html><head><title>Page {i}</title></head><body><article><h1>Report {i}</h1><p>"
        + f"Paragraph {i} of real looking text about rivers, bridges and towns. " * 25
        + "</p></article></body></html>"
    ).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\r\n" + body


DEEP = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n<html><body>" + b"<div>x" * 100_000 + b"</body></html>"

# case -> (how the bad record is written, expected reason, whether it is the last record)
WARC_CASES: dict[str, tuple[Any, str, bool]] = {
    "length_too_large": (lambda http: _record("http://bad.example/", http, length=len(http) + 4000), "truncated_record", False),
    "length_beyond_file": (lambda http: _record("http://bad.example/", http, length=10**12), "truncated_record", False),
    "length_too_small": (lambda http: _record("http://bad.example/", http, length=102), "truncated_record", False),
    "length_negative": (lambda http: _record("http://bad.example/", http, length=-5), "truncated_record", False),
    "length_not_a_number": (lambda http: _record("http://bad.example/", http, length="12x"), "truncated_record", False),
    "length_missing": (lambda http: _record("http://bad.example/", http, length="missing"), "truncated_record", False),
    "garbage_between": (lambda http: b"\x00\x01 not a record \xff\xfe\r\nWARC/0.9 nope\r\n\r\n", "malformed_record", False),
    "truncated_final": (lambda http: _record("http://bad.example/", http)[:400], "truncated_record", True),
    "deeply_nested": (lambda http: _record("http://bad.example/", DEEP), "too_deeply_nested", False),
}


def _write_warc(path: Path, records: list[bytes], container: str, corrupt: int | None = None) -> None:
    if container == "plain":
        path.write_bytes(b"".join(records))
        return
    if container == "gzip_one_member":
        path.write_bytes(gzip.compress(b"".join(records)))
        return
    members = [gzip.compress(r) for r in records]
    if corrupt is not None:  # damage the deflate data of one member, keep its gzip header
        m = bytearray(members[corrupt])
        m[20:60] = b"\xff" * 40
        members[corrupt] = bytes(m)
    path.write_bytes(b"".join(members))


def test_a_warc_decompression_bomb_is_input_too_large_as_in_every_format(tmp_path: Path) -> None:
    """docs/reliability.md: a decompression bomb is one input_too_large reject for the rest of the file
    (a WARC's used to be unreadable_input, naming an internal exception)."""
    from datapipe.config.limits import ReadLimits
    from datapipe.config.sections import SourceConfig
    from datapipe.readers import InputFile, reader_spec

    path = tmp_path / "bomb.warc.gz"
    _write_warc(path, [_record(f"http://good.example/{i}", _page(i)) for i in range(1500)], "gzip_one_member")
    limits = ReadLimits(max_file_decompressed_bytes=1 << 20)  # the 1,500 pages decompress to ~3 MB
    src = SourceConfig(name="s", kind="web", paths=["x"])
    batches = list(reader_spec("warc").read(InputFile(path, path.name, src, limits), 100))
    kept = sum(b.docs.num_rows for b in batches)
    rejects = [r for b in batches if b.rejects is not None for r in b.rejects.to_pylist()]
    assert kept < 1500 and [r["reason"] for r in rejects] == ["input_too_large"], rejects  # read ahead: maybe none kept
    assert rejects[0]["id"].endswith("-") and "max_file_decompressed_bytes" in rejects[0]["detail"]


def test_warc_with_lying_lengths_garbage_and_broken_members_loses_only_the_bad_record(tmp_path: Path) -> None:
    real = _members(shared_path("web", "warc", "whirlwind_whirlwind.warc.gz"))  # warcinfo, request, response, metadata
    good = [
        *real,
        _record("http://good.example/1", _page(1)),
        _record("http://good.example/2", _page(2)),
        _record("http://good.example/3", _page(3)),
    ]
    (tmp_path / "bad").mkdir()
    (tmp_path / "clean").mkdir()
    expected: dict[str, tuple[str | None, str] | None] = {}  # None: no reject beyond the clean twin's
    for container, ext in (("plain", ".warc"), ("gzip_per_record", ".warc.gz"), ("gzip_one_member", ".warc.gz")):
        for case, (make, reason, last) in WARC_CASES.items():
            bad = make(_page(99))
            records = [*good, bad] if last else [*good[:3], bad, *good[3:]]  # 4 good records after it
            name = f"{case}.{container}{ext}"
            _write_warc(tmp_path / "bad" / name, records, container)
            _write_warc(tmp_path / "clean" / name, good, container)
            url = None if case == "garbage_between" else "http://bad.example/"
            expected[name] = (url, reason)
    # A gzip member that does not decompress: only that member (one record) is lost.
    records = [*good[:3], _record("http://bad.example/", _page(99)), *good[3:]]
    _write_warc(tmp_path / "bad" / "corrupt_member.warc.gz", records, "gzip_per_record", corrupt=3)
    _write_warc(tmp_path / "clean" / "corrupt_member.warc.gz", good, "gzip_per_record")
    expected["corrupt_member.warc.gz"] = (None, "corrupt_member")
    # Zero padding after the last gzip member (some writers align files) is not data: no row at all.
    _write_warc(tmp_path / "clean" / "padded.warc.gz", good, "gzip_per_record")
    (tmp_path / "bad" / "padded.warc.gz").write_bytes((tmp_path / "clean" / "padded.warc.gz").read_bytes() + b"\x00" * 10_000)
    expected["padded.warc.gz"] = None
    # WET: conversion records taken as they are; a lying one is found the same way.
    wet = _members(shared_path("web", "warc", "whirlwind_whirlwind.warc.wet.gz"))
    lying = _record("http://bad.example/", b"plain text " * 50, rtype="conversion", length=30, ctype="text/plain")
    for container in ("gzip_per_record", "plain"):
        name = f"lying.{container}.warc.wet" + (".gz" if container != "plain" else "")
        _write_warc(tmp_path / "bad" / name, [wet[0], lying, *wet[1:]], container)
        _write_warc(tmp_path / "clean" / name, wet, container)
        expected[name] = ("http://bad.example/", "truncated_record")

    run = run_map(
        tmp_path,
        [{"name": "bad", "kind": "web", "paths": ["bad/*"]}, {"name": "clean", "kind": "web", "paths": ["clean/*"]}],
        "warc",
    )
    for name, bad in expected.items():
        url, reason = bad or (None, None)
        bad_docs, bad_rejects = run.of(f"bad/{name}")
        clean_docs, clean_rejects = run.of(f"clean/{name}")
        assert len(clean_docs) == (4 if "wet" not in name else 1), name  # the real page + 3 built ones
        # Every good record as in the clean run: same pages, same text, same provenance.
        assert [(d["url"], d["text"], d["domain"]) for d in bad_docs] == [
            (d["url"], d["text"], d["domain"]) for d in clean_docs
        ], name
        assert extra_rejects(bad_rejects, clean_rejects) == ([(url, reason)] if bad else []), name
        if name.startswith("length_"):
            detail = next(r["detail"] for r in bad_rejects if r["reason"] == reason)
            assert "Content-Length" in detail, detail  # says what was declared and what was found


# ---------------------------------------------------------------- HTML nesting and size


def test_html_pathological_pages_are_rejected_or_read_in_linear_time(tmp_path: Path) -> None:
    pages = ["cmn_hans", "eng", "jpn", "kor", "cmn_hant"]
    for folder in ("bad", "clean"):
        (tmp_path / folder).mkdir()
        for p in pages:
            (tmp_path / folder / f"{p}.html").write_bytes(shared_path("web", "html", "udhr", f"{p}.html").read_bytes())
    bad = tmp_path / "bad"
    text = "<p>Words in a paragraph that a reader keeps.</p>"
    hostile = {
        "deep_div.html": ("<html><body>" + "<div>x" * 100_000 + "</body></html>", "too_deeply_nested"),
        "deep_span_closed.html": (
            "<html><body>" + "<span>" * 5_000 + "x" + "</span>" * 5_000 + "</body></html>",
            "too_deeply_nested",
        ),
        "deep_table.html": ("<html><body>" + "<table><tr><td>" * 3_000 + "</body></html>", "too_deeply_nested"),
        # Shapes the parser and extractor handle in linear time: kept (or empty), never rejected for depth.
        "siblings.html": ("<html><body>" + text * 20_000 + "</body></html>", None),
        "unclosed_p.html": ("<html><body>" + "<p>an unclosed paragraph of words" * 20_000 + "</body></html>", None),
        "huge_attribute.html": ("<html><body><div title='" + "a" * 3_000_000 + "'>" + text + "</div></body></html>", None),
        "one_line.html": ("<html><body><p>" + "word " * 600_000 + "</p></body></html>", None),
        "over_record_cap.html": ("<html><body><p>" + "x" * (5 << 20) + "</p></body></html>", "record_too_large"),
    }
    for name, (html, _) in hostile.items():
        (bad / name).write_text(html)
    (bad / "linked.html").symlink_to(tmp_path / "clean" / "eng.html")
    (bad / os.fsdecode(b"caf\xe9.html")).write_bytes((bad / "eng.html").read_bytes())  # a name that is not UTF-8
    run = run_map(
        tmp_path,
        [{"name": "bad", "kind": "web", "paths": ["bad"]}, {"name": "clean", "kind": "web", "paths": ["clean"]}],
        "html",
        limits={"max_record_bytes": 4 << 20},
    )
    bad_docs, bad_rejects = run.of("bad")
    clean_docs, _ = run.of("clean")
    assert len(clean_docs) == len(pages)
    by_path = {d["path"]: d for d in bad_docs}
    for d in clean_docs:  # the real pages come out exactly as in the clean run
        assert by_path[d["path"]]["text"] == d["text"]
    reasons = {r["path"]: r["reason"] for r in bad_rejects}
    assert len(bad_rejects) == len(reasons)  # one row per bad page
    for name, (_, reason) in hostile.items():
        if reason is not None:
            assert reasons[name] == reason, name
        else:
            assert name in by_path or reasons.get(name) == "extraction_empty", name
    assert reasons["linked.html"] == "symlink"
    escaped = next(d for d in bad_docs if d["path"].startswith("caf\\xe9.html//"))  # escaped, id kept unique
    assert escaped["text"] == by_path["eng.html"]["text"] and escaped["id"].endswith("#" + escaped["path"])
    assert "Words in a paragraph" in by_path["siblings.html"]["text"]
    assert set(reasons) == {n for n, (_, r) in hostile.items() if r} | {"linked.html"} | {
        n for n in hostile if reasons.get(n) == "extraction_empty"
    }


# ---------------------------------------------------------------- arXiv LaTeX


def _tar(path: Path, files: dict[str, bytes], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode, format=tarfile.GNU_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_latex_macro_bombs_are_linear_and_capped(tmp_path: Path) -> None:
    paper = shared_path("papers", "conv_arithmetic", "conv_arithmetic.tex").read_bytes()
    cls = b"\\documentclass"
    at = paper.index(cls)
    preamble_end = paper.index(b"\n", at) + 1

    def with_preamble(extra: bytes) -> bytes:  # the real paper with extra definitions after \documentclass
        return paper[:preamble_end] + extra + paper[preamble_end:]

    (tmp_path / "in").mkdir()
    _tar(tmp_path / "in" / "1603.07285.tar.gz", {"conv_arithmetic.tex": paper})  # the clean twin
    _tar(tmp_path / "in" / "1603.07286.tar.gz", {"conv_arithmetic.tex": with_preamble(b"\\def\\x{ unbalanced\n" * 30_000)})
    _tar(
        tmp_path / "in" / "1603.07287.tar.gz",
        {"conv_arithmetic.tex": with_preamble(b"\\def\\a{\\a\\a}\n").replace(b"\\begin{document}", b"\\begin{document}\\a")},
    )
    bomb = b"\\documentclass{article}\\def\\a{\\a\\a}\\begin{document}" + b"\\a " * 200_000 + b"\\end{document}"
    _tar(tmp_path / "in" / "1603.07288.tar.gz", {"main.tex": bomb})
    fan = {
        "main.tex": b"\\documentclass{article}\\begin{document}" + b"\\input{a}" * 2000 + b"\\end{document}",
        "a.tex": b"\\input{b}" * 2000,
        "b.tex": b"long text " * 1000,
    }
    _tar(tmp_path / "in" / "1603.07289.tar.gz", fan)
    _tar(tmp_path / "in" / "1603.07290.tar.gz", {})
    folder = tmp_path / "in" / "1603.07291"
    folder.mkdir()
    (folder / "conv_arithmetic.tex").write_bytes(paper)
    (folder / "other.tex").symlink_to("/etc/hostname")
    run = run_map(tmp_path, [{"name": "p", "kind": "paper", "paths": ["in/*"]}], "tex")
    (clean,), no_rejects = run.of("in/1603.07285.tar.gz")
    assert no_rejects == [] and len(clean["text"]) > 30_000
    (doc,), rejects = run.of("in/1603.07286.tar.gz")  # 30,000 unbalanced \defs: the same text, fast
    assert rejects == [] and doc["text"] == clean["text"]
    (doc,), rejects = run.of("in/1603.07287.tar.gz")  # a recursive macro used once terminates
    assert rejects == [] and doc["text"].startswith("\\a" * 16) and doc["text"][32:].strip() == clean["text"]
    assert [(r["reason"]) for r in run.of("in/1603.07288.tar.gz")[1]] == ["too_many_expansions"]
    assert [(r["reason"]) for r in run.of("in/1603.07289.tar.gz")[1]] == ["record_too_large"]
    assert [(r["reason"]) for r in run.of("in/1603.07290.tar.gz")[1]] == ["empty_archive"]
    (doc,), rejects = run.of("in/1603.07291")
    assert doc["text"] == clean["text"] and [(r["reason"], r["path"]) for r in rejects] == [("symlink", "other.tex")]
    assert "/etc/hostname" in rejects[0]["detail"]


# ---------------------------------------------------------------- archives


def _real_python() -> dict[str, bytes]:
    """Real Python files: this project's readers."""
    return {
        f"pkg/{p.name}": p.read_bytes()
        for p in sorted((PROJECT_ROOT / "datapipe" / "readers").glob("*.py"))
        if p.stat().st_size < 64_000 and p.name != "__init__.py"
    }


def _hostile_tar(path: Path, real: dict[str, bytes], mode: str) -> Path:
    with tarfile.open(path, mode, format=tarfile.GNU_FORMAT) as tar:

        def add(name: str, data: bytes | None = None, kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            info.size = len(data) if data is not None else 0
            tar.addfile(info, io.BytesIO(data) if data is not None else None)

        for name, data in real.items():
            add(name, data)
        add("a.py", b"x = 1\n")
        add("a.py", b"x = 2\n")
        add("a.py~2", b"x = 3\n")
        add("caf\udce9.py", b"y = 1\n")  # a name that is not UTF-8 (surrogate escape of byte 0xe9)
        add("../escape.py", b"z = 1\n")
        add("/abs/path.py", b"z = 2\n")
        add("link.py", kind=tarfile.SYMTYPE, link="/etc/passwd")
        add("hard.py", kind=tarfile.LNKTYPE, link="a.py")
        add("dev/null0", kind=tarfile.CHRTYPE)
        add("fifo", kind=tarfile.FIFOTYPE)
    return path


HOSTILE_MEMBERS = {
    "a.py~2": "unknown_language",
    "../escape.py": "unsafe_member_path",
    "/abs/path.py": "unsafe_member_path",
    "link.py": "link_member",
    "hard.py": "link_member",
    "dev/null0": "special_member",
    "fifo": "special_member",
}


def _zip_bomb(path: Path, real: dict[str, bytes], size: int) -> Path:
    """Real files, two members named a.py, and one member of ``size`` zero bytes (deflated ~1000:1)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for name, data in real.items():
            zf.writestr(name, data)
        zf.writestr("a.py", "x = 1\n")
        zf.writestr("a.py", "x = 2\n")
        info = zipfile.ZipInfo("bomb.py")
        info.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(info, "w", force_zip64=True) as f:
            chunk = b"0" * (1 << 20)
            for _ in range(size >> 20):
                f.write(chunk)
    return path


def test_archives_with_duplicate_unsafe_and_broken_members_keep_every_real_file(tmp_path: Path) -> None:
    real = _real_python()
    assert len(real) >= 8
    src = tmp_path / "in"
    src.mkdir()
    for mode, ext in (("w:gz", ".tar.gz"), ("w:bz2", ".tar.bz2"), ("w:xz", ".tar.xz"), ("w", ".tar")):
        _hostile_tar(src / f"hostile{ext}", real, mode)
    _zip_bomb(src / "bomb.zip", real, 80 << 20)
    whole = _hostile_tar(
        tmp_path / "whole.tar.gz", {f"f{i:02d}.py": data for i, data in enumerate(list(real.values()) * 3)}, "w:gz"
    ).read_bytes()
    (src / "truncated.tar.gz").write_bytes(whole[: len(whole) * 2 // 3])
    zipped = (src / "bomb.zip").read_bytes()
    (src / "cut.zip").write_bytes(zipped[: zipped.rindex(b"PK\x01\x02") - 10])  # central directory gone
    _tar(src / "empty.tar.gz", {})
    _tar(src / "empty.tar.bz2", {}, "w:bz2")
    with zipfile.ZipFile(src / "empty.zip", "w"):
        pass
    (src / "zero.tar.gz").write_bytes(b"")
    repo = src / "repo_folder"
    (repo / "pkg").mkdir(parents=True)
    for name, data in real.items():
        (repo / name).write_bytes(data)
    (repo / "pkg" / "secret.py").symlink_to("/etc/hostname")
    (repo / os.fsdecode(b"caf\xe9.py")).write_bytes(b"y = 1\n")
    sources = [{"name": "code", "kind": "code", "paths": ["in/*"]}]
    run = run_map(tmp_path, sources, "code", limits={"max_record_bytes": 8 << 20})

    def texts(docs: list[dict]) -> dict[str, str]:
        return {d["path"]: d["text"] for d in docs}

    expected_real = {name: data.decode() for name, data in real.items()}
    for ext in (".tar.gz", ".tar.bz2", ".tar.xz", ".tar"):
        docs, rejects = run.of(f"in/hostile{ext}")
        got = texts([d for d in docs if d["path"].startswith("pkg/")])
        assert got == expected_real, ext  # every real file, byte for byte
        ids = sorted(d["id"].split("#", 1)[1] for d in docs if not d["path"].startswith("pkg/"))
        n = len(real)  # member ordinals: real files 0..n-1, then a.py, a.py, a.py~2, the non-UTF-8 name
        assert ids == ["a.py", f"a.py//{n + 1}", f"caf\\xe9.py//{n + 3}"], ids  # unique, stable, escaped
        for name, reason in HOSTILE_MEMBERS.items():  # exactly one row each, naming the member
            rows = [r for r in rejects if r["path"] == name or repr(name) in r["detail"]]
            assert [r["reason"] for r in rows] == [reason], (ext, name, rows)
        assert len(rejects) == len(HOSTILE_MEMBERS)
        assert not any(
            ".." in r["id"].split("#", 1)[1] or r["id"].split("#", 1)[1].startswith("/abs") for r in rejects
        )  # ids never carry an escaping path
    docs, rejects = run.of("in/bomb.zip")
    assert texts([d for d in docs if d["path"].startswith("pkg/")]) == expected_real
    assert (
        sorted(d["id"].split("#", 1)[1] for d in docs if not d["path"].startswith("pkg/")) == ["a.py", "a.py//1"]
        or sorted(d["id"].split("#", 1)[1] for d in docs if d["path"] == "a.py")[0] == "a.py"
    )
    assert [(r["path"], r["reason"]) for r in rejects] == [("bomb.py", "record_too_large")]
    docs, rejects = run.of("in/cut.zip")  # no central directory: read from the local headers up to the damage
    assert texts([d for d in docs if d["path"].startswith("pkg/")]) == expected_real
    assert [r["reason"] for r in rejects] == ["record_too_large", "corrupt_archive"]  # the bomb, then the damage
    docs, rejects = run.of("in/truncated.tar.gz")  # members before the damage kept, one row for the rest
    assert 0 < len(docs) < 3 * len(real) and [r["reason"] for r in rejects] == ["corrupt_archive"]
    for d in docs:
        assert d["text"] == list(real.values())[int(d["path"][1:3]) % len(real)].decode()
    for name in ("empty.tar.gz", "empty.tar.bz2", "empty.zip", "zero.tar.gz"):
        assert [(r["reason"], r["id"].split("#")[1]) for r in run.of(f"in/{name}")[1]] == [
            ("empty_archive", "//empty_archive")
        ], name
    docs, rejects = run.of("in/repo_folder")
    assert texts(docs) == expected_real | {"caf\\xe9.py": "y = 1\n"}
    assert next(d["id"] for d in docs if d["path"] == "caf\\xe9.py").endswith("#caf\\xe9.py//0")
    assert [(r["path"], r["reason"]) for r in rejects] == [("pkg/secret.py", "symlink")]
    assert "/etc/hostname" in rejects[0]["detail"]
    # A rerun gives the very same ids (conservation across reruns needs stable ids).
    again = run_map(tmp_path, sources, "code-again", limits={"max_record_bytes": 8 << 20})
    assert sorted(r["id"] for r in again.docs + again.rejects) == sorted(r["id"] for r in run.docs + run.rejects)
    # More members than limits.max_archive_members: the first ones read, one row for the rest.
    few = run_map(
        tmp_path,
        [{"name": "code", "kind": "code", "paths": ["in/hostile.tar", "in/bomb.zip"]}],
        "few",
        limits={"max_archive_members": 5},
    )
    for name in ("in/hostile.tar", "in/bomb.zip"):  # a zip's directory is not even loaded: local headers
        docs, rejects = few.of(name)
        assert len(docs) == 5 and [r["reason"] for r in rejects] == ["too_many_members"], name


# ---------------------------------------------------------------- worst cases: memory in a subprocess

WORST = textwrap.dedent("""
    import sys, json, time
    from pathlib import Path
    from datapipe.pipeline.load import SourceConfig
    from datapipe.readers import reader_spec
    from datapipe.readers.base import InputFile

    def peak_kib():
        # VmHWM: this process's peak resident set since exec (ru_maxrss would also count the
        # forking pytest process's size, which Linux carries across exec).
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

    out = []
    for path, fmt, kind in json.loads(sys.argv[1]):
        path = Path(path)
        before, reasons, cpu = peak_kib(), [], time.process_time()
        for batch in reader_spec(fmt).read(InputFile(path, path.name, SourceConfig(name="s", kind=kind, paths=["x"])), 100):
            if batch.rejects is not None:
                reasons += batch.rejects.column("reason").to_pylist()
            reasons += ["doc"] * batch.docs.num_rows
        out.append({"reasons": reasons, "before_kib": before, "peak_kib": peak_kib(),
                    "cpu_s": round(time.process_time() - cpu, 3)})
    print(json.dumps(out))
""")


def test_worst_cases_stay_within_bounded_memory(tmp_path: Path) -> None:
    """Each input would cost gigabytes (or minutes) if a reader trusted it. One fresh process reads
    them in turn; the growth of its peak resident set during each must stay far below that (a
    generous 400 MiB on top of the imports: a held 128 MiB bomb alone would pass it as a str)."""
    if not Path("/proc/self/status").exists():
        pytest.skip("peak memory is read from /proc (Linux)")
    page = _page(1)
    warc = tmp_path / "liar.warc"  # a 10**12-byte Content-Length, then a 60 MB honest record skipped unread
    huge = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n<html><body><p>" + b"w " * (30 << 20)
    warc.write_bytes(
        _record("http://a/1", page)
        + _record("http://bad/", page, length=10**12)
        + _record("http://big/", huge)
        + _record("http://a/2", page)
    )
    deep = tmp_path / "deep.html"
    deep.write_text("<html><body>" + "<div>x" * 100_000 + "</body></html>")
    bomb = _zip_bomb(tmp_path / "bomb.zip", {"ok.py": b"x = 1\n"}, 128 << 20)  # 2x max_record_bytes, ~130 KB
    tex = tmp_path / "2101.00001.tex"
    tex.write_bytes(
        b"\\documentclass{article}\n" + b"\\def\\x{ unbalanced\n" * 30_000 + b"\\def\\a{\\a\\a\\a\\a}"
        b"\\begin{document}" + b"\\a " * 100_000 + b"\\end{document}"
    )
    cases = [
        (warc, "warc", "web", ["doc", "truncated_record", "page_too_large", "doc"]),
        (deep, "html", "web", ["too_deeply_nested"]),
        (bomb, "repo", "code", ["record_too_large", "doc", "doc", "doc"]),
        (tex, "arxiv", "paper", ["too_many_expansions"]),
    ]
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    arg = json.dumps([(str(p), fmt, kind) for p, fmt, kind, _ in cases])
    done = subprocess.run([sys.executable, "-c", WORST, arg], capture_output=True, text=True, env=env, timeout=110, check=True)
    results = json.loads(done.stdout.strip().splitlines()[-1])
    print(results)  # peak growth and CPU seconds per case, for the record (-s shows them)
    for (path, _, _, reasons), got in zip(cases, results):
        assert sorted(got["reasons"]) == sorted(reasons), (path.name, got)
        assert got["peak_kib"] - got["before_kib"] < 400 * 1024, (path.name, got)
