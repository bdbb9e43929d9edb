"""The licence a README states in its "License" section ("## License\\n\\nMIT © Jane").

Many repositories have no LICENSE file and say it only in the README.  We read just the
section under a License/Licence/Licensing heading (Markdown `#`, reStructuredText
underlines, Org `*`, or a `License: MIT` line), never the rest of the README: a README
that *mentions* licences elsewhere ("supports MIT and GPL projects") decides nothing.
Inside the section, full texts and notices are matched as in a LICENSE file; failing that,
licence names (MIT, Apache 2.0, GPLv3, BSD-3-Clause, SPDX ids, shields.io badges) are read.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from datapipe.license.detection import Detection
from datapipe.license.expression import combine
from datapipe.license.spdx import UNKNOWN, canonical_id
from datapipe.license.textmatch import match_text

SECTION_CHARS = 3_000  # a licence section is a few lines; a longer one is the licence text itself
_README = re.compile(r"^readme(?:\.[\w.]+)?$", re.I)
_WORD = r"(?:licen[cs]e|licen[cs]ing|copyright\s+(?:and|&)\s+licen[cs]e|licen[cs]e\s+(?:and|&)\s+copyright)"
# Markdown "## License", "**License**", Org "* License", reST/setext "License\n=======".
_MD_HEAD = re.compile(rf"^[ \t]*(#{{1,6}}|\*{{1,3}}(?=[ \t]))[ \t]*\**[ \t]*{_WORD}[ \t]*\**:?[ \t]*#*[ \t]*$", re.I | re.M)
_BOLD_HEAD = re.compile(rf"^[ \t]*(?:\*\*|__){_WORD}:?(?:\*\*|__)[ \t]*:?[ \t]*$", re.I | re.M)
_UNDERLINED = re.compile(rf"^[ \t]*{_WORD}[ \t]*:?[ \t]*\n([=\-~^\"'`#*+]){{3,}}[ \t]*$", re.I | re.M)
_HTML_HEAD = re.compile(rf"<h([1-6])[^>]*>\s*{_WORD}\s*</h\1>", re.I)
_INLINE = re.compile(rf"^[ \t]*(?:\*\*|__)?{_WORD}(?:\*\*|__)?[ \t]*[:：](?:\*\*|__)?[ \t]*(\S.*)$", re.I | re.M)
_ANY_MD_HEAD = re.compile(r"^[ \t]*(#{1,6})[ \t]+\S", re.M)
_ANY_UNDERLINE = re.compile(r"^[^\n]+\n[=\-~^\"'`#*+]{3,}[ \t]*$", re.M)
_ANY_HTML_HEAD = re.compile(r"<h[1-6][^>]*>", re.I)

# Licence names as READMEs write them -> SPDX id.  Ordered: longer / more specific first.
_NAMES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(rx, re.I), lid)
    for rx, lid in [
        (r"\bMIT[- ]?0\b|\bMIT No Attribution\b", "MIT-0"),
        (r"\bApache(?:[- ]License)?,?[- ](?:Version[- ]|v\.?[- ]?)?2(?:\.0)?\b|\bASL[- ]?2(?:\.0)?\b", "Apache-2.0"),
        (r"\b(?:BSD[- ]?3[- ]?Clause|3[- ]Clause[- ]BSD|(?:New|Modified|Revised)[- ]BSD)\b", "BSD-3-Clause"),
        (r"\b(?:BSD[- ]?2[- ]?Clause|2[- ]Clause[- ]BSD|Simplified[- ]BSD|FreeBSD[- ]License)\b", "BSD-2-Clause"),
        (r"\b(?:A(?:ffero)?[- ]?GPL|GNU Affero General Public License)[- ,]?(?:v(?:ersion)?\.?[- ]?)?3(?:\.0)?\b", "AGPL-3.0"),
        (
            r"\b(?:L(?:esser)?[- ]?GPL|GNU (?:Lesser|Library) General Public License)[- ,]?(?:v(?:ersion)?\.?[- ]?)?3(?:\.0)?\b",
            "LGPL-3.0",
        ),
        (
            r"\b(?:L(?:esser)?[- ]?GPL|GNU (?:Lesser|Library) General Public License)[- ,]?(?:v(?:ersion)?\.?[- ]?)?2\.1\b",
            "LGPL-2.1",
        ),
        (r"(?<![LA])\b(?:GPL|GNU General Public License)[- ,]?(?:v(?:ersion)?\.?[- ]?)?3(?:\.0)?\b", "GPL-3.0"),
        (r"(?<![LA])\b(?:GPL|GNU General Public License)[- ,]?(?:v(?:ersion)?\.?[- ]?)?2(?:\.0)?\b", "GPL-2.0"),
        (r"\b(?:MPL|Mozilla Public License)[- ,]?(?:v(?:ersion)?\.?[- ]?)?2\.0\b", "MPL-2.0"),
        (r"\b(?:EPL|Eclipse Public License)[- ,]?(?:v(?:ersion)?\.?[- ]?)?2\.0\b", "EPL-2.0"),
        (r"\bBoost Software License\b|\bBSL[- ]1\.0\b", "BSL-1.0"),
        (r"\bISC\b", "ISC"),
        (r"\bUnlicen[sc]e\b", "Unlicense"),
        (r"\bCC0\b|\bCreative Commons Zero\b", "CC0-1.0"),
        (r"\bWTFPL\b", "WTFPL"),
        (r"\bzlib\b", "Zlib"),
        # MIT the licence, not MIT the institute ("© MIT", "MIT Media Lab", "MIT Press").
        (
            r"(?<![©)] )(?<!copyright )(?<! at )(?<! by )(?<!from )\b(?:the )?MIT\b(?![- ]0)"
            r"(?!\s+(?:Media|Press|Lincoln|Sloan|CSAIL|Technology|OpenCourseWare))",
            "MIT",
        ),
    ]
]
_SHIELD = re.compile(
    r"img\.shields\.io/(?:badge/)?licen[cs]e-([A-Za-z0-9.%_+-]+?)-[0-9a-f]{3,6}\b|"
    r"img\.shields\.io/badge/licen[cs]e-([A-Za-z0-9.%_+]+(?:--[A-Za-z0-9.%_+]+)*)-",
    re.I,
)
_SPDX_TOKEN = re.compile(r"(?<![\w.-])((?:[A-Za-z0-9]+[.-])+[A-Za-z0-9+]+|[A-Za-z]{3,}[0-9.]*)(?![\w-])")
_OR_CUE = re.compile(r"\beither\b|\bat your option\b|\bdual[- ]licen[cs]ed\b|\bdual licen[cs]e\b|\bor\b", re.I)
_NOT_LICENSE = re.compile(r"\b(?:dependenc(?:y|ies)|third[- ]party|vendored|bundled)\b", re.I)


def is_readme(path: str) -> bool:
    return bool(_README.match(PurePosixPath(path).name))


def _section_end(text: str, start: int, md_level: int | None) -> int:
    """Where the next heading (of the same or a higher Markdown level) begins."""
    ends = [len(text)]
    for m in _ANY_MD_HEAD.finditer(text, start):
        if md_level is None or len(m.group(1)) <= md_level:
            ends.append(m.start())
            break
    if u := _ANY_UNDERLINE.search(text, start):
        ends.append(u.start())
    if h := _ANY_HTML_HEAD.search(text, start):
        ends.append(h.start())
    return min(ends)


def license_section(text: str) -> str | None:
    """The README's licence section (heading included, at most SECTION_CHARS), or None."""
    for rx in (_MD_HEAD, _BOLD_HEAD, _UNDERLINED, _HTML_HEAD):
        if m := rx.search(text):
            level = len(m.group(1)) if rx is _MD_HEAD and m.group(1).startswith("#") else None
            end = _section_end(text, m.end(), level)
            return text[m.start() : min(end, m.end() + SECTION_CHARS)].strip()
    if m := _INLINE.search(text):
        return m.group(0).strip()[:SECTION_CHARS]
    return None


def _names(section: str) -> list[tuple[str, str]]:
    """(SPDX id, matched words) for licence names in the section, in order of appearance."""
    body = section.split("\n", 1)[1] if "\n" in section else section
    hits: list[tuple[int, str, str]] = []
    taken: list[tuple[int, int]] = []
    for m in _SHIELD.finditer(body):
        raw = (m.group(1) or m.group(2) or "").replace("--", "-").replace("%20", " ").replace("_", " ")
        if lid := canonical_id(raw) or _name_id(raw):
            hits.append((m.start(), lid, m.group(0)))
            taken.append(m.span())
    for m in _SPDX_TOKEN.finditer(body):
        tok = m.group(1)
        if "-" in tok and (lid := canonical_id(tok)) and not any(a <= m.start() < b for a, b in taken):
            hits.append((m.start(), lid, tok))
            taken.append(m.span())
    for rx, lid in _NAMES:
        for m in rx.finditer(body):
            if not any(a <= m.start() < b or a < m.end() <= b for a, b in taken):
                hits.append((m.start(), lid, m.group(0)))
                taken.append(m.span())
    return [(lid, words) for _, lid, words in sorted(hits)]


def _name_id(raw: str) -> str | None:
    return next((lid for rx, lid in _NAMES if rx.fullmatch(raw.strip())), None)


def detect_readme(path: str, text: str) -> Detection | None:
    """Licence stated in a README's licence section, or None when it states none we know."""
    section = license_section(text)
    if not section:
        return None
    where = f"{PurePosixPath(path).name}:license-section"
    if matches := match_text(section):
        return Detection(combine([m.license for m in matches]), "; ".join(m.evidence[:60] for m in matches), where)
    if _NOT_LICENSE.search(section):
        return None  # "dependencies are MIT/BSD": about other code, not this one
    names = _names(section)
    ids = list(dict.fromkeys(lid for lid, _ in names))
    if not ids:
        return None
    op = "OR" if len(ids) > 1 and _OR_CUE.search(section) else "AND"
    expr = combine(ids, op)
    return Detection(expr, "; ".join(dict.fromkeys(w for _, w in names))[:120], where) if expr != UNKNOWN else None


__all__ = ["detect_readme", "is_readme", "license_section"]
