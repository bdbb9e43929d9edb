"""PII redaction: emails, phone numbers, Chinese resident ID numbers and IP addresses become
typed placeholders (``<EMAIL>``, ``<PHONE>``, ``<ID_CARD>``, ``<IP>``); per-document counts are
signals (``pii_email``, ``pii_phone``, ``pii_id_card``, ``pii_ip``). The stage drops nothing.

Precision matters more than recall here: a redacted version number or price damages the text.
So every pattern is anchored against surrounding digits, dots and letters, ID numbers must pass
their checksum and carry a real birth date, and IP candidates must parse as addresses. Addresses
that identify no one (loopback, 0.0.0.0, ::, documentation ranges) stay, as do dotted references
and small dotted numbers without an address word nearby (a film "4.3.2.1", John 1:26.28.48.51).
Measured on a hand-labelled sample of 442 real candidates (tests/fixtures/pii_labelled.jsonl,
bench/quality/pii_eval.py).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from datetime import date

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datapipe.stages.base import CheckContext, Problem, Stage, StageOptions, kinds_problems
from datapipe.stages.columns import set_column
from datapipe.text import charclass

# Boundaries are ASCII for CJK: Chinese text runs straight into numbers and addresses
# (请致电13800138000, 请发邮件至zhang.wei@example.cn), so Han, kana and hangul never join an
# address; Latin with diacritics, Greek, Cyrillic and Indic letters do (Dörte@Sörensen.example.com,
# квіточка@пошта.укр: internationalized addresses). Not preceded by "/" (a Kerberos principal
# alice/kafka@REALM, a path) or by another local-part character.
_LETTERS = "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u0370-\u03ff\u0400-\u04ff\u0900-\u0dff"
_ADDR = _LETTERS + "0-9\u0300-\u036f"
# Where a pattern must not run on into a word, Han, kana and hangul (datapipe.text.charclass) still
# end it (请发邮件至zhang.wei@example.cn谢谢, 电话415-555-0123): "not after/before a word character,
# or after/before a CJK one". The CJK class is only tried where the cheap \w test failed, and the
# lookbehinds only where the first character can start a match (a lookahead for it comes first).
_CJK = charclass.regex_class(charclass.union(charclass.HAN, charclass.KANA, charclass.HANGUL))
_AFTER_CJK, _BEFORE_CJK = rf"(?<=[{_CJK}])", rf"(?=[{_CJK}])"
EMAIL = re.compile(
    rf"(?<![{_ADDR}._%+/-])[{_ADDR}._%+-]+@[{_ADDR}-]+(?:\.[{_ADDR}-]+)*\.[{_LETTERS}]{{2,24}}"
    rf"(?:(?![\w-])|{_BEFORE_CJK})"
)
# Suffixes that look like a top-level domain but name something else: systemd units
# (user@1000.service) and names reserved for local or test use.
NOT_TLD = frozenset(
    {
        "service",
        "socket",
        "target",
        "timer",
        "mount",
        "slice",
        "scope",
        "device",
        "swap",
        "path",
        "local",
        "localhost",
        "internal",
        "lan",
        "invalid",
        "test",
    }
)
# Chinese mobile: 1[3-9]x, 11 digits, optionally +86 and 3-4-4 grouping; international: a + and
# country code, then digit groups, 9-15 digits in all (E.164 allows 15; "+30 24630" is an area
# code, "+123457" a line number). North American: (NPA) NXX-XXXX or NPA-NXX-XXXX with optional
# +1/1, area code and exchange starting 2-9, separators required (a bare 10-digit run is as often an
# id). Not preceded by a digit, dot or letter; not followed by a letter, a digit or a decimal point
# (a sentence's full stop may follow: END). A mobile number is not preceded by $ (LaTeX math) or =
# (a key=value field: "memory total"=14388137984).
END = r"(?![A-Za-z0-9]|\.\d)"
PHONE = re.compile(
    r"(?<![A-Za-z0-9.+$=])(?:(?:\+|00)86[ -]?)?1[3-9]\d(?:[ -]?\d{4}){2}"
    + END
    + r"|(?<![A-Za-z0-9+])\+[1-9]\d{0,2}(?:[ -]?\(?\d{1,4}\)?)(?:[ -]?\d{2,4}){2,4}"
    + END
    + rf"|(?=[+1(2-9])(?:(?<![\w+.-])|{_AFTER_CJK})(?:\+?1[ .-]?)?"
    rf"(?:\([2-9]\d{{2}}\) ?|[2-9]\d{{2}}[ .-])[2-9]\d{{2}}[ .-]\d{{4}}"
    rf"(?:(?![\w-]|\.\d)|{_BEFORE_CJK})"
)
MIN_INTL_DIGITS = 9
ID_CARD = re.compile(r"(?<![A-Za-z0-9.])[1-9]\d{5}(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])\d{3}[\dXx]" + END)
# A dotted quad that continues a reference ("John 1:26.28.48.51", "12:25.29.31.35") is not an address.
IPV4 = re.compile(
    r"(?<![A-Za-z0-9.])(?<!\d:)(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)" + END
)
IPV6 = re.compile(
    rf"(?=[0-9A-Fa-f:])(?:(?<![\w:.])|{_AFTER_CJK})(?:[0-9A-Fa-f]{{0,4}}:){{2,7}}[0-9A-Fa-f]{{0,4}}"
    rf"(?:(?![\w:(])|{_BEFORE_CJK})"
)
# Dotted quads after these words are version or section numbers ("version 1.2.3.4", "§ 3.1.4.1").
VERSIONISH = re.compile(r"(?:\bv|version|ver\.?|release|section|sec\.|§|chapter|版本|章节|第)\s*$", re.I)
# Addresses that identify no one: loopback, unspecified, and the documentation ranges (RFC 5737,
# RFC 3849). They are left in the text, as technical docs use them everywhere.
NOT_PERSONAL = tuple(
    ipaddress.ip_network(n)
    for n in (
        "127.0.0.0/8",
        "0.0.0.0/32",
        "192.0.2.0/24",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "::1/128",
        "::/128",
        "2001:db8::/32",
    )
)
# Small dotted numbers (every part <= 20, or a leading 0) are versions, sections, formulas and
# titles far more often than addresses ("4.3.2.1", a film; 3.1.4.2, a dental formula; 17.4.1.2, a
# standard's section): they count as addresses only with an address word nearby or a port/prefix
# after. 10.0.0.0/8 (private, the docs' example hosts) is always an address.
SMALL_PART = 20
ADDRESS_WORDS = re.compile(
    r"(?i)\b(?:ip|ips|ipv4|address(?:es)?|addr|hosts?|servers?|nodes?|ping|dns|gateway|proxy|router|subnet|listen|bind"
    r"|connect|nameserver|machines?)\b|://|@|地址|主机|服务器|节点|机器|网关"
)
CANDIDATES = (
    r"@|\d{6}|\+\d|\d\.\d+\.\d+\.\d|[0-9A-Fa-f]:[0-9A-Fa-f]*:"
    r"|\d{3}[ .)-] ?\d{3}[ .-]\d{4}"
)  # RE2 pre-filter over the batch

_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)  # GB 11643-1999, ISO 7064 MOD 11-2


def id_card_valid(s: str) -> bool:
    try:
        date(int(s[6:10]), int(s[10:12]), int(s[12:14]))
    except ValueError:
        return False
    total = sum(int(c) * w for c, w in zip(s[:17], _WEIGHTS))
    return "10X98765432"[total % 11] == s[17].upper()


def _email_ok(m: re.Match[str], text: str) -> bool:
    if m.group().rsplit(".", 1)[1].lower() in NOT_TLD:
        return False
    if re.match(r":[\w~/$]", text[m.end() : m.end() + 2]):
        return False  # git@github.com:org/repo (an ssh login)
    word = re.search(r"\S*$", text[max(0, m.start() - 200) : m.start()]).group()  # type: ignore[union-attr]
    return "://" not in word  # https://user:password@host (URL credentials)


def _ip_ok(m: re.Match[str], text: str, v6: bool) -> bool:
    s = m.group()
    if VERSIONISH.search(text[max(0, m.start() - 12) : m.start()]):
        return False
    if v6:
        # Times (12:30:45) and MAC-like pairs are not addresses: require "::" or 8 groups and a parse.
        if "::" not in s and s.count(":") != 7:
            return False
        if re.match(r"\.\d", text[m.end() : m.end() + 2]):
            return False  # ::ffff:127.0.0.1: the IPv4 rule judges the embedded address
        try:
            addr = ipaddress.IPv6Address(s)
        except ValueError:
            return False
        groups = [g for g in s.split(":") if g]
        # C++ scopes parse as addresses (A::f, B::): a compressed address needs 3 groups or a
        # routing prefix of 3-4 hex digits (fe80::1).
        if len(groups) < 3 and not (groups and len(groups[0]) >= 3):
            return False
        return not any(addr in n for n in NOT_PERSONAL if n.version == 6)
    addr4 = ipaddress.IPv4Address(s)
    if any(addr4 in n for n in NOT_PERSONAL if n.version == 4) or s.startswith("255."):
        return False  # loopback, documentation, netmasks
    parts = [int(p) for p in s.split(".")]
    if (max(parts) <= SMALL_PART or parts[0] == 0) and parts[0] != 10:
        near = text[max(0, m.start() - 40) : m.end() + 40]
        return bool(ADDRESS_WORDS.search(near) or re.match(r"[:/]\d", text[m.end() : m.end() + 2]))
    return True


def _phone_ok(m: re.Match[str]) -> bool:
    s = m.group()
    if s.startswith("+"):
        return sum(c.isdigit() for c in s) >= (11 if s.startswith("+1") else MIN_INTL_DIGITS)
    return True


class PiiOptions(StageOptions):
    kinds: list[str] = Field(["web", "paper", "text", "code"], description="Source kinds the stage applies to.")
    email: bool = Field(True, description="Replace email addresses with <EMAIL>.")
    phone: bool = Field(True, description="Replace Chinese mobile, North American and international phone numbers with <PHONE>.")
    id_card: bool = Field(
        True, description="Replace Chinese resident ID numbers (checksum and birth date checked) with <ID_CARD>."
    )
    ip: bool = Field(True, description="Replace IPv4/IPv6 addresses (not loopback, unspecified or documentation ones) with <IP>.")


class Pii(Stage):
    name = "pii"
    summary = "replaces emails, phone numbers, resident ID numbers and IP addresses with placeholders"
    signals = (
        "`pii_email`, `pii_phone`, `pii_id_card`, `pii_ip` (counts; the text gets `<EMAIL>`, `<PHONE>`, "
        "`<ID_CARD>`, `<IP>` in their place)"
    )
    reasons = ()
    Options = PiiOptions
    edit_counts = {
        "pii_email": "emails replaced",
        "pii_phone": "phones replaced",
        "pii_id_card": "ID numbers replaced",
        "pii_ip": "IPs replaced",
    }

    @classmethod
    def check(cls, options: PiiOptions, context: CheckContext) -> list[Problem]:
        return kinds_problems(options.kinds)

    @classmethod
    def output_columns(cls, options: PiiOptions, context: CheckContext) -> set[str] | None:
        return {"pii_email", "pii_phone", "pii_id_card", "pii_ip"}

    def applies_to(self, kind: str) -> bool:
        return kind in self.options.kinds

    def redact(self, text: str) -> tuple[str, dict[str, int]]:
        counts = {"email": 0, "phone": 0, "id_card": 0, "ip": 0}

        def sub(kind: str, pattern: re.Pattern[str], placeholder: str, ok: Callable[[re.Match[str]], bool] | None = None) -> None:
            nonlocal text

            def repl(m: re.Match[str]) -> str:
                if ok is not None and not ok(m):
                    return m.group()
                counts[kind] += 1
                return placeholder

            text = pattern.sub(repl, text)

        o = self.options
        # Order matters: emails first (their digits must not become phones), ID numbers before phones.
        if o.email:
            src = text
            sub("email", EMAIL, "<EMAIL>", lambda m: _email_ok(m, src))
        if o.id_card:
            sub("id_card", ID_CARD, "<ID_CARD>", lambda m: id_card_valid(m.group()))
        if o.ip:
            src = text
            sub("ip", IPV4, "<IP>", lambda m: _ip_ok(m, src, False))
            src = text
            sub("ip", IPV6, "<IP>", lambda m: _ip_ok(m, src, True))
        if o.phone:
            sub("phone", PHONE, "<PHONE>", _phone_ok)
        return text, counts

    def compute(self, batch: pa.Table) -> pa.Table:
        text = pc.fill_null(batch["text"], "")
        n = batch.num_rows
        counts = {k: np.zeros(n, dtype=np.int32) for k in ("email", "phone", "id_card", "ip")}
        cand = np.flatnonzero(pc.match_substring_regex(text, CANDIDATES).to_numpy(zero_copy_only=False))
        if len(cand):
            values = batch["text"].to_pylist()
            for i in cand:
                values[i], c = self.redact(values[i])
                for k, v in c.items():
                    counts[k][i] = v
            batch = set_column(batch, "text", pa.array(values, pa.string()))
        for k, col in counts.items():
            batch = set_column(batch, f"pii_{k}", pa.array(col, pa.int32()))
        return batch
