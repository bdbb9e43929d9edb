"""Markdown and LaTeX structure in plain text, found line by line: the lines an editing stage must not cut.

A stage that removes single lines (``boilerplate``) counts them after punctuation is stripped,
so an opening fence "```sql" becomes "sql", one of the most frequent lines of any documentation
site, while the bare closing "```" never counts: removing the one and keeping the other turns
the rest of a page into code. ``structure_lines`` marks every line that belongs to the markup:

- fenced code (CommonMark): a line of at least three backticks or tildes, after any indentation
  and ``>`` quote markers (OI-wiki indents fences inside content tabs); the block ends at a fence
  of the same character, at least as long, with nothing after it. The fences and every line
  between them are structure;
- display math, outside code: ``$$`` (a line with an odd number of ``$$`` opens or closes a
  block), ``\\[`` ... ``\\]`` and ``\\begin{env}`` ... ``\\end{env}`` (nesting counted): the
  delimiter lines and every line between them;
- GFM tables: the delimiter row (``| --- | :-: |``), the header row above it and the rows below
  it up to the first line without ``|``;
- lines that are only HTML tags (``<div label="SQL">``, ``</div>``, ``<tr>``): one removed
  leaves its partner unbalanced;
- the openers of Python-Markdown containers (``!!! note``, ``??? note "Proof"``, ``=== "C++"``):
  without them their indented body reads as an indented code block.

A block left open runs to the end of its document (the safe side: more is kept). Prose, headings,
list items and lines with inline markup (`` `x` ``, ``$x$``) are not structure: removing them
unbalances nothing.

Cost: one Arrow regular expression over all lines picks the few that can be markup; the others
run over those only, and Python walks only the fence and math delimiter lines.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Any line that can be structure matches this (RE2, ASCII classes: what Arrow runs); the rest of
# a web page's lines are ruled out by it alone.
_CANDIDATE = r"^[ \t>]*(?:```|~~~|!!!|\?\?\?|===|<)|\$\$|\\begin\{|\\end\{|\\\[|\\\]|\|"
_FENCE = r"^[ \t]*(?:>[ \t]*)*(?P<fence>`{3,}|~{3,})(?P<rest>.*)$"
_BLANK = r"^[ \t\r]*$"
_TABLE_RULE = r"^[ \t]*\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t\r]*$"
_TAGS_ONLY = r"^[ \t]*(?:</?[A-Za-z][A-Za-z0-9:_-]*(?:[ \t][^<>]*)?/?>[ \t]*)+\r?$"
_CONTAINER = r"^[ \t]*(?:!!!|\?\?\?\+?|===)[ \t]+\S"
_BRACKET_OPEN = r"^[ \t]*\\\["
_BRACKET_CLOSE = r"\\\][ \t\r]*$"


def _np(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return pc.fill_null(values, False).to_numpy(zero_copy_only=False)


def structure_lines(lines: pa.Array, doc: np.ndarray, block_start: np.ndarray | None = None) -> np.ndarray:
    """For each line, whether it is markup structure (see the module docstring).

    ``lines``: the lines of many documents, in order; ``doc``: each line's document (non-decreasing);
    ``block_start``: True where a line follows a blank line that is not among ``lines`` (a
    paragraph's first line when the caller split on blank lines), so a table does not run on across it."""
    n = len(lines)
    out = np.zeros(n, bool)
    if n == 0:
        return out
    cand = np.flatnonzero(_np(pc.match_substring_regex(lines, _CANDIDATE)))
    if not len(cand):
        return out
    sub = lines.take(pa.array(cand))
    fences = pc.extract_regex(sub, _FENCE)
    fence = fences.field("fence")
    rest = pc.fill_null(fences.field("rest"), "")
    fence_len = pc.fill_null(pc.utf8_length(fence), 0).to_numpy(zero_copy_only=False)
    fence_char = np.where(_np(pc.starts_with(fence, "`")), 1, np.where(fence_len > 0, 2, 0))
    fence_bare = _np(pc.match_substring_regex(rest, _BLANK))
    # A backtick fence's info string holds no backtick (CommonMark): "```a```" is inline code.
    fence_ok = (fence_char == 2) | ((fence_char == 1) & ~_np(pc.match_substring(rest, "`")))
    dollars = pc.count_substring(sub, "$$").to_numpy(zero_copy_only=False)
    begins = pc.count_substring(sub, "\\begin{").to_numpy(zero_copy_only=False)
    ends = pc.count_substring(sub, "\\end{").to_numpy(zero_copy_only=False)
    b_open = _np(pc.match_substring_regex(sub, _BRACKET_OPEN))
    b_close = _np(pc.match_substring_regex(sub, _BRACKET_CLOSE))
    math = (dollars > 0) | (begins > 0) | (ends > 0) | b_open | b_close
    _blocks(out, cand, doc, fence_char, fence_len, fence_bare, fence_ok, dollars, begins, ends, b_open, b_close, math)
    out[cand[_np(pc.match_substring_regex(sub, _TAGS_ONLY)) | _np(pc.match_substring_regex(sub, _CONTAINER))]] = True
    _tables(out, cand, sub, doc, block_start)
    return out


def _blocks(
    out: np.ndarray,
    cand: np.ndarray,
    doc: np.ndarray,
    fence_char: np.ndarray,
    fence_len: np.ndarray,
    fence_bare: np.ndarray,
    fence_ok: np.ndarray,
    dollars: np.ndarray,
    begins: np.ndarray,
    ends: np.ndarray,
    b_open: np.ndarray,
    b_close: np.ndarray,
    math: np.ndarray,
) -> None:
    """Mark code and math blocks: a walk over the delimiter lines only (a few per page)."""
    events = np.flatnonzero((fence_char > 0) | math)
    if not len(events):
        return
    # the last line of each document: where a block left open ends
    doc_end = np.r_[np.flatnonzero(np.diff(doc)), len(doc) - 1]
    last_line = doc_end[np.searchsorted(doc_end, cand[events])]
    starts = np.zeros(len(doc) + 1, np.int64)  # +1 at a block's first line, -1 after its last
    cur_doc = prev_last = -1
    code_char = code_len = 0
    code_at = math_at = -1
    dollar = bracket = False
    depth = 0
    for k, e in enumerate(events.tolist()):
        line = int(cand[e])
        if doc[line] != cur_doc:  # a new document: whatever was open ended with the last one
            if code_at >= 0 or math_at >= 0:
                starts[code_at if code_at >= 0 else math_at] += 1
                starts[prev_last + 1] -= 1
            cur_doc, code_char, code_at, math_at, dollar, bracket, depth = int(doc[line]), 0, -1, -1, False, False, 0
        prev_last = int(last_line[k])
        if code_at >= 0:  # inside code: only its closing fence counts
            if fence_char[e] == code_char and fence_len[e] >= code_len and fence_bare[e]:
                starts[code_at] += 1
                starts[line + 1] -= 1
                code_at = -1
            continue
        if fence_char[e] and fence_ok[e]:
            if math_at >= 0:  # a fence inside math (an unclosed $$ before it): the math ends here
                starts[math_at] += 1
                starts[line] -= 1
                math_at, dollar, bracket, depth = -1, False, False, 0
            code_at, code_char, code_len = line, int(fence_char[e]), int(fence_len[e])
            continue
        if not math[e]:
            continue
        if dollars[e] % 2:
            dollar = not dollar
        depth = max(0, depth + int(begins[e]) - int(ends[e]))
        if b_open[e] and not b_close[e]:
            bracket = True
        elif b_close[e] and not b_open[e]:
            bracket = False
        inside = dollar or bracket or depth > 0
        if math_at < 0:
            math_at = line  # a delimiter line is structure, whether or not it opens a block
        if not inside:
            starts[math_at] += 1
            starts[line + 1] -= 1
            math_at = -1
    if code_at >= 0 or math_at >= 0:
        starts[code_at if code_at >= 0 else math_at] += 1
        starts[prev_last + 1] -= 1
    out |= np.cumsum(starts[:-1]) > 0


def _tables(out: np.ndarray, cand: np.ndarray, sub: pa.Array, doc: np.ndarray, block_start: np.ndarray | None) -> None:
    """A delimiter row, the header row above it and the rows below it: a run of lines with '|'."""
    rule = _np(pc.match_substring_regex(sub, _TABLE_RULE)) & _np(pc.match_substring(sub, "|"))
    if not rule.any():
        return
    has_pipe = np.zeros(len(doc), bool)
    has_pipe[cand[_np(pc.match_substring(sub, "|"))]] = True
    breaks = ~has_pipe
    breaks[1:] |= doc[1:] != doc[:-1]
    if block_start is not None:
        breaks |= block_start
    run = np.cumsum(breaks)  # lines of one run of '|' lines share a number
    first_rule = np.full(run[-1] + 1, len(doc) + 1, np.int64)  # a run without a rule: no line
    rules = cand[rule]
    np.minimum.at(first_rule, run[rules], rules)
    idx = np.arange(len(doc))
    out |= has_pipe & (idx >= first_rule[run] - 1)
