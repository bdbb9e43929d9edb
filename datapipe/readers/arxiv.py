"""arXiv LaTeX sources (.tar.gz of many files, a gzipped single .tex, a .tex, or a folder) to paper text.

The main file is the one with ``\\documentclass`` (ties: it has ``\\begin{document}``, then
the common names main/ms/paper, then the longest). ``\\input``/``\\include``/``\\subfile`` are
resolved from the same source (depth and cycles bounded); comments, the preamble and the
bibliography are dropped; simple ``\\newcommand``/``\\def``/``\\DeclareMathOperator`` macros
(not ``\\renewcommand``: that redefines LaTeX's own commands, usually for layout) are expanded.
Sections and math stay as LaTeX text, as in RedPajama's arXiv subset.

Metadata (``options.metadata``: arXiv metadata JSONL with id, license, categories, as in
the Kaggle snapshot) is joined by the arXiv id taken from the input name (``1603.07285v2.tar.gz``,
``hep-th9901001.gz``, ``arXiv-1603.07285.tar.gz``).
"""

from __future__ import annotations

import functools
import json
import posixpath
import re
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from datapipe.license.code import is_license_file
from datapipe.readers.archives import Caps, Member, iter_archive
from datapipe.readers.base import InputFile, ReadBatch
from datapipe.readers.columns import ColumnsBuilder

PAPER_COLUMNS = {"arxiv_id": "string", "license_url": "string", "categories": "string", "license_files": "string"}
LICENSE_FILE_BYTES = 64 << 10  # as for code: a licence text is far shorter
MAX_INCLUDE_DEPTH = 8
MAX_GROWTH = 4  # macro expansion may not make the text more than this many times longer

_ARXIV_ID = re.compile(r"(?:arxiv[-_:]?)?(\d{4}\.\d{4,5}|[a-z-]+(?:\.[A-Z]{2})?[_/]?\d{7})(?:v\d+)?", re.I)
_COMMENT = re.compile(r"(?<!\\)((?:\\\\)*)%.*")
_COMMENT_LINE = re.compile(r"^[ \t]*(?<!\\)%.*\n", re.M)
_COMMENT_ENV = re.compile(r"\\begin\{comment\}.*?\\end\{comment\}", re.S)
_INCLUDE = re.compile(r"\\(?:input|include|subfile)\s*(?:\{([^}]+)\}|\s([\w./-]+))")
_BIB = re.compile(r"\\begin\{thebibliography\}.*?\\end\{thebibliography\}|\\bibliography\{[^}]*\}|"
                  r"\\bibliographystyle\{[^}]*\}|\\printbibliography(?:\[[^\]]*\])?|\\addbibresource\{[^}]*\}", re.S)
_DEFINE = re.compile(r"\\(newcommand|providecommand|DeclareMathOperator|def)\*?\s*")


class ArxivOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    metadata: str | None = Field(None, description="arXiv metadata JSONL (id, license, categories) joined by id; "
                                                   "relative paths resolve against the pipeline file's folder.")
    max_member_bytes: int = Field(32 << 20, ge=1024, description="Largest file read from a source archive.")
    max_archive_bytes: int = Field(512 << 20, ge=1024, description="Decompressed bytes read from one source at most.")


def arxiv_id_from_name(name: str) -> str | None:
    stem = re.sub(r"\.(tar\.gz|tgz|tar|gz|zip|tex)$", "", Path(name).name, flags=re.I)
    m = _ARXIV_ID.fullmatch(stem)
    return m.group(1).replace("_", "/") if m else None


@functools.lru_cache(maxsize=4)
def load_metadata(path: str, mtime: float) -> dict[str, tuple[str | None, str | None]]:
    """id -> (license URL, categories) for the whole metadata file, cached per process (keyed by mtime)."""
    out: dict[str, tuple[str | None, str | None]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("id"), str):
                out[row["id"]] = (row.get("license") or None, row.get("categories") or None)
    return out


def resolve_option_path(file: InputFile, value: str) -> Path:
    """A path option relative to the pipeline file's folder (which InputFile.name is relative to)."""
    p = Path(value).expanduser()
    if p.is_absolute():
        return p
    name_parts = Path(file.name).parts
    base = file.path.parents[len(name_parts) - 1] if not Path(file.name).is_absolute() and \
        file.path.parts[-len(name_parts):] == name_parts else file.path.parent
    return base / p


def metadata_columns(file: InputFile, metadata: str | None, arxiv_id: str | None) -> dict[str, object]:
    cols: dict[str, object] = {"arxiv_id": arxiv_id, "license_url": None, "categories": None, "license_files": None}
    if metadata and arxiv_id:
        path = resolve_option_path(file, metadata)
        cols["license_url"], cols["categories"] = load_metadata(str(path), path.stat().st_mtime).get(arxiv_id,
                                                                                                     (None, None))
    return cols


def strip_comments(tex: str) -> str:
    tex = _COMMENT_ENV.sub("", tex)
    tex = _COMMENT_LINE.sub("", tex)  # whole-line comments go with their newline: paragraphs stay joined
    return _COMMENT.sub(r"\1", tex)


def find_main(files: dict[str, str]) -> str | None:
    has_class = [n for n, t in files.items() if re.search(r"^[ \t]*\\documentclass", t, re.M)]
    if not has_class:
        return None
    return max(has_class, key=lambda n: ("\\begin{document}" in files[n],
                                         posixpath.splitext(posixpath.basename(n))[0].lower() in ("main", "ms", "paper"),
                                         len(files[n])))


def resolve_includes(text: str, files: dict[str, str], here: str, depth: int = 0, stack: tuple[str, ...] = ()) -> str:
    def sub(m: re.Match[str]) -> str:
        target = (m.group(1) or m.group(2) or "").strip()
        for cand in (target, target + ".tex"):
            for name in (posixpath.normpath(posixpath.join(posixpath.dirname(here), cand)), posixpath.normpath(cand)):
                if name in files and name not in stack:
                    if depth >= MAX_INCLUDE_DEPTH:
                        return ""
                    return resolve_includes(strip_comments(files[name]), files, name, depth + 1, (*stack, name))
        return ""  # a missing file (or a cycle) contributes nothing

    return _INCLUDE.sub(sub, text)


def _group(s: str, i: int) -> tuple[str, int] | None:
    """The brace group starting at s[i] == '{' (contents, index after it); None if unbalanced."""
    if i >= len(s) or s[i] != "{":
        return None
    depth = 0
    for j in range(i, len(s)):
        c = s[j]
        if c == "\\":
            continue
        if c == "{" and (j == 0 or s[j - 1] != "\\"):
            depth += 1
        elif c == "}" and s[j - 1] != "\\":
            depth -= 1
            if depth == 0:
                return s[i + 1: j], j + 1
    return None


def collect_macros(tex: str) -> tuple[dict[str, tuple[int, str]], str]:
    """Simple macro definitions (name -> (number of args, body)), and the text without them."""
    macros: dict[str, tuple[int, str]] = {}
    out, pos = [], 0
    for m in _DEFINE.finditer(tex):
        if m.start() < pos:
            continue
        i = m.end()
        kind = m.group(1)
        nm = re.match(r"\{?\s*\\([A-Za-z@]+)\s*\}?", tex[i:])
        if not nm:
            continue
        name, i = nm.group(1), i + nm.end()
        nargs = 0
        if kind == "def":
            params = re.match(r"(#\d)*", tex[i:])
            nargs, i = len(params.group(0)) // 2, i + params.end()  # type: ignore[union-attr]
        else:
            opt = re.match(r"\s*\[(\d)\]", tex[i:])
            if opt:
                nargs, i = int(opt.group(1)), i + opt.end()
            if re.match(r"\s*\[", tex[i:]):
                continue  # an optional-argument default: not a simple macro, left as it is
        while i < len(tex) and tex[i] in " \t\n":
            i += 1
        group = _group(tex, i)
        if group is None:
            continue
        body, end = group
        macros[name] = (nargs, body)
        out.append(tex[pos: m.start()])
        pos = end
    out.append(tex[pos:])
    return macros, "".join(out)


def expand_macros(tex: str, macros: dict[str, tuple[int, str]], rounds: int = 4) -> str:
    if not macros:
        return tex
    pattern = re.compile(r"\\(" + "|".join(re.escape(n) for n in sorted(macros, key=len, reverse=True)) +
                         r")(?![A-Za-z@])")
    limit = max(len(tex) * MAX_GROWTH, 1 << 16)
    for _ in range(rounds):
        out, pos, changed = [], 0, False
        for m in pattern.finditer(tex):
            if m.start() < pos:
                continue
            nargs, body = macros[m.group(1)]
            i, args = m.end(), []
            for _ in range(nargs):
                while i < len(tex) and tex[i] in " \t":
                    i += 1
                group = _group(tex, i)
                if group is None:
                    break
                args.append(group[0])
                i = group[1]
            if len(args) < nargs:
                continue  # unbraced arguments: leave the call as written
            text = body
            for k, a in enumerate(args, start=1):
                text = text.replace(f"#{k}", a)
            out.append(tex[pos: m.start()])
            out.append(text + (" " if nargs == 0 and i < len(tex) and tex[i].isalpha() else ""))
            pos, changed = i, True
        out.append(tex[pos:])
        new = "".join(out)
        if len(new) > limit:
            break  # runaway (recursive) definitions: keep the last bounded text
        tex = new
        if not changed:
            break
    return tex


def flatten(files: dict[str, str]) -> tuple[str | None, str, str]:
    """(main file or None, clean text, reason detail when there is no text)."""
    main = find_main(files)
    if main is None:
        return None, "", "no .tex file with \\documentclass"
    tex = resolve_includes(strip_comments(files[main]), files, main, stack=(main,))
    macros, tex = collect_macros(tex)
    begin, end = tex.find("\\begin{document}"), tex.rfind("\\end{document}")
    body = tex[begin + len("\\begin{document}"): end if end > begin else len(tex)] if begin >= 0 else tex
    body = _BIB.sub("", body)
    body = expand_macros(body, macros)
    body = re.sub(r"[ \t]+\n", "\n", body)
    body = re.sub(r"\n{3,}", "\n\n", body).strip()
    return main, body, "" if body else "empty document body"


def _is_tex_name(name: str) -> bool:
    """.tex files, and the bare name of a gzipped single-file source (1603.07285 after .gz)."""
    base = posixpath.basename(name)
    return base.lower().endswith((".tex", ".ltx")) or "." not in base or arxiv_id_from_name(base) is not None


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")  # old arXiv sources are often Latin-1; TeX itself is byte-oriented


def licenses_beside(main: str, licenses: dict[str, str]) -> str | None:
    """JSON {path: text} of the licence files in the main file's folder or a folder above it
    (a paper repository's LICENSE at its root covers a main file in paper/)."""
    here = posixpath.dirname(main)
    near = {p: t for p, t in sorted(licenses.items())
            if (d := posixpath.dirname(p)) == "" or here == d or here.startswith(d + "/")}
    return json.dumps(near, ensure_ascii=False, sort_keys=True) if near else None


def read_arxiv(file: InputFile, batch_size: int) -> Iterator[ReadBatch]:
    opts = ArxivOptions.model_validate(file.source.options)
    out = ColumnsBuilder.create(file, batch_size, PAPER_COLUMNS)
    cols = metadata_columns(file, opts.metadata, arxiv_id_from_name(file.name))
    caps = Caps(member_bytes=opts.max_member_bytes, archive_bytes=opts.max_archive_bytes)
    files: dict[str, str] = {}
    licenses: dict[str, str] = {}  # LICENSE / COPYING files beside the sources, for license tagging
    problems: list[Member] = []
    if file.path.is_dir():
        members: Iterator[Member] = (Member(p.relative_to(file.path).as_posix(), p.read_bytes())
                                     for p in sorted(file.path.rglob("*")) if p.is_file() and not p.is_symlink()
                                     and (p.suffix == ".tex" or is_license_file(p.name))
                                     and p.stat().st_size <= caps.member_bytes)
    else:
        members = iter_archive(file.path, caps, lambda n: _is_tex_name(n) or is_license_file(n))
        if file.path.suffix.lower() in (".tex", ".ltx"):  # a lone .tex: the licence files in its folder
            licenses = {p.name: _decode(p.read_bytes()[:LICENSE_FILE_BYTES]) for p in sorted(file.path.parent.iterdir())
                        if is_license_file(p.name) and p.suffix.lower() not in (".tex", ".ltx")
                        and p.is_file() and not p.is_symlink()}
    for m in members:
        if m.data is None:
            problems.append(m)
        elif is_license_file(m.name) and not m.name.lower().endswith((".tex", ".ltx")):
            licenses[m.name] = _decode(m.data[:LICENSE_FILE_BYTES])
        else:
            files[m.name if m.name.lower().endswith((".tex", ".ltx")) or file.path.is_dir() else m.name + ".tex"] = \
                _decode(m.data)
    for i, m in enumerate(problems):  # unsafe members, bombs, corruption: each one reject row
        out.reject_row(f"{m.name or 'archive'}:{m.reason}:{i}", m.reason or "", m.detail, path=m.name or None, **cols)
    main, text, detail = flatten(files)
    fatal = any(m.reason in ("corrupt_archive", "archive_too_large") for m in problems)
    if main is None:
        if not fatal:  # a corrupt archive already said why there is no paper
            out.reject_row("paper", "no_main_tex", detail, **cols)
    elif not text:
        out.reject_row(main, "extraction_empty", detail, path=main, **cols)
    else:
        out.add_row(main, text, path=main, **(cols | {"license_files": licenses_beside(main, licenses)}))
    if (last := out.flush()) is not None:
        yield last
