"""How deep one JSON record nests, checked without paying for it on ordinary records.

Python's json parser recurses once per ``[``/``{``: a 100,000-deep line fails with
RecursionError (which is not a ValueError, so it used to end the whole file). Two steps:

1. before parsing, an upper bound in C: a text cannot nest deeper than it has opening
   brackets, which settles nearly every real record at once (all of en/zh Wikipedia);
2. for the rest (code and LaTeX in strings have many brackets), the parsed object's
   containers are walked iteratively, stopping at the cap. The walk visits containers, not
   characters, so it costs next to nothing for a ``{"text": ...}`` record, and the parser
   itself cannot recurse past Python's recursion limit (its RecursionError is a reject too).
"""

from __future__ import annotations

from typing import Any


def may_exceed_depth(raw: bytes, max_depth: int) -> bool:
    """False when ``raw`` certainly nests at most ``max_depth`` arrays/objects deep."""
    return raw.count(b"{") + raw.count(b"[") > max_depth


def depth_exceeds(obj: Any, max_depth: int) -> bool:
    """Whether a parsed JSON value nests deeper than ``max_depth`` arrays/objects (iterative: no recursion)."""
    if not isinstance(obj, (dict, list)):
        return False
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > max_depth:
            return True
        children = value.values() if isinstance(value, dict) else value
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False
