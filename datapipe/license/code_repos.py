"""Licences of code: repository licence files + package metadata, per-file overrides.

Order of authority for one source file: its own `SPDX-License-Identifier:` lines, then a
licence notice/text in its header comment, then the repository's licence.
"""

from __future__ import annotations

import html as htmllib
import re
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath

from datapipe.license.detection import NOT_FOUND, Detection
from datapipe.license.expression import combine
from datapipe.license.expression import normalize as normalize_expr
from datapipe.license.metadata import detect_metadata, is_metadata_file
from datapipe.license.readme import detect_readme, is_readme
from datapipe.license.spdx import UNKNOWN, canonical_id
from datapipe.license.textmatch import Match, match_text

# LICENSE, LICENSE.md, LICENSE-MIT, LICENCE.txt, COPYING, COPYING.LESSER, UNLICENSE, ...
_LICENSE_FILE = re.compile(r"^(?:un)?licen[cs]e(?:[-._].*)?$|^copying(?:[-._].*)?$", re.I)
_SPDX_LINE = re.compile(r"SPDX-License-Identifier:\s*([^\n\r]*)")
_SPDX_TAIL = re.compile(r"\s*(?:\*/|-->|#\}|\*\)|-\}|\"\"\"|''')?\s*$")
HEADER_CHARS = 8_000  # licence headers sit at the top; do not scan whole sources
_HTML = re.compile(r"<(?:html|body|p|br|div|pre|h[1-6]|li|dl|dd|blockquote)\b[^>]*>", re.I)
_TAGS = re.compile(r"<script\b.*?</script>|<style\b.*?</style>|<!--.*?-->|<[^>]+>", re.I | re.S)
# What a GNU notice without a version number becomes (textmatch): "any version".  Next to a
# licence text of the same family with a version (COPYING), that text says which one.
_UNVERSIONED_GNU = {"GPL-1.0-or-later": "GPL", "LGPL-2.0-or-later": "LGPL", "AGPL-3.0-or-later": "AGPL"}
_REUSE_DIRS = ("LICENSES", "licenses")


def is_license_file(path: str) -> bool:
    return bool(_LICENSE_FILE.match(PurePosixPath(path).name))


def _from_matches(matches: list[Match], where: str) -> Detection:
    if not matches:
        return Detection(UNKNOWN, "", where)
    return Detection(combine([m.license for m in matches]), "; ".join(m.evidence[:60] for m in matches), where)


def plain_text(text: str) -> str:
    """A licence file as words: HTML (license.html, COPYING.html) loses its tags and entities,
    so a paragraph break is not a word inside a phrase."""
    if "<" in text and _HTML.search(text[:20_000]):
        return htmllib.unescape(_TAGS.sub(" ", text))
    return text


# "licensed under Apache-2.0 OR MIT": an SPDX expression written as a sentence.
_LICENSED_EXPR = re.compile(r"\blicen[cs]ed under(?: the)?\s+((?:\(?[A-Za-z0-9.+-]+\)?(?:\s+(?:OR|AND|WITH)\s+)?)+)")


def _expression_statement(text: str) -> str | None:
    for m in _LICENSED_EXPR.finditer(text[:HEADER_CHARS]):
        value = m.group(1).strip().rstrip(".")
        ids = [t for t in re.findall(r"[A-Za-z0-9.\-+]+", value) if t not in ("OR", "AND", "WITH")]
        # Only SPDX ids ("licensed under the MIT license" is the notice matcher's job).
        if ids and all(canonical_id(t) for t in ids) and (expr := normalize_expr(value)) != UNKNOWN:
            return expr
    return None


def detect_text(text: str, where: str = "text") -> Detection:
    """Licence(s) whose full text or notice appears in `text` (a LICENSE file, a README)."""
    found = _from_matches(match_text(plain_text(text)), where)
    if not found.known and (expr := _expression_statement(text)):
        return Detection(expr, f"licensed under {expr}", where)
    return found


def _license_file(path: str, text: str) -> Detection:
    """A root licence file: its text, else the SPDX-License-Identifier lines it holds."""
    found = detect_text(text, f"file:{path}")
    if not found.known and (spdx := spdx_identifiers(text)):
        return Detection(spdx.license, spdx.evidence, f"file:{path}")
    return found


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
    matches = match_text(plain_text(text[:HEADER_CHARS]))
    return _from_matches(matches, "header") if matches else None


def _same_licences(a: str, b: str) -> bool:
    """Same set of licence families (GPL-3.0 text vs GPL-3.0-or-later metadata)."""

    def fams(expr: str) -> set[str]:
        toks = re.findall(r"[A-Za-z0-9.\-+:]+", expr)
        return {t.removesuffix("-only").removesuffix("-or-later") for t in toks if t not in ("AND", "OR", "WITH")}

    return fams(a) == fams(b)


def _family_version(lid: str) -> tuple[str, str]:
    base = lid.removesuffix("-only").removesuffix("-or-later")
    fam, _, ver = base.partition("-")
    return fam, ver


def refine_gnu(ids: list[str]) -> list[str]:
    """GNU findings read together, as the GNU layouts mean them.

    - A notice without a version ("under the GNU GPL as published by the FSF") next to a text
      with one (COPYING: GPL-3.0) is that version: the notice points at the shipped text.
    - COPYING.LESSER (LGPL-3.0) + COPYING (GPL-3.0) is LGPL-3.0: the LGPL v3 is written as
      additional permissions on top of the GPL v3, and the GNU instructions say to ship both.
    """
    fams = {_family_version(i) for i in ids if i not in _UNVERSIONED_GNU}
    out = [i for i in ids if not (i in _UNVERSIONED_GNU and any(f == _UNVERSIONED_GNU[i] for f, _ in fams))]
    if any(_family_version(i) == ("LGPL", "3.0") for i in out):
        out = [i for i in out if _family_version(i) != ("GPL", "3.0")]
    return out


def _combine_gnu(dets: list[Detection]) -> list[Detection]:
    keep = set(refine_gnu([d.license for d in dets]))
    return [d for d in dets if d.license in keep or " " in d.license]


def _reuse_dir(files: Mapping[str, str]) -> list[Detection]:
    """REUSE layout: LICENSES/<SPDX id>.txt, one file per licence used in the repository.

    The file name is the id (REUSE requires it); a LicenseRef- name stays as it is and
    classifies as unknown.  The text is matched too, and wins when it names a known licence
    the file name does not (a mislabelled file)."""
    out = []
    for p, t in sorted(files.items()):
        parts = PurePosixPath(p.strip("/")).parts
        if len(parts) != 2 or parts[0] not in _REUSE_DIRS:
            continue
        stem = PurePosixPath(parts[1]).stem if "." in parts[1] else parts[1]
        by_name = canonical_id(stem) or (stem if stem.startswith("LicenseRef-") else None)
        by_text = detect_text(t, f"file:{p}")
        if by_text.known and (by_name is None or by_name not in by_text.license.split()):
            out.append(by_text)
        elif by_name:
            out.append(Detection(by_name, parts[1], f"file:{p}"))
    return out


def detect_repository(files: Mapping[str, str]) -> Detection:
    """Repository licence from root licence files, LICENSES/, package metadata and the README.

    `files` maps repository-relative paths to text (only the candidates need be passed).
    Licence texts are authoritative (root LICENSE/COPYING files, else the REUSE LICENSES/
    folder); metadata is used when there is no licence text, and preferred when it names
    the same licences (it can say OR for a dual licence, which two side-by-side LICENSE
    files cannot).  Disagreeing sources are combined with AND.  The README's licence
    section is the last resort.
    """
    root = {p: t for p, t in sorted(files.items()) if "/" not in p.strip("/")}
    texts = [d for p, t in root.items() if is_license_file(p) and (d := _license_file(p, t)).known]
    if not texts:
        texts = _reuse_dir(files)
    texts = _combine_gnu(texts)
    metas = [m for p, t in root.items() if is_metadata_file(p) if (m := detect_metadata(p, t)) is not None]
    from_text = combine([d.license for d in texts])
    from_meta = combine([d.license for d in metas])
    if from_text == UNKNOWN and from_meta == UNKNOWN:
        readmes = [r for p, t in root.items() if is_readme(p) if (r := detect_readme(p, t)) is not None]
        return readmes[0] if readmes else NOT_FOUND
    if from_text == UNKNOWN:
        chosen = metas
    elif from_meta == UNKNOWN or not _same_licences(from_text, from_meta):
        chosen = texts + metas if from_meta != UNKNOWN else texts
    else:
        chosen = metas
    expr = combine([d.license for d in chosen])
    return Detection(expr, "; ".join(d.evidence[:60] for d in chosen), ",".join(dict.fromkeys(d.where for d in chosen)))


def detect_code_file(text: str, repo: Detection = NOT_FOUND) -> Detection:
    """One source file: its header overrides the repository licence.

    A GNU header without a version ("... the GNU General Public License as published by the
    Free Software Foundation.") in a repository whose COPYING has one is that version."""
    head = detect_header(text)
    if head is None:
        return repo
    if head.where == "header" and repo.known and head.license in _UNVERSIONED_GNU:
        fam = _UNVERSIONED_GNU[head.license]
        if any(_family_version(t)[0] == fam for t in re.findall(r"[A-Za-z0-9.\-+:]+", repo.license)):
            return Detection(repo.license, f"{head.evidence[:80]} (no version) + {repo.where}", f"header,{repo.where}")
    return head


def detect_code_batch(texts: Iterable[str], repo: Detection = NOT_FOUND) -> list[Detection]:
    return [detect_code_file(t, repo) for t in texts]


__all__ = [
    "plain_text",
    "refine_gnu",
    "detect_text",
    "detect_header",
    "detect_repository",
    "detect_code_file",
    "detect_code_batch",
    "spdx_identifiers",
    "is_license_file",
]
