"""spaCy's English word splitter, re-implemented: the words datatrove's English filters count.

datatrove (0.10.1) splits English text into words with ``spacy.blank("en")``'s tokenizer
(``datatrove.utils.word_tokenizers.SpaCyTokenizer``) and drops whitespace tokens. That tokenizer
cuts the text at whitespace into chunks, splits each chunk by prefix, suffix and infix rules
("word," -> "word" ","; "co-op" -> "co" "-" "op"; "(1990)." -> "(" "1990" ")" "."), keeps URLs
whole, and applies special cases ("don't" -> "do" "n't", "e.g." stays one token). So
punctuation and numbers are words of their own, unlike datapipe's whitespace words.

This module runs the same algorithm (spaCy 3.8's ``Tokenizer._tokenize_affixes``,
``_split_affixes``, ``_attach_tokens`` and the special-case matcher, ``faster_heuristics`` on)
with spaCy's own rules, exported to ``spacy_en_rules.json`` by ``bench/_support/export_datatrove_rules.py``,
so datapipe needs no spaCy. A chunk's tokens depend on the chunk alone, so each distinct chunk
is split once per process (``chunk_tokens`` is cached): web text repeats most of its chunks.
bench/quality/fineweb_agreement.py checks the tokens against spaCy's on every distinct chunk of the
shared English corpus.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

RULES_FILE = Path(__file__).with_name("spacy_en_rules.json")


class SpacyEnglish:
    """The tokenizer; ``words(text)`` equals datatrove's ``split_into_words(text, "eng")``."""

    def __init__(self, rules_file: Path = RULES_FILE) -> None:
        data = json.loads(rules_file.read_text(encoding="utf-8"))
        self.source: str = data["source"]
        # Every prefix branch starts with "^", so a match at position 0 is spaCy's search, faster.
        assert all(b.startswith("^") for b in data["prefix"].split("|")), "a prefix rule without ^"
        self._prefix = re.compile(data["prefix"]).match
        self._suffix = re.compile(data["suffix"]).search
        self._infix = re.compile(data["infix"]).finditer
        self._url = re.compile(data["url"]).match
        self.specials: dict[str, tuple[str, ...]] = {k: tuple(v) for k, v in data["special_cases"].items()}
        # The special-case matcher re-joins special cases that affix splitting cut apart. With
        # faster_heuristics spaCy registers only those with an affix, an infix or a space; the
        # pattern is the special case's tokens without special cases.
        self._patterns: dict[tuple[str, ...], str] = {}
        for s in self.specials:
            if " " in s:
                continue  # only whitespace tokens match it, and those are never words
            if not data["faster_heuristics"] or self._find_prefix(s) or self._find_suffix(s) or list(self._infix(s)):
                self._patterns[self._tokenize(s, specials=False)] = s
        self._pattern_lengths = sorted({len(p) for p in self._patterns}, reverse=True)
        self.chunk_tokens: Callable[[str], tuple[str, ...]] = lru_cache(maxsize=1 << 20)(self._chunk)

    def words(self, text: str) -> list[str]:
        """The non-whitespace tokens of ``text`` (spaCy splits at ``str.isspace`` characters, as ``str.split``)."""
        out: list[str] = []
        for chunk in text.split():
            out.extend(self.chunk_tokens(chunk))
        return out

    def _find_prefix(self, s: str) -> int:
        m = self._prefix(s)
        return m.end() - m.start() if m is not None else 0

    def _find_suffix(self, s: str) -> int:
        m = self._suffix(s)
        return m.end() - m.start() if m is not None else 0

    def _chunk(self, chunk: str) -> tuple[str, ...]:
        special = self.specials.get(chunk)
        if special is None and chunk.isascii() and (chunk.isalpha() or chunk.isdigit()):
            # No prefix, suffix, infix or URL rule matches ASCII letters alone or digits alone
            # (each needs punctuation, a symbol, or a digit next to a unit or an operator), and
            # no special-case pattern is one such token: the chunk is one word.
            return (chunk,)
        return self._apply_special_cases(special if special is not None else self._tokenize(chunk, specials=True))

    def _tokenize(self, string: str, specials: bool) -> tuple[str, ...]:
        """``_split_affixes`` then ``_attach_tokens`` on one chunk."""
        prefixes: list[str] = []
        suffixes: list[str] = []
        last_size = 0
        while string and len(string) != last_size:
            if specials and string in self.specials:
                break
            last_size = len(string)
            pre_len = self._find_prefix(string)
            if pre_len:
                prefix, minus_pre = string[:pre_len], string[pre_len:]
                if minus_pre and specials and minus_pre in self.specials:
                    string = minus_pre
                    prefixes.append(prefix)
                    break
            suf_len = self._find_suffix(string[pre_len:])
            if suf_len:
                suffix, minus_suf = string[-suf_len:], string[:-suf_len]
                if minus_suf and specials and minus_suf in self.specials:
                    string = minus_suf
                    suffixes.append(suffix)
                    break
            if pre_len and suf_len and pre_len + suf_len <= len(string):
                string = string[pre_len:-suf_len]
                prefixes.append(prefix)
                suffixes.append(suffix)
            elif pre_len:
                string = minus_pre
                prefixes.append(prefix)
            elif suf_len:
                string = minus_suf
                suffixes.append(suffix)
        tokens = prefixes
        if string:
            special = self.specials.get(string) if specials else None
            if special is not None:
                tokens.extend(special)
            elif self._url(string):
                tokens.append(string)
            else:
                start = 0
                for m in self._infix(string):
                    if m.start() == 0:  # spaCy skips an infix at the very start
                        continue
                    if m.start() != start:
                        tokens.append(string[start : m.start()])
                    if m.start() != m.end():
                        tokens.append(string[m.start() : m.end()])
                    start = m.end()
                if string[start:]:
                    tokens.append(string[start:])
        tokens.extend(reversed(suffixes))
        return tuple(tokens)

    def _apply_special_cases(self, tokens: tuple[str, ...]) -> tuple[str, ...]:
        """spaCy's ``_apply_special_cases`` within one chunk: longest match first, then leftmost."""
        n = len(tokens)
        if n < 2 and not (n == 1 and tokens in self._patterns):
            return tokens
        matches = [
            (i, i + k) for k in self._pattern_lengths if k <= n for i in range(n - k + 1) if tokens[i : i + k] in self._patterns
        ]
        if not matches:
            return tokens
        seen: set[int] = set()
        kept: list[tuple[int, int]] = []
        for start, end in matches:  # already longest first, then leftmost
            if start not in seen and end - 1 not in seen:
                kept.append((start, end))
            seen.update(range(start, end))
        out: list[str] = []
        i = 0
        for start, end in sorted(kept):
            out.extend(tokens[i:start])
            out.extend(self.specials["".join(tokens[start:end])])
            i = end
        out.extend(tokens[i:])
        return tuple(out)


@lru_cache(maxsize=1)
def english() -> SpacyEnglish:
    """The process's one tokenizer (loading the rules compiles four large regular expressions)."""
    return SpacyEnglish()
