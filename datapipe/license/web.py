"""Creative Commons detection for web pages (HTML or extracted text).

Evidence is ranked; the first level with a finding decides:
  1. rel="license" on <link>/<a> pointing at a CC licence (the machine-readable statement)
  2. any other CC licence URL in an href/src (footer links, 88x31 badges)
  3. prose: "CC BY-SA 4.0", "Creative Commons Attribution-ShareAlike 4.0", 知识共享 署名-相同方式共享
     4.0 -- only next to a licensing cue ("licensed under", "©", 许可/协议), because articles
     *about* Creative Commons mention every variant.
Several different licences at the winning level are combined with AND.
"""

from __future__ import annotations

import html as htmllib
import re

from datapipe.license.cc import spdx_for, spdx_for_url
from datapipe.license.detection import Detection
from datapipe.license.expression import combine
from datapipe.license.spdx import UNKNOWN

MAX_CHARS = 2_000_000
_TAG = re.compile(r"<(a|link|img|meta)\b([^>]*)>", re.I)
_ATTR = re.compile(r"""([\w:-]+)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""")
_STRIP = re.compile(r"<script\b.*?</script>|<style\b.*?</style>|<[^>]+>", re.I | re.S)

_ZH_VARIANT = {
    "署名": "by",
    "姓名标示": "by",
    "姓名標示": "by",
    "非商业性使用": "nc",
    "非商業性": "nc",
    "非商业性": "nc",
    "相同方式共享": "sa",
    "相同方式分享": "sa",
    "禁止演绎": "nd",
    "禁止改作": "nd",
}
_VERSION = r"(?:[\s-]*(?:licen[cs]e\s*|v(?:ersion)?\.?\s*)?(\d\.\d))?"
_TEXT_FORMS = [
    # CC BY-NC-SA 4.0 / CC-BY-4.0 / CC BY 3.0
    (re.compile(r"\bCC[\s-]+(BY(?:[\s-]+(?:NC|SA|ND)){0,2})\b" + _VERSION, re.I), "short"),
    # Creative Commons Attribution-NonCommercial-ShareAlike 4.0 International
    (
        re.compile(
            r"Creative\s+Commons\s+(Attribution(?:[\s/-]+(?:Non[\s-]?Commercial|Share[\s-]?Alike"
            r"|No[\s-]?Deriv(?:ative)?s|No[\s-]?Derivative[\s-]?Works))*)"
            r"(?:\s+(?:International|Unported|Generic))?" + _VERSION,
            re.I,
        ),
        "long",
    ),
    # 知识共享 署名-非商业性使用-相同方式共享 4.0 / 创用CC 姓名標示
    (
        re.compile(
            r"(?:知识共享|知識共享|创作共用|創作共用|創用\s?CC|共享创意)\s*[「“\"]?\s*((?:"
            + "|".join(_ZH_VARIANT)
            + r")(?:\s*[-－—/]\s*(?:"
            + "|".join(_ZH_VARIANT)
            + r"))*)"
            + r"(?:\s*(\d\.\d))?"
        ),
        "zh",
    ),
    (re.compile(r"\bCC0(?:[\s-]+1\.0)?\b|Creative\s+Commons\s+Zero", re.I), "cc0"),
]
# A licensing statement must precede the mention ("available under the", "©", 采用 ...);
# "its licenses include CC BY-SA" is not one.  Chinese puts 许可协议 after the name.
_CUE_BEFORE = re.compile(
    r"(?:licen[cs]ed|available|released|published|distributed|dedicated|shared|offered|provided)\s+under"
    r"|under\s+(?:a|the|an)\s|under\s*$|licen[cs]e\s*[:：]|©|\(c\)|copyright|public domain"
    r"|采用|遵循|依据|基于|授权|授權|许可|許可",
    re.I,
)
# A variant term later in the same sentence that the match did not absorb ("CC BY, non-
# commercial use only"): skip the match rather than report a laxer licence than stated.
_MORE_TERMS = re.compile(
    r"[^.。;；!?\n]{0,40}?(?:(?i:share[\s-]?alike|non[\s-]?commercial|no[\s-]?deriv)"
    r"|\b(?:NC|SA|ND)\b|非商|相同方式|禁止)"
)
_CUE_AFTER = re.compile(r"^\W{0,3}[^。.!?]{0,20}(?:许可|許可|协议|協議|授權|授权)")


def _attrs(raw: str) -> dict[str, str]:
    return {m.group(1).lower(): htmllib.unescape(m.group(2) or m.group(3) or m.group(4) or "") for m in _ATTR.finditer(raw)}


def _from_text_match(m: re.Match[str], form: str) -> str | None:
    if form == "cc0":
        return "CC0-1.0"
    words = re.split(r"[\s/\-－—]+", m.group(1).strip())
    if form == "short":
        variant = "-".join(w.lower() for w in words)
    elif form == "long":
        # Flags by keyword: spellings vary (NonCommercial, Non-Commercial, Share Alike).
        flat = re.sub(r"[\s/-]+", "", m.group(1).lower())
        variant = "-".join(
            ["by"] + [v for k, v in (("noncommercial", "nc"), ("sharealike", "sa"), ("noderiv", "nd")) if k in flat]
        )
    else:
        variant = "-".join(_ZH_VARIANT[w] for w in re.split(r"\s*[-－—/]\s*", m.group(1).strip()))
    return spdx_for(variant, m.group(2))


def _markup_findings(page: str) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    rel, other = [], []
    for m in _TAG.finditer(page):
        tag, attrs = m.group(1).lower(), _attrs(m.group(2))
        for key in ("href", "src", "content"):
            if not attrs.get(key) or not (found := spdx_for_url(attrs[key])):
                continue
            if "license" in attrs.get("rel", "").lower().split():
                rel.append((found[0], found[1], f"html:{tag}[rel=license]"))
            else:
                other.append((found[0], found[1], f"html:{tag}[{key}]"))
    return rel, other


def _text_findings(text: str) -> list[tuple[str, str, str]]:
    out = []
    for rx, form in _TEXT_FORMS:
        for m in rx.finditer(text):
            before, after = text[max(0, m.start() - 120) : m.start()], text[m.end() : m.end() + 30]
            if not (_CUE_BEFORE.search(before) or _CUE_AFTER.search(after)):
                continue
            if _MORE_TERMS.match(text, m.end()):
                continue  # a variant word we failed to read follows: never report a laxer licence
            if lid := _from_text_match(m, form):
                out.append((lid, " ".join(m.group(0).split()), "text"))
    return out


def _detection(findings: list[tuple[str, str, str]]) -> Detection:
    ids = list(dict.fromkeys(f[0] for f in findings))
    first = {f[0]: f for f in reversed(findings)}
    return Detection(combine(ids), "; ".join(first[i][1] for i in ids), ",".join(dict.fromkeys(first[i][2] for i in ids)))


def detect_web(html_or_text: str) -> Detection:
    """CC licence of a page given as HTML (or plain extracted text); `unknown` if none."""
    page = html_or_text[:MAX_CHARS]
    rel, other = _markup_findings(page) if "<" in page else ([], [])
    for level in (rel, other):
        if level:
            return _detection(level)
    text = htmllib.unescape(_STRIP.sub(" ", page)) if "<" in page else page
    if found := _text_findings(text):
        return _detection(found)
    return Detection(UNKNOWN, "", "")


def detect_hints(hints: list[str]) -> Detection:
    """CC licence from the short evidence list a reader kept (``license_hints``): the CC URLs in it.

    The hints lost their surrounding sentence, so bare "CC BY-SA 4.0" snippets (which articles
    *about* licences also contain) are not trusted here; the caller falls back to the text."""
    findings = [(found[0], found[1], "html:hint") for h in hints if (found := spdx_for_url(h))]
    return _detection(findings) if findings else Detection(UNKNOWN, "", "")


def detect_web_batch(pages: list[str]) -> list[Detection]:
    return [detect_web(p) for p in pages]
