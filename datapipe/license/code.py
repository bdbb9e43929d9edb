"""Licences of code: repository licence files + package metadata, per-file overrides.

Order of authority for one source file: its own `SPDX-License-Identifier:` lines, then a
licence notice/text in its header comment, then the repository's licence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath

from datapipe.license.detection import NOT_FOUND, Detection
from datapipe.license.expression import combine
from datapipe.license.expression import normalize as normalize_expr
from datapipe.license.metadata import detect_metadata, is_metadata_file
from datapipe.license.spdx import UNKNOWN
from datapipe.license.textmatch import Match, match_text

# LICENSE, LICENSE.md, LICENSE-MIT, LICENCE.txt, COPYING, COPYING.LESSER, UNLICENSE, ...
_LICENSE_FILE = re.compile(r"^(?:un)?licen[cs]e(?:[-._].*)?$|^copying(?:[-._].*)?$", re.I)
_SPDX_LINE = re.compile(r"SPDX-License-Identifier:\s*([^\n\r]*)")
_SPDX_TAIL = re.compile(r"\s*(?:\*/|-->|#\}|\*\)|-\}|\"\"\"|''')?\s*$")
HEADER_CHARS = 8_000  # licence headers sit at the top; do not scan whole sources


def is_license_file(path: str) -> bool:
    return bool(_LICENSE_FILE.match(PurePosixPath(path).name))


def _from_matches(matches: list[Match], where: str) -> Detection:
    if not matches:
        return Detection(UNKNOWN, "", where)
    return Detection(combine([m.license for m in matches]),
                     "; ".join(m.evidence[:60] for m in matches), where)


def detect_text(text: str, where: str = "text") -> Detection:
    """Licence(s) whose full text or notice appears in `text` (a LICENSE file, a README)."""
    return _from_matches(match_text(text), where)


def spdx_identifiers(text: str) -> Detection | None:
    """`SPDX-License-Identifier:` lines in the header; several lines all apply (AND)."""
    exprs = []
    for m in _SPDX_LINE.finditer(text[:HEADER_CHARS]):
        value = _SPDX_TAIL.sub("", m.group(1))
        if (expr := normalize_expr(value)) != UNKNOWN:
            exprs.append(expr)
    if not exprs:
        return None
    return Detection(combine(exprs), "SPDX-License-Identifier: " + " ; ".join(exprs), "header:spdx")


def detect_header(text: str) -> Detection | None:
    """Per-file licence from the file's own header, or None to inherit the repository's."""
    if found := spdx_identifiers(text):
        return found
    matches = match_text(text[:HEADER_CHARS])
    return _from_matches(matches, "header") if matches else None


def _same_licences(a: str, b: str) -> bool:
    """Same set of licence families (GPL-3.0 text vs GPL-3.0-or-later metadata)."""
    def fams(expr: str) -> set[str]:
        toks = re.findall(r"[A-Za-z0-9.\-+:]+", expr)
        return {t.removesuffix("-only").removesuffix("-or-later") for t in toks
                if t not in ("AND", "OR", "WITH")}
    return fams(a) == fams(b)


def detect_repository(files: Mapping[str, str]) -> Detection:
    """Repository licence from root licence files and package metadata.

    `files` maps repository-relative paths to text (only the candidates need be passed).
    Licence texts are authoritative; metadata is used when there is no licence file, and
    preferred when it names the same licences (it can say OR for a dual licence, which two
    side-by-side LICENSE files cannot).  Disagreeing sources are combined with AND.
    """
    texts = [detect_text(t, f"file:{p}") for p, t in sorted(files.items())
             if "/" not in p.strip("/") and is_license_file(p)]
    texts = [d for d in texts if d.known]
    metas = [d for p, t in sorted(files.items()) if "/" not in p.strip("/") and is_metadata_file(p)
             if (d := detect_metadata(p, t)) is not None]
    from_text = combine([d.license for d in texts])
    from_meta = combine([d.license for d in metas])
    if from_text == UNKNOWN and from_meta == UNKNOWN:
        return NOT_FOUND
    if from_text == UNKNOWN:
        chosen = metas
    elif from_meta == UNKNOWN or not _same_licences(from_text, from_meta):
        chosen = texts + metas if from_meta != UNKNOWN else texts
    else:
        chosen = metas
    expr = combine([d.license for d in chosen])
    return Detection(expr, "; ".join(d.evidence[:60] for d in chosen),
                     ",".join(dict.fromkeys(d.where for d in chosen)))


def detect_code_file(text: str, repo: Detection = NOT_FOUND) -> Detection:
    """One source file: its header overrides the repository licence."""
    return detect_header(text) or repo


def detect_code_batch(texts: Iterable[str], repo: Detection = NOT_FOUND) -> list[Detection]:
    return [detect_code_file(t, repo) for t in texts]


__all__ = ["detect_text", "detect_header", "detect_repository", "detect_code_file",
           "detect_code_batch", "spdx_identifiers", "is_license_file"]
