"""Word lists (spam, adult, gambling; Chinese and English) and a URL domain blocklist.

The lists are data files under ``filters/`` (top level) written for this project. A signal counts
the *distinct* listed words a page contains: an encyclopedic page about gambling repeats one or
two terms, a gambling ad stacks many different ones.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datapipe.stages.quality.rules import BUILTIN_DIR, Filter, Rule, register
from datapipe.stages.quality.text import Docs, to_np

FILTERS_DIR = BUILTIN_DIR.parent
CATEGORIES = ("spam", "adult", "gambling")


def read_list(path: Path) -> tuple[str, ...]:
    return parse_list(path.read_text(encoding="utf-8"))


def parse_list(text: str) -> tuple[str, ...]:
    """The entries of a list file: one per line, ``#`` comments, case and order do not matter."""
    lines = (ln.split("#", 1)[0].strip() for ln in text.splitlines())
    return tuple(sorted({ln.lower() for ln in lines if ln}))


def _signature(path: str) -> tuple[str, int, int]:
    """Path plus modification time and size: a list edited between two runs in one long-lived worker
    (Ray reuses worker processes) is read again instead of served stale from the cache."""
    try:
        st = Path(path).stat()
    except OSError:
        return path, -1, -1  # reading it raises the error where it belongs
    return path, st.st_mtime_ns, st.st_size


def word_patterns(path: str) -> tuple[str, tuple[str, ...]]:
    """One alternation to find candidate pages fast, and one pattern per word to count distinct hits."""
    return _word_patterns(_signature(path))


@lru_cache(maxsize=16)
def _word_patterns(signature: tuple[str, int, int]) -> tuple[str, tuple[str, ...]]:
    path = signature[0]
    pats = []
    for w in read_list(Path(path)):
        # Latin words must match whole words ("sex" is not in "Essex"); CJK has no word boundary.
        pats.append(rf"\b{re.escape(w)}\b" if w.isascii() else re.escape(w))
    return "|".join(pats), tuple(pats)


def word_tests(path: str) -> tuple[tuple[str, re.Pattern[str] | None], ...]:
    """Per word of the list, its pattern's test on one Python string: the word as a substring and,
    for a Latin word, the whole-word pattern. RE2 (Arrow's regex) and Python's ``re`` with
    ``re.ASCII`` give ``\\b`` the same meaning (a boundary of ASCII ``[0-9A-Za-z_]``), so the test
    holds exactly where Arrow's match of ``word_patterns``' pattern does."""
    return _word_tests(_signature(path))


@lru_cache(maxsize=16)
def _word_tests(signature: tuple[str, int, int]) -> tuple[tuple[str, re.Pattern[str] | None], ...]:
    _, pats = _word_patterns(signature)
    words = read_list(Path(signature[0]))
    return tuple((w, re.compile(p, re.ASCII) if w.isascii() else None) for w, p in zip(words, pats))


def _count_words(texts: list[str], tests: tuple[tuple[str, re.Pattern[str] | None], ...]) -> np.ndarray:
    return np.array(
        [sum(1 for w, rx in tests if w in t and (rx is None or rx.search(t) is not None)) for t in texts], dtype=np.int32
    )


def distinct_hits(lower: pa.Array, path: Path) -> np.ndarray:
    """Distinct words of the list at ``path`` in each (lowercased) text."""
    any_pat, pats = word_patterns(str(path))
    hits = np.zeros(len(lower), dtype=np.int32)
    if not pats:
        return hits
    cand = np.flatnonzero(to_np(pc.match_substring_regex(lower, any_pat)).astype(bool))
    if len(cand):
        sub = lower.take(pa.array(cand))
        hits[cand] = sum(to_np(pc.match_substring_regex(sub, p)).astype(np.int32) for p in pats)
    return hits


def distinct_hits_of_lists(lower: pa.Array, paths: dict[str, Path]) -> dict[str, np.ndarray]:
    """``distinct_hits`` for several lists, with the texts read once for all of them: one scan for
    a word of any list picks the candidates (most pages have none), and each list is matched on
    those only. A text without a match of the joined alternation has no match of any list."""
    out = {key: np.zeros(len(lower), dtype=np.int32) for key in paths}
    joined = "|".join(p for p in (word_patterns(str(path))[0] for path in paths.values()) if p)
    if not joined:
        return out
    try:
        cand = np.flatnonzero(to_np(pc.match_substring_regex(lower, joined)).astype(bool))
    except pa.ArrowInvalid:  # the lists together too large for one RE2 program: each on its own
        return {key: distinct_hits(lower, path) for key, path in paths.items()}
    if len(cand):  # a few pages (131 of the shared corpus's 27,225): each word tested in Python,
        # instead of one Arrow regex call (compiling its pattern) per word and batch
        texts = lower.take(pa.array(cand)).to_pylist()
        for key, path in paths.items():
            out[key][cand] = _count_words(texts, word_tests(str(path)))
    return out


def domains(path: str) -> frozenset[str]:
    return _domains(_signature(path))


@lru_cache(maxsize=4)
def _domains(signature: tuple[str, int, int]) -> frozenset[str]:
    return frozenset(read_list(Path(signature[0])))


def blocked(urls: list[str | None], blocklist: frozenset[str]) -> np.ndarray:
    """A URL is blocked when its host or any parent domain is listed."""
    out = np.zeros(len(urls), dtype=bool)
    for i, url in enumerate(urls):
        m = re.match(r"^(?:[a-zA-Z][\w+.-]*://)?([^/?#:@]+@)?([^/?#:]+)", url or "")
        if not m:
            continue
        parts = m.group(2).lower().rstrip(".").split(".")
        out[i] = any(".".join(parts[j:]) in blocklist for j in range(len(parts)))
    return out


def _path(params: dict[str, Any], key: str, default: str) -> Path:
    p = Path(params.get(key, default))
    return p if p.is_absolute() else FILTERS_DIR / p


def list_paths(params: dict[str, Any]) -> dict[str, Path]:
    """The word-list and domain-list files a rule set's blocklist settings point at (defaults included)."""
    paths = {f"{c}_list": _path(params, f"{c}_list", f"words/{c}.txt") for c in CATEGORIES}
    paths["domain_list"] = _path(params, "domain_list", "blocklist/domains.txt")
    return paths


def _blocklist(docs: Docs, params: dict[str, Any], batch: pa.Table) -> dict[str, np.ndarray]:
    paths = {f"{c}_words": _path(params, f"{c}_list", f"words/{c}.txt") for c in CATEGORIES}
    out = distinct_hits_of_lists(docs.lower, paths)
    urls = batch["url"].to_pylist() if "url" in batch.column_names else [None] * docs.n
    out["url_blocked"] = blocked(urls, domains(str(_path(params, "domain_list", "blocklist/domains.txt"))))
    return out


register(
    Filter(
        "blocklist",
        {"spam_words": pa.int32(), "adult_words": pa.int32(), "gambling_words": pa.int32(), "url_blocked": pa.bool_()},
        (
            Rule("domain", "url_blocked", "true", "blocked_domain"),
            Rule("spam", "spam_words", "max", "max_spam_words"),
            Rule("adult", "adult_words", "max", "max_adult_words"),
            Rule("gambling", "gambling_words", "max", "max_gambling_words"),
        ),
        _blocklist,
        frozenset({"spam_list", "adult_list", "gambling_list", "domain_list"}),
    )
)
