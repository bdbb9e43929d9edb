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
from datapipe.license.textmatch import Match, match_text, normalize

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


def _from_matches(matches: list[Match], where: str, text: str = "") -> Detection:
    offered = offered_licences(text, [m.license for m in matches]) if text else None
    if offered is not None:
        ids, phrase = offered
        rest = [m.license for m in matches if m.license not in ids]
        expr = combine([*rest, combine(ids, "OR")])
        return Detection(expr, f"{phrase}: {' | '.join(ids)}", where)
    if not matches:
        return Detection(UNKNOWN, "", where)
    return Detection(combine([m.license for m in matches]), "; ".join(m.evidence[:60] for m in matches), where)


# A text that offers a choice of licences ("choose one of", "at your option", "dual licensed",
# "either the BSD License or the GPL"): every licence it names near the offer is one alternative (OR).
# "or (at your option) any later version" is the GNU version clause, not a choice of licences.
_CHOICE = re.compile(
    r" (?:at your (?:option|choice)(?! any later)|your choice of|choose (?:one of|either|any of|between)|either of"
    r"|dual licen[cs]ed|dual licen[cs]e|multi licen[cs]ed|licen[cs]ed under either|under (?:the terms of )?either"
    r"|one of the following licen[cs]es|(?:available|offered|distributed) under (?:\d|two|three|both) licen[cs]es) "
)
_CHOICE_WINDOW = 500  # characters of the normalized text either side of the offer
# Licence names (normalized words) in an offer -> id; "bsd" alone is resolved from the texts found.
_OFFERED_NAMES = [
    (re.compile(r" apache(?: software)?(?: licen[cs]e)?(?: version| v)? 2(?: 0)? "), "Apache-2.0"),
    (re.compile(r" mit(?: licen[cs]e)? "), "MIT"),
    (re.compile(r" (?:bsd 2 clause|2 clause bsd|simplified bsd|freebsd) "), "BSD-2-Clause"),
    (re.compile(r" (?:bsd 3 clause|3 clause bsd|new bsd|modified bsd|revised bsd) "), "BSD-3-Clause"),
    (re.compile(r" bsd licen[cs]e "), "BSD"),
    (re.compile(r" (?:gnu )?general public licen[cs]e(?: gpl)?(?: version| v)? ?(\d) "), "GPL-{}.0"),
    (re.compile(r" gplv?(\d) "), "GPL-{}.0"),
    (re.compile(r" academic free licen[cs]e(?: version| v)? ?(\d) (\d) "), "AFL-{}.{}"),
    (re.compile(r" (?:mozilla public licen[cs]e|mpl)(?: version| v)? ?2 0 "), "MPL-2.0"),
    (re.compile(r" boost software licen[cs]e "), "BSL-1.0"),
    (re.compile(r" (?:the )?unlicense "), "Unlicense"),
    (re.compile(r" cc0(?: 1 0)? "), "CC0-1.0"),
    (re.compile(r" (?:university of illinois )?ncsa open source licen[cs]e "), "NCSA"),
]
_SPDX_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]*[A-Za-z0-9+]")
_BARE_IDS = {"MIT", "ISC", "Zlib", "Unlicense", "WTFPL", "NCSA", "PostgreSQL", "0BSD"}


def offered_licences(text: str, found: list[str]) -> tuple[list[str], str] | None:
    """(the licences a text offers as alternatives, the offer's words), or None when it offers no
    choice of at least two.  ``found``: the ids its full texts matched (they name a bare "BSD")."""
    norm = normalize(text[:HEADER_CHARS])
    m = _CHOICE.search(norm)
    if m is None:
        return None
    window = " " + norm[max(0, m.start() - _CHOICE_WINDOW) : m.end() + _CHOICE_WINDOW] + " "
    named: list[tuple[int, str]] = []  # (where in the window, id): reported in the text's order
    for rx, lid in _OFFERED_NAMES:
        for hit in rx.finditer(window):
            lid_ = lid.format(*hit.groups())
            if lid_ == "BSD":
                lid_ = next((f for f in found if f.startswith("BSD-")), "")
            if lid_:
                named.append((hit.start(), lid_))
    # SPDX ids written as such ("choose one of: Apache-2.0, BSD-2-Clause, MIT"), in the raw text
    # around the offer (ids keep their case there; "vim" the word is not the Vim licence).
    raw = text[:HEADER_CHARS]
    at = max(0, raw.lower().find(m.group(0).strip().split()[0]))
    for tok in _SPDX_TOKEN.findall(raw[max(0, at - _CHOICE_WINDOW) : at + 2 * _CHOICE_WINDOW]):
        canon = canonical_id(tok)
        if canon == tok and ("-" in tok or tok in _BARE_IDS) and (pos := window.find(normalize(tok))) >= 0:
            named.append((pos, tok))
    ids = list(dict.fromkeys(lid for _, lid in sorted(named, key=lambda x: x[0])))
    # A family named twice (GPL-2.0 from the offer, GPL-2.0-or-later from its notice) is one alternative.
    fams: dict[str, str] = {}
    for i in ids:
        fams.setdefault(_family_version(i)[0] + _family_version(i)[1], i)
    ids = list(fams.values())
    return (ids, m.group(0).strip()) if len(ids) >= 2 else None


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
    plain = plain_text(text)
    found = _from_matches(match_text(plain), where, plain)
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
    head = plain_text(text[:HEADER_CHARS])
    found = _from_matches(match_text(head), "header", head)
    return found if found.known else None


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


_PATENTS_FILE = re.compile(r"^patents(?:[-._].*)?$", re.I)
# Facebook's "BSD + Patents": BSD-3-Clause text plus a PATENTS file whose patent licence ends for
# anyone who asserts a patent against Facebook. SPDX has no id for it; ScanCode's key names it.
_FB_PATENTS = re.compile(r" additional grant of patent rights(?: version (\d))? ")


def _patent_grants(root: Mapping[str, str]) -> list[Detection]:
    """A PATENTS file beside the licence is part of the grant: reported with it (AND), never dropped."""
    out = []
    for p, t in root.items():
        if _PATENTS_FILE.match(p) and (m := _FB_PATENTS.search(normalize(t))):
            version = m.group(1) or "1"
            out.append(Detection(f"LicenseRef-scancode-facebook-patent-rights-{version}", m.group(0).strip(), f"file:{p}"))
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
    # Every licence file present is named: a root LICENSE and REUSE's LICENSES/<id>.txt together
    # (a repository that keeps both usually has more than one licence; the same one twice is one).
    texts += [d for d in _reuse_dir(files) if d.license not in {t.license for t in texts}]
    texts += _patent_grants(root)
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
        same = [t for t in re.findall(r"[A-Za-z0-9.\-+:]+", repo.license) if _family_version(t)[0] == fam]
        if same:  # the repository's text of that family (COPYING) gives the version; its other licences are not this file's
            lic = same[0] if len(set(same)) == 1 else repo.license
            return Detection(lic, f"{head.evidence[:80]} (no version) + {repo.where}", f"header,{repo.where}")
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
