"""PII redaction: emails, phone numbers, Chinese resident ID numbers and IP addresses become
typed placeholders (``<EMAIL>``, ``<PHONE>``, ``<ID_CARD>``, ``<IP>``); per-document counts are
signals (``pii_email``, ``pii_phone``, ``pii_id_card``, ``pii_ip``). The stage drops nothing.

Precision matters more than recall here: a redacted version number or price damages the text.
So every pattern is anchored against surrounding digits, dots and letters, ID numbers must pass
their checksum and carry a real birth date, and IP candidates must parse as addresses.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import date

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datapipe.stages.base import CheckContext, Problem, Stage, StageOptions, kinds_problems
from datapipe.stages.columns import set_column

# Boundaries are ASCII: Chinese text runs straight into numbers and addresses (请致电13800138000).
EMAIL = re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,24}(?![\w-])")
# Chinese mobile: 1[3-9]x, 11 digits, optionally +86 and 3-4-4 grouping; international: a + and
# country code, then 6-14 digits in groups. Not preceded by a digit, dot or letter; not followed by
# a letter, a digit or a decimal point (a sentence's full stop may follow: END).
END = r"(?![A-Za-z0-9]|\.\d)"
PHONE = re.compile(
    r"(?<![A-Za-z0-9.+])(?:(?:\+|00)86[ -]?)?1[3-9]\d(?:[ -]?\d{4}){2}" + END +
    r"|(?<![A-Za-z0-9+])\+[1-9]\d{0,2}(?:[ -]?\(?\d{1,4}\)?)(?:[ -]?\d{2,4}){2,4}" + END)
ID_CARD = re.compile(r"(?<![A-Za-z0-9.])[1-9]\d{5}(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])\d{3}[\dXx]" + END)
IPV4 = re.compile(r"(?<![A-Za-z0-9.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)" + END)
IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])")
# Dotted quads after these words are version or section numbers ("version 1.2.3.4", "§ 3.1.4.1").
VERSIONISH = re.compile(r"(?:\bv|version|ver\.?|release|section|sec\.|§|chapter|版本|章节|第)\s*$", re.I)
CANDIDATES = r"@|\d{6}|\+\d|\d\.\d+\.\d+\.\d|[0-9A-Fa-f]:[0-9A-Fa-f]*:"  # RE2 pre-filter over the batch

_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)  # GB 11643-1999, ISO 7064 MOD 11-2


def id_card_valid(s: str) -> bool:
    try:
        date(int(s[6:10]), int(s[10:12]), int(s[12:14]))
    except ValueError:
        return False
    total = sum(int(c) * w for c, w in zip(s[:17], _WEIGHTS))
    return "10X98765432"[total % 11] == s[17].upper()


def _ip_ok(m: re.Match[str], text: str, v6: bool) -> bool:
    s = m.group()
    if VERSIONISH.search(text[max(0, m.start() - 12):m.start()]):
        return False
    if v6:
        # Times (12:30:45) and MAC-like pairs are not addresses: require "::" or 8 groups and a parse.
        if "::" not in s and s.count(":") != 7:
            return False
        try:
            ipaddress.IPv6Address(s)
        except ValueError:
            return False
        return any(c.isalpha() for c in s) or "::" in s
    return True


class PiiOptions(StageOptions):
    kinds: list[str] = Field(["web", "paper", "text", "code"], description="Source kinds the stage applies to.")
    email: bool = True
    phone: bool = True
    id_card: bool = True
    ip: bool = True


class Pii(Stage):
    name = "pii"
    Options = PiiOptions

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

        def sub(kind: str, pattern: re.Pattern[str], placeholder: str, ok=None) -> None:  # type: ignore[no-untyped-def]
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
            sub("email", EMAIL, "<EMAIL>")
        if o.id_card:
            sub("id_card", ID_CARD, "<ID_CARD>", lambda m: id_card_valid(m.group()))
        if o.ip:
            src = text
            sub("ip", IPV4, "<IP>", lambda m: _ip_ok(m, src, False))
            src = text
            sub("ip", IPV6, "<IP>", lambda m: _ip_ok(m, src, True))
        if o.phone:
            sub("phone", PHONE, "<PHONE>")
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
        for k, v in counts.items():
            batch = set_column(batch, f"pii_{k}", pa.array(v, pa.int32()))
        return batch
