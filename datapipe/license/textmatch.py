"""Fast default licence-text matcher: normalized text + distinguishing phrases.

Why phrases rather than whole-text similarity: datapipe cannot ship reference licence
texts it has not vetted, and a handful of exact phrases per licence, chosen to separate
near-relatives, is both fast (substring search on one normalized string) and rarely
wrong: a licence is reported only when every one of its phrases is present, so a text we
do not know yields nothing (``unknown``) rather than its nearest neighbour.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from datapipe.license.fingerprints import FULL_TEXT, MODIFICATIONS, NAMED, NOTICES, SUBSUMES
from datapipe.license.spdx import canonical_id
from datapipe.text import charclass

# Words: runs of letters/digits, except that each CJK ideograph is its own word (Chinese
# has no spaces, and MulanPSL's Chinese half must match char by char).
_HAN = charclass.regex_class(charclass.HAN)  # datapipe.text.charclass
_WORD = re.compile(rf"[{_HAN}]|[^\W_{_HAN}]+")
MAX_CHARS = 400_000  # the longest licence texts are ~40 kB; more is not a licence file


def normalize(text: str) -> str:
    """Lower-cased words joined by single spaces, padded with spaces for whole-word search.

    Punctuation, markdown (#, *, _, >, `), comment leaders (//, #, *, --, ;), CRLF, a byte
    order mark and line wrapping all vanish, which is what makes the variants match.
    """
    return " " + " ".join(_WORD.findall(text[:MAX_CHARS].lower())) + " "


@dataclass(frozen=True)
class Match:
    license: str
    evidence: str  # the phrase or notice that matched
    kind: str  # "text" (full licence text) or "notice" (a header / one-line statement)


# A plain phrase is a substring test; a pattern phrase is (its literal pieces, regex): the
# pieces are tested with `in` first, so the regex runs only on texts that can match.
Phrase = str | tuple[tuple[str, ...], re.Pattern[str]]


def _phrase(p: str) -> Phrase:
    """' p ' for whole-word substring search, or a regex for phrases with * / [optional] markers."""
    if "*" not in p and "[" not in p:
        return f" {p} "
    pieces = tuple(f" {x.strip()} " for x in re.split(r"\*|\[[^\]]*\]", p) if x.strip())
    rx = re.escape(" " + p + " ")
    rx = rx.replace(r"\ \*\ ", r" (?:[^ ]+ ){1,15}")  # * : the holder's name, 1-15 words
    rx = re.sub(r"\\ \\\[(.+?)\\\]\\ ", lambda m: r" (?:" + m.group(1) + r" )?", rx)  # [words] optional
    return pieces, re.compile(rx)


def _has(norm: str, p: Phrase) -> bool:
    if isinstance(p, str):
        return p in norm
    pieces, rx = p
    return all(x in norm for x in pieces) and rx.search(norm) is not None


def _evidence(p: Phrase) -> str:
    return (p if isinstance(p, str) else p[1].pattern.replace("\\", "")).strip()[:120]


_FULL = {lid: tuple(_phrase(p) for p in phrases) for lid, phrases in FULL_TEXT.items()}
_MODIFIED = [(word, re.compile(rx)) for word, rx in MODIFICATIONS]
_NOTICE = [(lid, re.compile(rx)) for lid, rx in NOTICES.items()]
_NAMED = re.compile(
    r" (?:licensed|licenced|released|distributed|available|published) under (?:the terms of )?(?:the )?("
    + "|".join(sorted(map(re.escape, NAMED), key=len, reverse=True))
    + r") (?:license|licence) "
)
_GNU = re.compile(
    r" (?:under|subject to) the terms (?:and conditions )?of (?:version (\d(?: \d)?) of )?(?:the )?"
    r"gnu (affero general|lesser general|library general|general) public licen[cs]e(?: [al]?gpl)?"
    r"(?: as published by the free software foundation)?(?: either)?"
    r"(?: version (\d(?: \d)?)(?: of the licen[cs]e)?)?( or at your option any later version)?"
)
_GNU_FAMILY = {"affero general": "AGPL", "lesser general": "LGPL", "library general": "LGPL", "general": "GPL"}
_GNU_DEFAULT = {"AGPL": "3.0", "LGPL": "2.0", "GPL": "1.0"}


def _family(spdx_id: str) -> str:
    return spdx_id.removesuffix("-only").removesuffix("-or-later")


# A version named after the notice, in the sentences that follow it ("... as published by the Free
# Software Foundation. ... This program is licensed under version 2 of the GPL" / "GPLv3").
_LATER_VERSION = re.compile(r" (?:version|v|[al]?gplv|[al]?gpl v) ?(\d)(?: (\d))? ")
_LATER_WINDOW = 400  # normalized characters after the notice: its own paragraph and the next


# A version of one GNU family stated anywhere in the text, in words that can mean nothing else:
# "GPL2", "GPLv3", "GPL version 2", "version 2 of the GNU General Public License", "LGPL-2.1".
# "lesser"/"library"/"affero" before "general public" make it another family.
_STATED_VERSION = {
    "GPL": re.compile(
        r"(?: gpl ?v?| (?<!lesser )(?<!library )(?<!affero )general public licen[cs]e(?: gpl)? (?:version |v ?))(\d)(?: (\d))?"
        r"| version (\d)(?: (\d))? of the (?:gnu )?general public licen[cs]e"
    ),
    "LGPL": re.compile(
        r"(?: lgpl ?v?| (?:lesser|library) general public licen[cs]e(?: lgpl)? (?:version |v ?))(\d)(?: (\d))?"
        r"| version (\d)(?: (\d))? of the (?:gnu )?(?:lesser|library) general public licen[cs]e"
    ),
    "AGPL": re.compile(
        r"(?: agpl ?v?| affero general public licen[cs]e(?: agpl)? (?:version |v ?))(\d)(?: (\d))?"
        r"| version (\d)(?: (\d))? of the (?:gnu )?affero general public licen[cs]e"
    ),
}


# "version 2 only", "version 2 or (at your option) any later version": licence words, whatever the family.
_BARE_VERSION = re.compile(r" version (\d)(?: (\d))?(?= only | or (?:at your option )?(?:any )?later )")


def _version_stated(fam: str, norm: str) -> tuple[str, bool] | None:
    """(version, or later) when the text states exactly one version of ``fam`` anywhere, else None.

    "only" after any mention makes it that version only (a text saying "some files version 2 only,
    the others version 2 or any later version" grants version 2 for all of them); "or later" /
    "any later version" after every mention makes it "or later"."""
    versions, later, only = set(), True, False
    for m in [*_STATED_VERSION[fam].finditer(norm), *_BARE_VERSION.finditer(norm)]:
        major, minor = (m.group(1), m.group(2)) if m.group(1) or m.re is _BARE_VERSION else (m.group(3), m.group(4))
        if major not in "123":
            continue
        # "2 1" is LGPL 2.1; a GPL "version 2 0" is 2.0; any other second number is not part of it.
        versions.add(major + (f".{minor}" if minor and (minor == "1" and fam == "LGPL") else ""))
        after = norm[m.end() : m.end() + 60]
        only = only or after.startswith((" only ", " 0 only "))
        later = later and (" later " in after)
    if len(versions) != 1:
        return None
    return versions.pop(), later and not only


def _gnu_notice(m: re.Match[str], norm: str = "") -> str | None:
    fam = _GNU_FAMILY[m.group(2)]
    named = m.group(1) or m.group(3)  # "terms of version 2 of the GNU GPL" or "GNU GPL version 2"
    later_text = norm[m.end() - 1 : m.end() + _LATER_WINDOW]
    if named is None and (v := _LATER_VERSION.search(later_text)) and v.group(1) in "123":
        named = v.group(1) + (f" {v.group(2)}" if v.group(2) else "")
        later = " any later version " in later_text[: v.end() + 60] or " or later " in later_text[: v.end() + 20]
        version = named.replace(" ", ".")
        version = version if "." in version else version + ".0"
        if found := canonical_id(f"{fam}-{version}-{'or-later' if later else 'only'}"):
            return found  # else a "version" of something else: the notice stays unversioned
        named = None
    if named is None and (stated := _version_stated(fam, norm)) is not None:
        named, later = stated  # the version is stated elsewhere in the text ("... the GPL2", "version 2 only")
        version = named if "." in named else named + ".0"
        if found := canonical_id(f"{fam}-{version}-{'or-later' if later else 'only'}"):
            return found
        named = None
    if named is None:
        # No version named anywhere: the GPL itself says any version may be chosen.
        version, later = _GNU_DEFAULT[fam], True
    else:
        version, later = named.replace(" ", "."), bool(m.group(4))
        version = version if "." in version else version + ".0"
    return canonical_id(f"{fam}-{version}-{'or-later' if later else 'only'}")


# Exceptions shipped with a licence text ("---- LLVM Exceptions to the Apache 2.0 License ----"): the
# text is that licence WITH the exception, which is what SPDX and a reader of the file say.
_EXCEPTIONS = (
    ("Apache-2.0", " llvm exceptions to the apache 2 0 license ", "LLVM-exception"),
    ("GPL-3.0", " gcc runtime library exception version 3 1 ", "GCC-exception-3.1"),
)


def _with_exception(m: Match, norm: str) -> list[Match]:
    """The match with its exception; a file holding the base text twice (a bundle of several
    projects' licences) has it once without the exception as well."""
    for base, phrase, exception in _EXCEPTIONS:
        if m.license == base and phrase in norm:
            with_exc = Match(f"{base} WITH {exception}", f"{m.evidence}; {phrase.strip()}", m.kind)
            title = _FULL[base][0]
            return [m, with_exc] if isinstance(title, str) and norm.count(title) > 1 else [with_exc]
    return [m]


def match_normalized(norm: str) -> list[Match]:
    found = [Match(lid, _evidence(phrases[0]), "text") for lid, phrases in _FULL.items() if all(_has(norm, p) for p in phrases)]
    hidden = {sub for m in found for sub in SUBSUMES.get(m.license, ())}
    found = [m for m in found if m.license not in hidden]
    found = [e for m in found for e in _with_exception(m, norm)]
    if found and (mod := next((m for w, rx in _MODIFIED if w in norm and (m := rx.search(norm))), None)):
        # A known text with an added restriction is another licence: never the base one.
        found = [
            Match(f"LicenseRef-modified-{m.license}", f'adds "{mod.group(0).strip()}" to {m.evidence}', "text") for m in found
        ]
    notices: list[Match] = []
    for lid, rx in _NOTICE:
        if m := rx.search(norm):
            notices.append(Match(lid, m.group(0).strip(), "notice"))
    # The GNU texts end with a *sample* notice ("How to Apply These Terms"); it proves the
    # licence text is there, not which version choice the author made: report the bare id.
    sample = " how to apply these terms to your new " in norm
    for m in _GNU.finditer(norm) if " gnu " in norm else ():
        if gnu := _gnu_notice(m, norm):
            gnu = (canonical_id(_family(gnu)) or gnu) if sample else gnu
            notices.append(Match(gnu, m.group(0).strip(), "notice"))
    for m in _NAMED.finditer(norm):
        notices.append(Match(NAMED[m.group(1)], m.group(0).strip(), "notice"))
    # A full GPL/Apache/MPL text carries its own "how to apply" notice: the text decides.
    text_families = {_family(m.license.split(" WITH ")[0]) for m in found}
    seen = {m.license for m in found}
    for n in notices:
        if _family(n.license) not in text_families and n.license not in seen:
            found.append(n)
            seen.add(n.license)
    hidden = {sub for m in found for sub in SUBSUMES.get(m.license, ())}
    return [m for m in found if m.license not in hidden]


def match_text(text: str) -> list[Match]:
    return match_normalized(normalize(text))
