"""Precision and recall of PII redaction on the hand-labelled sample (tests/fixtures/pii_labelled.jsonl).

Each row is one candidate string in 60 characters of real context, with the label of what it
is. The stage redacts the whole context; the candidate counts as detected as type T when a
``<T>`` placeholder replaced text overlapping it. Black-box on ``redact``, so the same measure
runs on any version of the stage (bench/quality/pii_eval.py prints it before and after a change).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "pii_labelled.jsonl"
TYPES = ("email", "phone", "id_card", "ip")
PLACEHOLDER = re.compile(r"<(EMAIL|PHONE|ID_CARD|IP)>")


def load() -> list[dict]:
    return [json.loads(ln) for ln in SAMPLE.read_text(encoding="utf-8").splitlines() if ln.strip()]


def detected(redact: Callable[[str], tuple[str, dict]], row: dict) -> str | None:
    """The PII type the stage gave the candidate's span, or None if it left it alone."""
    text, start, end = row["context"], row["start"], row["end"]
    out, _ = redact(text)
    found: dict[str, int] = {}
    for a, b, kind in replaced(text, out):
        overlap = min(b, end) - max(a, start)
        if overlap > 0:
            found[kind] = max(found.get(kind, 0), overlap)
    return max(found, key=found.__getitem__) if found else None


def replaced(text: str, out: str) -> list[tuple[int, int, str]]:
    """The spans of ``text`` that became placeholders in ``out``: (start, end, kind).

    Redaction keeps everything else verbatim, so the literal pieces of ``out`` between
    placeholders must appear in order in ``text``; the shortest replaced span that lets the
    rest align is taken (backtracking over the few possible lengths).
    """
    pieces = PLACEHOLDER.split(out)  # literal, kind, literal, kind, ..., literal
    literals, kinds = pieces[0::2], [k.lower() for k in pieces[1::2]]

    def align(k: int, pos: int) -> list[tuple[int, int, str]] | None:
        if not text.startswith(literals[k], pos):
            return None
        pos += len(literals[k])
        if k == len(kinds):
            return [] if pos == len(text) else None
        for stop in range(pos + 1, len(text) + 1):
            rest = align(k + 1, stop)
            if rest is not None:
                return [(pos, stop, kinds[k]), *rest]
        return None

    return align(0, 0) or []


def scores(redact: Callable[[str], tuple[str, dict]], rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per type: tp, fp, fn, precision, recall (1.0 where nothing was predicted or labelled)."""
    got = [detected(redact, r) for r in rows]
    out: dict[str, dict[str, float]] = {}
    for t in TYPES:
        tp = sum(g == t and r["label"] == t for g, r in zip(got, rows))
        fp = sum(g == t and r["label"] != t for g, r in zip(got, rows))
        fn = sum(g != t and r["label"] == t for g, r in zip(got, rows))
        out[t] = {
            "tp": tp,
            "fp": fp,
            "fn": fn,
            "precision": tp / (tp + fp) if tp + fp else 1.0,
            "recall": tp / (tp + fn) if tp + fn else 1.0,
        }
    return out


def errors(redact: Callable[[str], tuple[str, dict]], rows: list[dict]) -> list[tuple[str, str | None, str, str]]:
    """(label, detected, match, source) of every row where they differ."""
    out = []
    for r in rows:
        g = detected(redact, r)
        if (g or "none") != r["label"]:
            out.append((r["label"], g, r["match"], r["source"]))
    return out
