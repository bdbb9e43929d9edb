"""arXiv LaTeX sources (.tar.gz of many files, a gzipped single .tex, a .tex, or a folder) to paper text.

The main file is the one with ``\\documentclass`` (ties: it has ``\\begin{document}``, then
the common names main/ms/paper, then the longest). ``\\input``/``\\include``/``\\subfile`` are
resolved from the same source (depth and cycles bounded); comments, the preamble and the
bibliography are dropped; simple ``\\newcommand``/``\\def``/``\\DeclareMathOperator`` macros
(not ``\\renewcommand``: that redefines LaTeX's own commands, usually for layout) are expanded.
Sections and math stay as LaTeX text, as in RedPajama's arXiv subset.

Hostile sources stay linear: braces are matched once per pass, definitions and calls are found
with one generic scan, and nothing rescans the text per opener. A paper needing more than
``limits.max_tex_expansions`` macro expansions (or whose expansion grows the text past
MAX_GROWTH times) is rejected as ``too_many_expansions``: we reject rather than keep a partly
expanded text, because a runaway definition means the macros cannot be trusted anywhere in it.
Includes past ``limits.max_record_bytes`` in total are ``record_too_large``.

Metadata (``options.metadata``: arXiv metadata JSONL with id, license, categories, as in
the Kaggle snapshot) is joined by the arXiv id taken from the input name (``1603.07285v2.tar.gz``,
``hep-th9901001.gz``, ``arXiv-1603.07285.tar.gz``).
"""

from __future__ import annotations

import functools
import json
import os
import posixpath
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

from pydantic import BaseModel, ConfigDict, Field

from datapipe.config.limits import DEFAULT_LIMITS, ReadLimits
from datapipe.readers.archives import ARCHIVE_PROBLEMS, Caps, Member, MemberAt, MemberIds, clean_name, iter_archive
from datapipe.readers.base import InputFile, LimitExceeded, ReadBatch
from datapipe.readers.columns import ColumnsBuilder
from datapipe.readers.spec import ReaderSpec


def is_license_file(name: str) -> bool:
    """``datapipe.license.code_repos.is_license_file``, imported on the first call: the license detectors
    compile ~140 regular expressions at import (~0.1 CPU s), which a process that imports this module
    only through the JSONL or Parquet reader (every web pipeline's driver and workers) never uses."""
    from datapipe.license.code_repos import is_license_file as check

    return check(name)


PAPER_COLUMNS = {"arxiv_id": "string", "license_url": "string", "categories": "string", "license_files": "string"}


class PaperColumns(TypedDict):
    """Values of the PAPER_COLUMNS for one paper (keyword arguments of ColumnsBuilder.add_row/reject_row)."""

    arxiv_id: str | None
    license_url: str | None
    categories: str | None
    license_files: str | None


LICENSE_FILE_BYTES = 64 << 10  # as for code: a licence text is far shorter
MAX_INCLUDE_DEPTH = 8
MAX_GROWTH = 4  # macro expansion may not make the text more than this many times longer

_ARXIV_ID = re.compile(r"(?:arxiv[-_:]?)?(\d{4}\.\d{4,5}|[a-z-]+(?:\.[A-Z]{2})?[_/]?\d{7})(?:v\d+)?", re.I)
# Every pattern here is linear on hostile input: no lazy ``.*?`` that an unclosed opener would make
# rescan to the end of the text once per opener, bounded classes inside braces, positions passed
# to match() instead of slicing the text (a slice per definition was quadratic).
_COMMENT_LINE = re.compile(r"^[ \t]*%.*\n", re.M)
_INCLUDE = re.compile(r"\\(?:input|include|subfile)\s*(?:\{([^{}\n]{1,512})\}|\s([\w./-]{1,512}))")
_BIB = re.compile(
    r"\\bibliography\{[^{}]{0,4096}\}|\\bibliographystyle\{[^{}]{0,512}\}|"
    r"\\printbibliography(?:\[[^\]]{0,512}\])?|\\addbibresource\{[^{}]{0,4096}\}"
)
_DEFINE = re.compile(r"\\(newcommand|providecommand|DeclareMathOperator|def)\*?\s*")
_DEF_NAME = re.compile(r"\{?\s*\\([A-Za-z@]+)\s*\}?")
_DEF_PARAMS = re.compile(r"(?:#\d)*")
_NARGS = re.compile(r"\s*\[(\d)\]")
_OPT_DEFAULT = re.compile(r"\s*\[")
_CONTROL_WORD = re.compile(r"\\([A-Za-z@]+)")
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.S)


class ArxivOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    metadata: str | None = Field(
        None,
        description="arXiv metadata JSONL (id, license, categories) joined by id; "
        "relative paths resolve against the pipeline file's folder.",
    )
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
    base = (
        file.path.parents[len(name_parts) - 1]
        if not Path(file.name).is_absolute() and file.path.parts[-len(name_parts) :] == name_parts
        else file.path.parent
    )
    return base / p


def metadata_columns(file: InputFile, metadata: str | None, arxiv_id: str | None) -> PaperColumns:
    cols: PaperColumns = {"arxiv_id": arxiv_id, "license_url": None, "categories": None, "license_files": None}
    if metadata and arxiv_id:
        path = resolve_option_path(file, metadata)
        cols["license_url"], cols["categories"] = load_metadata(str(path), path.stat().st_mtime).get(arxiv_id, (None, None))
    return cols


def _drop_env(tex: str, begin: str, end: str) -> str:
    """``tex`` without every begin...end span (an unclosed one runs to the end, as in LaTeX): str.find, linear."""
    if begin not in tex:
        return tex
    out, pos = [], 0
    while (i := tex.find(begin, pos)) >= 0:
        out.append(tex[pos:i])
        j = tex.find(end, i + len(begin))
        if j < 0:
            return "".join(out)
        pos = j + len(end)
    out.append(tex[pos:])
    return "".join(out)


def _strip_line_comment(line: str) -> str:
    i = line.find("%")
    while i >= 0:
        k = i
        while k > 0 and line[k - 1] == "\\":
            k -= 1
        if (i - k) % 2 == 0:  # an even run of backslashes before it: the % is not escaped
            return line[:i]
        i = line.find("%", i + 1)
    return line


def strip_comments(tex: str) -> str:
    tex = _drop_env(tex, "\\begin{comment}", "\\end{comment}")
    tex = _COMMENT_LINE.sub("", tex)  # whole-line comments go with their newline: paragraphs stay joined
    if "%" not in tex:
        return tex
    return "\n".join(_strip_line_comment(line) if "%" in line else line for line in tex.split("\n"))


def find_main(files: dict[str, str]) -> str | None:
    has_class = [n for n, t in files.items() if re.search(r"^[ \t]*\\documentclass", t, re.M)]
    if not has_class:
        return None
    return max(
        has_class,
        key=lambda n: (
            "\\begin{document}" in files[n],
            posixpath.splitext(posixpath.basename(n))[0].lower() in ("main", "ms", "paper"),
            len(files[n]),
        ),
    )


def resolve_includes(
    text: str, files: dict[str, str], here: str, depth: int = 0, stack: tuple[str, ...] = (), budget: list[int] | None = None
) -> str:
    """``text`` with its \\input/\\include files inlined. ``budget`` ([characters left]) stops a file
    included thousands of times (or a fan-out of includes) from growing the text without bound."""
    budget = budget if budget is not None else [1 << 62]

    def sub(m: re.Match[str]) -> str:
        target = (m.group(1) or m.group(2) or "").strip()
        for cand in (target, target + ".tex"):
            for name in (posixpath.normpath(posixpath.join(posixpath.dirname(here), cand)), posixpath.normpath(cand)):
                if name in files and name not in stack:
                    if depth >= MAX_INCLUDE_DEPTH:
                        return ""
                    budget[0] -= len(files[name])
                    if budget[0] < 0:
                        raise LimitExceeded(
                            "record_too_large", "included files make the paper longer than limits.max_record_bytes"
                        )
                    return resolve_includes(strip_comments(files[name]), files, name, depth + 1, (*stack, name), budget)
        return ""  # a missing file (or a cycle) contributes nothing

    return _INCLUDE.sub(sub, text)


def brace_pairs(s: str) -> dict[int, int]:
    """Index of each balanced ``{`` -> index of its ``}`` (escaped braces skipped): one linear pass,
    so finding an argument is a lookup instead of a scan that an unbalanced brace makes run to the end."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE_TOKEN.finditer(s):
        c = m.group(0)
        if c == "{":
            stack.append(m.start())
        elif c == "}":
            if stack:
                pairs[stack.pop()] = m.start()
    return pairs


def _group(s: str, i: int, pairs: dict[int, int]) -> tuple[str, int] | None:
    """The brace group starting at s[i] == '{' (contents, index after it); None if unbalanced."""
    j = pairs.get(i)
    return None if j is None else (s[i + 1 : j], j + 1)


def collect_macros(tex: str) -> tuple[dict[str, tuple[int, str]], str]:
    """Simple macro definitions (name -> (number of args, body)), and the text without them."""
    macros: dict[str, tuple[int, str]] = {}
    out, pos = [], 0
    pairs = brace_pairs(tex)
    n = len(tex)
    for m in _DEFINE.finditer(tex):
        if m.start() < pos:
            continue
        i = m.end()
        kind = m.group(1)
        nm = _DEF_NAME.match(tex, i)
        if not nm:
            continue
        name, i = nm.group(1), nm.end()
        nargs = 0
        if kind == "def":
            params = _DEF_PARAMS.match(tex, i)
            nargs, i = len(params.group(0)) // 2, params.end()  # type: ignore[union-attr]
        else:
            opt = _NARGS.match(tex, i)
            if opt:
                nargs, i = int(opt.group(1)), opt.end()
            if _OPT_DEFAULT.match(tex, i):
                continue  # an optional-argument default: not a simple macro, left as it is
        while i < n and tex[i] in " \t\n":
            i += 1
        group = _group(tex, i, pairs)
        if group is None:
            continue
        body, end = group
        macros[name] = (nargs, body)
        out.append(tex[pos : m.start()])
        pos = end
    out.append(tex[pos:])
    return macros, "".join(out)


def expand_macros(
    tex: str, macros: dict[str, tuple[int, str]], rounds: int = 4, max_expansions: int = DEFAULT_LIMITS.max_tex_expansions
) -> str:
    """Expand simple macros, ``rounds`` passes (macros using macros); each pass is linear: a generic
    control-word scan with a dict lookup, never one regex alternative per macro. More than
    ``max_expansions`` expansions, or text growing past MAX_GROWTH times (a recursive \\def used
    many times), raises LimitExceeded: the paper is a runaway, not text."""
    if not macros:
        return tex
    limit = max(len(tex) * MAX_GROWTH, 1 << 16)
    done = 0
    for _ in range(rounds):
        out, pos, changed, size = [], 0, False, 0
        pairs = brace_pairs(tex)
        n = len(tex)
        for m in _CONTROL_WORD.finditer(tex):
            if m.start() < pos or (macro := macros.get(m.group(1))) is None:
                continue
            nargs, body = macro
            i, args = m.end(), []
            for _ in range(nargs):
                while i < n and tex[i] in " \t":
                    i += 1
                group = _group(tex, i, pairs)
                if group is None:
                    break
                args.append(group[0])
                i = group[1]
            if len(args) < nargs:
                continue  # unbraced arguments: leave the call as written
            done += 1
            if done > max_expansions:
                raise LimitExceeded(
                    "too_many_expansions",
                    f"more than limits.max_tex_expansions {max_expansions} macro expansions (last: \\{m.group(1)})",
                )
            text = body
            for k, a in enumerate(args, start=1):
                text = text.replace(f"#{k}", a)
            piece = tex[pos : m.start()]
            out.append(piece)
            out.append(text + (" " if nargs == 0 and i < n and tex[i].isalpha() else ""))
            size += len(piece) + len(text) + 1
            if size > limit:
                raise LimitExceeded(
                    "too_many_expansions",
                    f"macro expansion makes the text more than {MAX_GROWTH}x "
                    f"longer (a recursive definition such as \\{m.group(1)})",
                )
            pos, changed = i, True
        out.append(tex[pos:])
        tex = "".join(out)
        if not changed:
            break
    return tex


def flatten(files: dict[str, str], limits: ReadLimits = DEFAULT_LIMITS) -> tuple[str | None, str, str]:
    """(main file or None, clean text, reason detail when there is no text); raises LimitExceeded past a cap."""
    main = find_main(files)
    if main is None:
        return None, "", "no .tex file with \\documentclass"
    tex = resolve_includes(
        strip_comments(files[main]), files, main, stack=(main,), budget=[limits.max_record_bytes - len(files[main])]
    )
    macros, tex = collect_macros(tex)
    begin, end = tex.find("\\begin{document}"), tex.rfind("\\end{document}")
    body = tex[begin + len("\\begin{document}") : end if end > begin else len(tex)] if begin >= 0 else tex
    body = _drop_env(body, "\\begin{thebibliography}", "\\end{thebibliography}")
    body = _BIB.sub("", body)
    body = expand_macros(body, macros, max_expansions=limits.max_tex_expansions)
    body = "\n".join(line.rstrip(" \t") for line in body.split("\n"))  # not [ \t]+\n: quadratic on long runs
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
    near = {
        p: t for p, t in sorted(licenses.items()) if (d := posixpath.dirname(p)) == "" or here == d or here.startswith(d + "/")
    }
    return json.dumps(near, ensure_ascii=False, sort_keys=True) if near else None


def _folder_members(root: Path, caps: Caps, max_record_bytes: int) -> Iterator[Member]:
    """.tex and licence files of an unpacked source folder; symlinks and files over the cap are reject items."""
    wanted = (p for p in sorted(root.rglob("*")) if p.suffix == ".tex" or is_license_file(p.name))
    for ordinal, p in enumerate(wanted):
        name, escaped = clean_name(p.relative_to(root).as_posix())
        at: MemberAt = {"ordinal": ordinal, "escaped": escaped}
        if p.is_symlink():
            yield Member(name, reason="symlink", detail=f"symlink to {clean_name(os.readlink(p))[0]!r} not followed", **at)
        elif p.is_file():
            size = p.stat().st_size
            if size > caps.member_bytes:
                reason = "record_too_large" if size > max_record_bytes else "member_too_large"
                yield Member(name, reason=reason, detail=f"{size} bytes > cap {caps.member_bytes}", size=size, **at)
            else:
                yield Member(name, p.read_bytes(), **at)


def read_arxiv(file: InputFile, batch_size: int) -> Iterator[ReadBatch]:
    opts = ArxivOptions.model_validate(file.source.options)
    out = ColumnsBuilder.create(file, batch_size, PAPER_COLUMNS)
    cols = metadata_columns(file, opts.metadata, arxiv_id_from_name(file.name))
    limits = file.limits
    caps = Caps(
        member_bytes=min(opts.max_member_bytes, limits.max_record_bytes),
        archive_bytes=min(opts.max_archive_bytes, limits.max_file_decompressed_bytes),
        max_members=limits.max_archive_members,
    )
    files: dict[str, str] = {}
    licenses: dict[str, str] = {}  # LICENSE / COPYING files beside the sources, for license tagging
    problems: list[Member] = []
    if file.path.is_dir():
        members: Iterator[Member] = _folder_members(file.path, caps, limits.max_record_bytes)
    else:
        members = iter_archive(file.path, caps, lambda n: _is_tex_name(n) or is_license_file(n))
        if file.path.suffix.lower() in (".tex", ".ltx"):  # a lone .tex: the licence files in its folder
            licenses = {
                p.name: _decode(p.read_bytes()[:LICENSE_FILE_BYTES])
                for p in sorted(file.path.parent.iterdir())
                if is_license_file(p.name) and p.suffix.lower() not in (".tex", ".ltx") and p.is_file() and not p.is_symlink()
            }
    for m in members:
        if m.data is None:
            if m.reason == "member_too_large" and m.size is not None and m.size > limits.max_record_bytes:
                m = Member(m.name, reason="record_too_large", detail=m.detail, ordinal=m.ordinal, escaped=m.escaped)
            problems.append(m)
        elif is_license_file(m.name) and not m.name.lower().endswith((".tex", ".ltx")):
            licenses[m.name] = _decode(m.data[:LICENSE_FILE_BYTES])
        else:
            files[m.name if m.name.lower().endswith((".tex", ".ltx")) or file.path.is_dir() else m.name + ".tex"] = _decode(
                m.data
            )
    ids = MemberIds()
    for m in problems:  # unsafe members, links, bombs, corruption: each one reject row
        record = ids(m)  # never the paper's own id (its main file): the reason is appended to member names
        out.reject_row(
            record if record.startswith("//") else f"{record}:{m.reason}",
            m.reason or "",
            m.detail,
            path=m.name if m.name and m.reason != "unsafe_member_path" else None,
            **cols,
        )
    try:
        main, text, detail = flatten(files, file.limits)
    except LimitExceeded as exc:  # a runaway macro or include fan-out: the paper is one reject
        out.reject_row(find_main(files) or "paper", exc.reason, exc.detail, **cols)
        if (last := out.flush()) is not None:
            yield last
        return
    fatal = any(m.reason in ARCHIVE_PROBLEMS for m in problems)
    if main is None:
        if not fatal:  # a corrupt or empty archive already said why there is no paper
            out.reject_row("paper", "no_main_tex", detail, **cols)
    elif not text:
        out.reject_row(main, "extraction_empty", detail, path=main, **cols)
    else:
        out.add_row(main, text, path=main, **(cols | {"license_files": licenses_beside(main, licenses)}))
    if (last := out.flush()) is not None:
        yield last


# arXiv ships single-file sources as a bare gzipped .tex (1603.07285.gz): in a paper source, a .gz no
# other format claims by a longer suffix (.jsonl.gz) is one.
SPEC = ReaderSpec(
    "arxiv",
    read_arxiv,
    ArxivOptions,
    suffixes=(".tex.gz", ".tex"),
    kind_suffixes={"paper": (".gz",)},
    folders=True,
    folder_kinds=frozenset({"paper"}),
    archive_kinds=frozenset({"paper"}),
)
