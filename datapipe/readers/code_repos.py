"""Code repositories (folders, .tar.gz/.tgz/.zip archives) to one document per source file.

Each file gets its language (extension, then shebang), repository and path inside it, and the
repository's license and package-metadata files (top level and LICENSES/) as a JSON object,
for license tagging. Two passes over an archive: the first reads only those small files, so
every row carries them even when LICENSE comes last in the tar, without buffering the repo.

Rejected with a reason: ``binary_file``, ``invalid_utf8``, ``vendored`` (node_modules, vendor,
third_party, ...), ``lockfile``, ``minified``, ``generated``, ``file_too_large``,
``empty_file``, ``unknown_language``, plus the archive problems of ``archives.py``
(``record_too_large`` past ``limits.max_record_bytes``, ``empty_archive``, ``too_many_members``,
``link_member``, ``unsafe_member_path``, ``special_member``, ``corrupt_archive``, ...). Symlinks in a
repository folder are ``symlink`` rows (detail: the target), never followed. Record ids come from
``archives.MemberIds``: unique and stable for any archive or folder. VCS folders (.git, .hg, .svn)
are not part of the source and are skipped without a row.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field

from datapipe.readers.archives import (
    ARCHIVE_PROBLEMS,
    ARCHIVE_SUFFIXES,
    Caps,
    Member,
    MemberAt,
    MemberIds,
    clean_name,
    iter_archive,
)
from datapipe.readers.base import InputFile, ReadBatch
from datapipe.readers.columns import ColumnsBuilder
from datapipe.readers.spec import ReaderSpec

CODE_COLUMNS = {"repo": "string", "code_language": "string", "repo_license_files": "string"}
LICENSE_FILE_BYTES = 64 << 10

_EXT = {
    "py": "Python",
    "pyi": "Python",
    "pyx": "Cython",
    "ipynb": "Jupyter Notebook",
    "c": "C",
    "h": "C",
    "cc": "C++",
    "cpp": "C++",
    "cxx": "C++",
    "hpp": "C++",
    "hh": "C++",
    "hxx": "C++",
    "cu": "CUDA",
    "cuh": "CUDA",
    "java": "Java",
    "kt": "Kotlin",
    "kts": "Kotlin",
    "scala": "Scala",
    "groovy": "Groovy",
    "go": "Go",
    "rs": "Rust",
    "js": "JavaScript",
    "mjs": "JavaScript",
    "cjs": "JavaScript",
    "jsx": "JavaScript",
    "ts": "TypeScript",
    "tsx": "TypeScript",
    "vue": "Vue",
    "svelte": "Svelte",
    "rb": "Ruby",
    "php": "PHP",
    "pl": "Perl",
    "pm": "Perl",
    "lua": "Lua",
    "r": "R",
    "jl": "Julia",
    "swift": "Swift",
    "m": "Objective-C",
    "mm": "Objective-C++",
    "cs": "C#",
    "fs": "F#",
    "vb": "Visual Basic",
    "dart": "Dart",
    "hs": "Haskell",
    "ml": "OCaml",
    "mli": "OCaml",
    "ex": "Elixir",
    "exs": "Elixir",
    "erl": "Erlang",
    "clj": "Clojure",
    "lisp": "Common Lisp",
    "el": "Emacs Lisp",
    "scm": "Scheme",
    "rkt": "Racket",
    "zig": "Zig",
    "nim": "Nim",
    "sh": "Shell",
    "bash": "Shell",
    "zsh": "Shell",
    "fish": "Shell",
    "ps1": "PowerShell",
    "bat": "Batchfile",
    "sql": "SQL",
    "html": "HTML",
    "htm": "HTML",
    "css": "CSS",
    "scss": "SCSS",
    "sass": "Sass",
    "less": "Less",
    "json": "JSON",
    "yaml": "YAML",
    "yml": "YAML",
    "toml": "TOML",
    "xml": "XML",
    "ini": "INI",
    "cfg": "INI",
    "md": "Markdown",
    "markdown": "Markdown",
    "rst": "reStructuredText",
    "tex": "TeX",
    "proto": "Protocol Buffer",
    "cmake": "CMake",
    "mk": "Makefile",
    "gradle": "Gradle",
    "tf": "HCL",
    "sol": "Solidity",
    "v": "Verilog",
    "sv": "SystemVerilog",
    "vhd": "VHDL",
    "asm": "Assembly",
    "s": "Assembly",
    "f90": "Fortran",
    "f": "Fortran",
    "pas": "Pascal",
    "ada": "Ada",
    "d": "D",
    "cr": "Crystal",
    "elm": "Elm",
    "purs": "PureScript",
}
_NAMES = {
    "Makefile": "Makefile",
    "GNUmakefile": "Makefile",
    "Dockerfile": "Dockerfile",
    "CMakeLists.txt": "CMake",
    "Rakefile": "Ruby",
    "Gemfile": "Ruby",
    "BUILD": "Starlark",
    "BUILD.bazel": "Starlark",
    "Jenkinsfile": "Groovy",
}
_SHEBANG = [
    ("python", "Python"),
    ("bash", "Shell"),
    ("sh", "Shell"),
    ("zsh", "Shell"),
    ("node", "JavaScript"),
    ("perl", "Perl"),
    ("ruby", "Ruby"),
    ("php", "PHP"),
    ("lua", "Lua"),
    ("Rscript", "R"),
]
_BINARY_EXT = {
    "png",
    "jpg",
    "jpeg",
    "gif",
    "bmp",
    "ico",
    "webp",
    "tif",
    "tiff",
    "pdf",
    "zip",
    "gz",
    "tgz",
    "bz2",
    "xz",
    "7z",
    "rar",
    "jar",
    "war",
    "class",
    "so",
    "dll",
    "dylib",
    "exe",
    "o",
    "a",
    "obj",
    "pyc",
    "pyo",
    "whl",
    "bin",
    "dat",
    "db",
    "sqlite",
    "woff",
    "woff2",
    "ttf",
    "otf",
    "eot",
    "mp3",
    "mp4",
    "wav",
    "ogg",
    "avi",
    "mov",
    "npy",
    "npz",
    "pt",
    "pth",
    "onnx",
    "h5",
    "pkl",
    "parquet",
    "arrow",
}
VENDORED = {
    "node_modules",
    "vendor",
    "vendors",
    "third_party",
    "third-party",
    "thirdparty",
    "bower_components",
    "site-packages",
    ".venv",
    "venv",
    "Pods",
    "Carthage",
    "external",
    "deps",
}
VCS = {".git", ".hg", ".svn"}
LOCKFILES = {
    "package-lock.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    "Cargo.lock",
    "poetry.lock",
    "Pipfile.lock",
    "composer.lock",
    "Gemfile.lock",
    "go.sum",
    "uv.lock",
    "npm-shrinkwrap.json",
    "mix.lock",
    "flake.lock",
    "packages.lock.json",
    "Podfile.lock",
    "pdm.lock",
    "bun.lockb",
}
_GENERATED_NAME = re.compile(r"(_pb2(_grpc)?\.py|\.pb\.(go|cc|h)|\.g\.dart|\.generated\.\w+|\.designer\.cs)$", re.I)
_GENERATED_MARK = re.compile(r"@generated|auto-?generated|do not edit|generated by (?!the\b)|code generated .* do not edit", re.I)
_NOTICE = re.compile(r"^(notice|copyright|authors|patents)(\.\w+)?$", re.I)  # PATENTS: a grant beside the licence


class RepoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    max_file_bytes: int = Field(1 << 20, ge=1, description="Source files larger than this: file_too_large.")
    max_archive_bytes: int = Field(4 << 30, ge=1, description="Decompressed bytes read from one archive at most.")
    multi_repo: bool = Field(False, description="Each top-level folder of the input is its own repository.")
    repo: str | None = Field(None, description="Repository name; default: the folder or archive name.")


class TableOptions(BaseModel):
    """Options of the JSONL/Parquet readers for code rows (The Stack style) and paper rows."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    content_field: str | None = Field(None, description="Field with the text; overrides text_field when set.")
    path_field: str | None = Field(None, description="kind code: field with the file path in the repository.")
    repo_field: str | None = Field(None, description="kind code: field with the repository name.")
    language_field: str | None = Field(None, description="kind code: field with the language (else detected).")
    max_file_bytes: int = Field(1 << 20, ge=1, description="kind code: longer contents are file_too_large.")
    arxiv_id_field: str | None = Field(None, description="kind paper: field with the arXiv id.")
    metadata: str | None = Field(None, description="kind paper: arXiv metadata JSONL (id, license, categories).")


# _license_modules: the license detectors (datapipe.license: ~140 regular expressions compiled at import,
# ~0.1 CPU s) are imported where a repository's files are read, not with this module, which the JSONL
# and Parquet readers import for TableOptions: a driver or worker reading web JSONL never needs them
# (readers/arxiv.py likewise).


def is_repo_meta_file(rel: str) -> bool:
    """License texts, package metadata and READMEs at the repository root, or in LICENSES/ (REUSE)."""
    from datapipe.license.code_repos import is_license_file  # (see _license_modules)
    from datapipe.license.metadata import is_metadata_file
    from datapipe.license.readme import is_readme

    parts = PurePosixPath(rel).parts
    if len(parts) == 2 and parts[0] in ("LICENSES", "licenses"):
        return True
    return len(parts) == 1 and (is_license_file(rel) or is_metadata_file(rel) or bool(_NOTICE.match(rel)) or is_readme(rel))


def detect_language(path: str, head: str) -> str | None:
    name = PurePosixPath(path).name
    if name in _NAMES:
        return _NAMES[name]
    ext = name.rsplit(".", 1)[1] if "." in name else ""
    if ext and (lang := _EXT.get(ext) or _EXT.get(ext.lower())):
        return lang
    if head.startswith("#!"):
        line = head[2:].split("\n", 1)[0].split()
        prog = (line[1] if len(line) > 1 and line[0].endswith("/env") else line[0].rsplit("/", 1)[-1]) if line else ""
        for key, lang in _SHEBANG:
            if re.fullmatch(rf"{key}[0-9.]*", prog):
                return lang
    return None


def check_path(path: str) -> tuple[str, str] | None:
    """(reason, detail) when the path alone rules a file out."""
    parts = PurePosixPath(path).parts
    if vendored := next((p for p in parts[:-1] if p in VENDORED), None):
        return "vendored", f"inside {vendored}/"
    name = parts[-1] if parts else path
    if name in LOCKFILES:
        return "lockfile", name
    ext = name.rsplit(".", 1)[1].lower() if "." in name else ""
    if ext in _BINARY_EXT:
        return "binary_file", f"extension .{ext}"
    if re.search(r"[.-]min\.(js|css|mjs)$", name):
        return "minified", "minified file name"
    if _GENERATED_NAME.search(name):
        return "generated", "generated file name"
    return None


def check_content(path: str, data: bytes, max_bytes: int) -> tuple[str | None, str, str | None, str | None]:
    """(reason, detail, text, language); reason None means a document."""
    if len(data) > max_bytes:
        return "file_too_large", f"{len(data)} bytes > max_file_bytes {max_bytes}", None, None
    if b"\x00" in data[:8192]:
        return "binary_file", "NUL byte in the first 8 KB", None, None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "invalid_utf8", str(exc)[:200], None, None
    if not text.strip():
        return "empty_file", "no non-whitespace content", None, None
    lang = detect_language(path, text[:256])
    if lang is None:
        return "unknown_language", "no known extension, file name or shebang", text, None
    lines = text.splitlines() or [""]
    longest = max(len(ln) for ln in lines)
    # StarCoder-style thresholds: hand-written code has short lines; bundles are one long line.
    if lang not in ("JSON", "Markdown", "reStructuredText", "TeX") and (longest > 1000 or len(text) / len(lines) > 200):
        return "minified", f"longest line {longest} chars, mean {len(text) / len(lines):.0f}", text, lang
    if _GENERATED_MARK.search(text[:1024]):
        return "generated", "generated-file marker in the header", text, lang
    return None, "", text, lang


def code_builder(file: InputFile, batch_size: int) -> ColumnsBuilder:
    return ColumnsBuilder.create(file, batch_size, CODE_COLUMNS)


def add_code_file(
    out: ColumnsBuilder,
    record: str,
    path: str,
    data: bytes,
    repo: str | None,
    license_files: str | None,
    max_bytes: int,
    language: str | None = None,
    url: str | None = None,
) -> None:
    cols = {"repo": repo, "repo_license_files": license_files}
    if hit := check_path(path):
        out.reject_row(record, hit[0], hit[1], url=url, path=path, **cols)
        return
    reason, detail, text, lang = check_content(path, data, max_bytes)
    if language and reason in (None, "unknown_language"):
        reason, lang = None, language  # a dataset's own language label wins over detection
    cols["code_language"] = lang
    if reason is not None:
        out.reject_row(record, reason, detail, text, url=url, path=path, **cols)
    else:
        out.add_row(record, text or "", url=url, path=path, **cols)


def _split_repo(rel: str, multi: bool, default: str) -> tuple[str, str] | None:
    if not multi:
        return default, rel
    head, _, rest = rel.partition("/")
    return (head, rest) if rest else None


def _common_root(names: list[str]) -> str | None:
    """GitHub archives put everything under 'repo-main/': strip that one shared folder."""
    tops = {n.split("/", 1)[0] for n in names if n}
    if len(tops) == 1 and all("/" in n for n in names if n):
        return tops.pop()
    return None


def _walk(root: Path) -> Iterator[tuple[Member, Path]]:
    """Every file under a repository folder in a stable order, with its path on disk (read lazily:
    pass one needs only names). Symlinks are inputs we refuse to follow: each gets a reject row."""
    ordinal = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in VCS)
        for name in sorted(filenames):
            p = Path(dirpath) / name
            rel, escaped = clean_name(p.relative_to(root).as_posix())
            at: MemberAt = {"ordinal": ordinal, "escaped": escaped}
            ordinal += 1
            if p.is_symlink():
                target = clean_name(os.readlink(p))[0]
                yield Member(rel, reason="symlink", detail=f"symlink to {target!r} not followed", **at), p
            elif not p.is_file():
                yield Member(rel, reason="special_member", detail="not a regular file", **at), p
            else:
                yield Member(rel, None, reason="lazy", **at), p


def read_repo(file: InputFile, batch_size: int) -> Iterator[ReadBatch]:
    from datapipe.license.readme import is_readme, license_section  # (see _license_modules)

    opts = RepoOptions.model_validate(file.source.options)
    out = code_builder(file, batch_size)
    limits = file.limits
    caps = Caps(
        member_bytes=min(max(opts.max_file_bytes, LICENSE_FILE_BYTES), limits.max_record_bytes),
        archive_bytes=min(opts.max_archive_bytes, limits.max_file_decompressed_bytes),
        max_members=limits.max_archive_members,
    )
    is_dir = file.path.is_dir()
    name = file.path.name
    for ext in ARCHIVE_SUFFIXES:
        if name.lower().endswith(ext):
            name = name[: -len(ext)]
    default_repo = opts.repo or clean_name(name)[0]

    def too_large(m: Member, size: int | None, detail: str) -> Member:
        # Past the pipeline's record cap is record_too_large (a bomb); past the reader's own
        # max_file_bytes is the same rule as a large file in a folder: file_too_large.
        reason = "record_too_large" if size is not None and size > limits.max_record_bytes else "file_too_large"
        return Member(m.name, reason=reason, detail=detail, ordinal=m.ordinal, escaped=m.escaped, size=size)

    def members(want: Callable[[str], bool] | None = None) -> Iterator[Member]:
        if not is_dir:
            for m in iter_archive(file.path, caps, want):
                yield too_large(m, m.size, m.detail) if m.reason == "member_too_large" else m
            return
        for n, (m, p) in enumerate(_walk(file.path)):
            if n >= caps.max_members:
                yield Member(
                    "",
                    reason="too_many_members",
                    detail=f"more than limits.max_archive_members {caps.max_members} files: the rest is not read",
                )
                return
            if want is not None and not want(m.name):
                continue
            if m.reason == "lazy":
                size = p.stat().st_size
                m = (
                    Member(m.name, p.read_bytes(), ordinal=m.ordinal, escaped=m.escaped)
                    if size <= caps.member_bytes
                    else too_large(m, size, f"{size} bytes > max_file_bytes {min(opts.max_file_bytes, caps.member_bytes)}")
                )
            yield m

    # Pass 1: names (for a shared top folder) and the license/metadata files of each repository.
    all_names: list[str] = []
    licenses: dict[str, dict[str, str]] = {}

    def want_meta(n: str) -> bool:
        rel = n.split("/", 1)[1] if strip and "/" in n else n
        split = _split_repo(rel, opts.multi_repo, default_repo)
        return split is not None and is_repo_meta_file(split[1])

    strip = False

    def note_name(n: str) -> bool:
        all_names.append(n)
        return False  # names only: no member is read

    if not is_dir:  # archives: learn the shared top folder from a names-only pass first
        for _ in iter_archive(file.path, caps, note_name):
            pass
        strip = not opts.multi_repo and _common_root(all_names) is not None
        all_names.clear()
    for m in members(want_meta):
        if m.data is not None:
            rel = m.name.split("/", 1)[1] if strip else m.name
            repo, path = _split_repo(rel, opts.multi_repo, default_repo)  # type: ignore[misc]
            text = m.data[:LICENSE_FILE_BYTES].decode("utf-8", "replace")
            if is_readme(path):  # only its License section travels with every row of the repo
                if (section := license_section(text)) is None:
                    continue
                text = section
            licenses.setdefault(repo, {})[path] = text
    license_json = {repo: json.dumps(files, ensure_ascii=False, sort_keys=True) for repo, files in licenses.items()}

    # Pass 2: every member is a document or a reject.
    ids = MemberIds()
    for m in members():
        archive_level = not m.name or m.reason in ARCHIVE_PROBLEMS or m.reason == "unsafe_member_path"
        rel = m.name.split("/", 1)[1] if strip and "/" in m.name else m.name
        split = _split_repo(rel, opts.multi_repo, default_repo) if not archive_level else None
        repo, path = split if split else (None, None if archive_level else rel)
        record = ids(m)
        lic = license_json.get(repo) if repo else None
        if m.data is None:
            out.reject_row(record, m.reason or "unreadable_input", m.detail, path=path or None, repo=repo, repo_license_files=lic)
        else:
            add_code_file(out, record, path, m.data, repo, lic, opts.max_file_bytes)  # type: ignore[arg-type]
        if out.full():
            yield out.flush()  # type: ignore[misc]
    if (last := out.flush()) is not None:
        yield last


# A repository is a folder or an archive of one in a source of kind code; it has no suffix of its own.
SPEC = ReaderSpec(
    "repo", read_repo, RepoOptions, folders=True, folder_kinds=frozenset({"code"}), archive_kinds=frozenset({"code"})
)
