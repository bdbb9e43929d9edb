"""HTML pages to main text: charset detection, boilerplate-removing extraction, license evidence.

Shared by the WARC reader and the loose-HTML reader (``format: html``: .html/.htm files,
folders of them). Charset order: byte-order mark, HTTP header, ``<meta>`` tag, then the
bytes themselves. A declared charset is only trusted when the bytes decode under it without
error: pages re-encoded to GBK that still say ``utf-8`` are common in crawls.
"""

from __future__ import annotations

import codecs
import functools
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from datapipe.config.limits import ReadLimits
from datapipe.readers.archives import clean_name
from datapipe.readers.base import InputFile, ReadBatch, describe_error
from datapipe.readers.columns import ColumnsBuilder
from datapipe.readers.spec import ReaderSpec

if TYPE_CHECKING:
    from resiliparse.parse.html import HTMLTree

# WHATWG-style supersets: a page labelled gb2312 is decoded as GB18030, Shift_JIS as cp932, ...
_ALIASES = {
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "x-gbk": "gb18030",
    "gb_2312-80": "gb18030",
    "euc-cn": "gb18030",
    "big5": "big5hkscs",
    "x-x-big5": "big5hkscs",
    "big5-hkscs": "big5hkscs",
    "shift_jis": "cp932",
    "shift-jis": "cp932",
    "sjis": "cp932",
    "x-sjis": "cp932",
    "windows-31j": "cp932",
    "euc-kr": "cp949",
    "ks_c_5601-1987": "cp949",
    "iso-8859-1": "cp1252",
    "latin1": "cp1252",
    "latin-1": "cp1252",
    "us-ascii": "cp1252",
    "ascii": "cp1252",
    "tis-620": "cp874",
    "utf8": "utf-8",
}
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]{2,40})""", re.I)
_BOMS = [(codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")]
DETECT_BYTES = 64 << 10  # what charset detection looks at: enough for CJK statistics, bounded cost

MAX_HINTS = 8
_HINT_LEN = 200
# Every pattern starts with a literal and runs only behind a substring check: a page without
# evidence costs a few memchr-speed scans, not a regex walk over every tag.
# Case-sensitive on purpose: a literal prefix lets the regex engine skip ahead (re.I disables
# that), and attribute names and CC URLs are lower case on nearly every page.
_REL_LICENSE = re.compile(r"""rel\s*=\s*["']?[^"'>]{0,200}\b[Ll]icense\b""")  # bounded: linear on huge tags
_HREF = re.compile(r"""\bhref\s*=\s*["']?([^"'\s>]+)""", re.I)
_CC_URL = re.compile(r"""creativecommons\.org/(?:licenses|publicdomain)/[A-Za-z0-9._/-]+""")
_CC_ALT = re.compile(r"""alt\s*=\s*["']([^"'<>]{0,100}[Cc]reative\s*[Cc]ommons[^"'<>]{0,100})["']""")
_CC_ABBR = re.compile(r"""CC[ -](?:BY(?:[ -](?:NC|SA|ND)){0,2}|0)(?:[ -]\d\.\d)?\b|CC0\b""")
_CC_NAME = re.compile(r"""Creative Commons (?:Attribution|Zero|CC0)[A-Za-z -]{0,40}(?:\d\.\d)?""")


class HtmlOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    extractor: Literal["resiliparse", "trafilatura"] = Field(
        "resiliparse", description="resiliparse (fast, default) or trafilatura (slower, another main-content model)."
    )
    main_content: bool = Field(True, description="Drop navigation, headers, footers and other boilerplate.")
    max_bytes: int = Field(8 << 20, ge=1024, description="Pages larger than this are rejected (page_too_large).")


def normalize_charset(name: str | None) -> str | None:
    if not name:
        return None
    label = name.strip().strip("\"'").lower()
    label = _ALIASES.get(label, label)
    try:
        return codecs.lookup(label).name
    except LookupError:
        return None


def meta_charset(raw: bytes) -> str | None:
    m = _META_CHARSET.search(raw[:4096])  # the spec puts it in the first 1024 bytes; be lenient
    return normalize_charset(m.group(1).decode("ascii", "ignore")) if m else None


def decode_html(raw: bytes, header_charset: str | None = None) -> tuple[str, str]:
    """(text, charset name): the first of BOM / header / meta / detection that decodes cleanly."""
    for bom, name in _BOMS:
        if raw.startswith(bom):
            return raw.decode(name, "replace"), name
    tried: set[str] = set()
    for cand in (normalize_charset(header_charset), meta_charset(raw), "utf-8"):
        if cand and cand not in tried:
            tried.add(cand)
            try:
                return raw.decode(cand), cand
            except UnicodeDecodeError:
                continue
    from charset_normalizer import from_bytes  # only pages that fail every declared charset pay for this

    best = from_bytes(raw[:DETECT_BYTES]).best()
    detected = normalize_charset(best.encoding) if best is not None else None
    name = detected or "cp1252"
    return raw.decode(name, "replace"), name


def license_hints(html: str) -> str | None:
    """Short JSON list of license evidence in the page (rel=license links, CC URLs, badge alts,
    "CC BY-SA 4.0" snippets); None when there is none. Never the page itself."""
    found: dict[str, None] = {}

    def keep(value: str) -> None:
        value = value.strip()
        if value and len(found) < MAX_HINTS:
            found[value[:_HINT_LEN]] = None

    if "icense" in html or "ICENSE" in html:
        for i, m in enumerate(_REL_LICENSE.finditer(html)):
            if i >= 4 * MAX_HINTS:
                break  # each match looks at its whole tag: bounded, so many matches in one huge tag stay linear
            lo = html.rfind("<", max(m.start() - 4096, 0), m.start())
            hi = html.find(">", m.end(), m.end() + 4096)
            tag = html[max(lo, m.start() - 4096) : hi + 1 if hi >= 0 else m.end()]
            if h := _HREF.search(tag):
                keep(h.group(1))
    if "creativecommons.org" in html:
        for m in _CC_URL.finditer(html):
            keep(m.group(0))
    if "ommons" in html:
        for m in _CC_ALT.finditer(html):
            keep(m.group(1))
        for m in _CC_NAME.finditer(html):
            keep(m.group(0))
    if "CC" in html:
        for m in _CC_ABBR.finditer(html):
            keep(m.group(0))
    return json.dumps(list(found), ensure_ascii=False) if found else None


_QUICK_DEPTH = 64


@functools.lru_cache(maxsize=4)
def _depth_selector(max_depth: int) -> str:
    return " > ".join(["*"] * (max_depth + 1))


def parse_checked(html: str, limits: ReadLimits) -> tuple[HTMLTree | None, tuple[str, str] | None]:
    """(parsed resiliparse tree, None), or (None, (reason, detail)) when the page must not be extracted.

    Parsing (lexbor, C) is linear even for 100,000 nested elements; what is not is extraction,
    whose cost grows with elements x depth (8,000 nested divs take seconds, 100,000 minutes).
    The depth check is a CSS child-combinator chain of max_depth + 1 ``*``: lexbor matches it
    right to left, walking up at most max_depth + 1 parents per element, in C, and the tree is
    then reused for extraction."""
    if len(html) > limits.max_record_bytes:
        return None, ("record_too_large", f"{len(html)} characters > limits.max_record_bytes {limits.max_record_bytes}")
    from resiliparse.parse.html import HTMLTree

    tree = HTMLTree.parse(html)
    doc, cap = tree.document, limits.max_html_depth
    # Cheapest first: a tree of at most ``cap`` elements cannot be deeper than ``cap`` (counting them
    # is a C walk). lexbor parses a selector on every query, at a cost growing with its length: a
    # short chain next (real pages are rarely 64 deep), the full one only for pages deeper than that.
    if (
        doc is not None
        and len(doc.get_elements_by_tag_name("*")) > cap
        and doc.query_selector(_depth_selector(min(cap, _QUICK_DEPTH))) is not None
        and (cap <= _QUICK_DEPTH or doc.query_selector(_depth_selector(cap)) is not None)
    ):
        return None, ("too_deeply_nested", f"elements nest deeper than limits.max_html_depth {cap}")
    return tree, None


def extract_text(html: str, extractor: str = "resiliparse", main_content: bool = True, tree: HTMLTree | None = None) -> str:
    """Main text of a page; ``tree``: the page already parsed by parse_checked (resiliparse only)."""
    if extractor == "trafilatura":
        import trafilatura

        return trafilatura.extract(html, favor_recall=not main_content, include_comments=False) or ""
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    return extract_plain_text(tree or HTMLTree.parse(html), main_content=main_content, alt_texts=False).strip()


def read_html(file: InputFile, batch_size: int) -> Iterator[ReadBatch]:
    """Loose HTML: one file, or every .html/.htm file under a folder (links not followed)."""
    opts = HtmlOptions.model_validate(file.source.options)
    out = web_builder(file, batch_size)
    limits = file.limits
    root = file.path
    paths = [root] if root.is_file() else sorted(_html_files(root, out))
    for ordinal, p in enumerate(paths):
        rel, escaped = clean_name(p.name if p == root else p.relative_to(root).as_posix())
        if escaped:  # a file name that is not UTF-8: \\xNN escapes, and the ordinal keeps the id unique
            rel = f"{rel}//{ordinal}"
        try:
            size = p.stat().st_size
            if size > limits.max_record_bytes:
                out.reject_row(
                    rel, "record_too_large", f"{size} bytes > limits.max_record_bytes {limits.max_record_bytes}", path=rel
                )
                continue
            if size > opts.max_bytes:
                out.reject_row(rel, "page_too_large", f"{size} bytes > max_bytes {opts.max_bytes}", path=rel)
                continue
            raw = p.read_bytes()
        except OSError as exc:
            out.reject_row(rel, "unreadable_input", describe_error(exc), path=rel)
            continue
        html, charset = decode_html(raw)
        tree, bad = parse_checked(html, limits)
        if bad:
            out.reject_row(rel, bad[0], bad[1], path=rel, charset=charset, content_type="text/html")
            continue
        text = extract_text(html, opts.extractor, opts.main_content, tree)
        meta = {"charset": charset, "license_hints": license_hints(html), "content_type": "text/html"}
        if not text:
            out.reject_row(rel, "extraction_empty", "no main text in the page", path=rel, **meta)
        else:
            out.add_row(rel, text, path=rel, **meta)
        if out.full():
            yield out.flush()  # type: ignore[misc]
    if (last := out.flush()) is not None:
        yield last


def _html_files(root: Path, out: ColumnsBuilder) -> Iterator[Path]:
    """HTML files under a folder; a symlinked page is an input we refuse to follow: one reject row."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if not name.lower().endswith((".html", ".htm", ".xhtml")):
                continue
            if p.is_symlink():
                rel = clean_name(p.relative_to(root).as_posix())[0]
                out.reject_row(rel, "symlink", f"symlink to {clean_name(os.readlink(p))[0]!r} not followed", path=rel)
            elif p.is_file():
                yield p


WEB_COLUMNS = {
    "domain": "string",
    "warc_record_id": "string",
    "fetch_date": "string",
    "content_type": "string",
    "http_status": "int32",
    "charset": "string",
    "license_hints": "string",
}


class _RecordColumns(TypedDict):
    domain: str | None
    warc_record_id: str | None
    fetch_date: str | None
    content_type: str | None
    http_status: int | None


class WebColumns(_RecordColumns, total=False):
    """Values of the WEB_COLUMNS for one record (keyword arguments of ColumnsBuilder.add_row/reject_row):
    the charset and licence hints are known once the page is decoded."""

    charset: str
    license_hints: str | None


def web_builder(file: InputFile, batch_size: int) -> ColumnsBuilder:
    return ColumnsBuilder.create(file, batch_size, WEB_COLUMNS)


# A page file, or a folder of them (a saved site) in a source of kind web.
SPEC = ReaderSpec(
    "html", read_html, HtmlOptions, suffixes=(".html", ".htm", ".xhtml"), folders=True, folder_kinds=frozenset({"web"})
)
