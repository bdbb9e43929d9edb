"""The prose of a Markdown document: what is left after code, math, tables and markup are removed.

Technical Chinese (TiDB docs, OI-wiki) is Markdown: fenced code, ``$...$`` math, tables, HTML and
links sit between the sentences. Judged as a whole, such a page looks like a bad web page (few
sentence ends per Han character, repeated code lines, Latin letters that confuse the language
model) although its prose is good. Signals that describe *prose* (sentence ends, Han share,
repetition, language) are therefore computed on this view; what was removed is measured by
``prose_frac``. Plain web text rarely has these constructs, so the view changes it little: its
URLs, HTML tags and ``$..$`` pairs are removed (zh Wikipedia keeps 94%+ of its characters at p1).

Removed, in this order (RE2 patterns, vectorized over a batch with Arrow):
  fenced code blocks (```, ~~~; indented fences too, as in admonitions), display math
  ($$..$$, \\[..\\]), HTML comments, Hugo shortcodes (``{{< copyable "sql" >}}``), table rows
  (lines starting with ``|``), inline math, HTML tags, bare URLs. Inline code keeps its text (an
  identifier is a word of the sentence: without it, "以 `root` 用户连接" and "以 `alice` 用户连接"
  would read as one repeated line), and a link ``[text](url)`` keeps its text. Indented blocks
  are *not* treated as code: OI-wiki indents prose inside ``???+ note`` admonitions.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

# (pattern, replacement); a removed block leaves a newline so the lines around it stay apart.
_RULES: tuple[tuple[str, str], ...] = (
    (r"(?ms)^[ \t]*(?:```|~~~)[^\n]*\n.*?^[ \t]*(?:```|~~~)[ \t]*$", "\n"),
    (r"(?s)\$\$.+?\$\$", "\n"),
    (r"(?s)\\\[.+?\\\]", "\n"),
    (r"(?s)<!--.*?-->", "\n"),
    (r"\{\{[<%].*?[>%]\}\}", " "),
    (r"(?m)^[ \t]*\|.*$", ""),
    (r"`([^`\n]+)`", r"\1"),
    (r"\$[^$\n]+\$", " "),
    (r"!?\[([^\]\n]*)\]\([^)\n]*\)", r"\1"),
    (r"</?[A-Za-z][^<>\n]*>", " "),
    (r"https?://[^\s)\]>]+", " "),
)
# A document with none of these characters has nothing to remove (a cheap pre-filter).
_ANY = r"`|~~~|\$|\\\[|<|\{\{|^\s*\||\n\s*\||\]\(|https?://"


def prose(text: pa.Array) -> pa.Array:
    """The prose view of every text (same length and order; null stays null)."""
    text = text.combine_chunks() if isinstance(text, pa.ChunkedArray) else text
    if len(text) == 0:
        return text
    has = pc.fill_null(pc.match_substring_regex(text, _ANY), False)
    if not pc.any(has).as_py():
        return text
    idx = pc.indices_nonzero(has)
    sub = pc.take(text, idx)
    for pattern, repl in _RULES:
        sub = pc.replace_substring_regex(sub, pattern, repl)
    return pc.replace_with_mask(text, has, sub)
