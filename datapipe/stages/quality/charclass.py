"""Per-text counts of characters in several one-character classes, in one compiled pass.

``pc.count_substring_regex`` scans every text once per pattern; the Chinese rules count six
classes (whitespace, Han, brackets, digits, symbols, sentence ends) over long pages, which was
most of their time. Here each class is still *defined by its RE2 pattern*: the first time a code
point is seen, Arrow's regex decides its class membership (one tiny string per new code point),
and the answer is kept in a table over all code points. Counting is then a table lookup per
character, so the counts equal the regex counts exactly (tests/stages/test_quality_kernels.py checks
them on the real corpora). A class marked ``runs`` counts maximal runs, as ``[...]+`` does.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datapipe.stages.quality import _kernels
from datapipe.stages.quality.text import SPLIT_WHITESPACE, utf8_buffers

_CODE_POINTS = 0x110000


class CharClasses:
    """Up to 8 one-character regex classes (e.g. ``r"\\p{Han}"``, ``r"[。！？]"``)."""

    def __init__(self, patterns: tuple[str, ...], runs: tuple[bool, ...]) -> None:
        assert len(patterns) == len(runs) <= 8
        self.patterns, self.runs = patterns, np.array(runs, dtype=np.bool_)
        self._table = np.zeros(_CODE_POINTS, np.uint8)  # bit b: matches patterns[b]
        self._known = np.zeros(_CODE_POINTS, np.bool_)
        self._lock = threading.Lock()  # tasks of one worker may share a rule set

    def counts(self, text: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """int64 array (class, text): matches of each class in each text."""
        data, offsets = utf8_buffers(text)
        with self._lock:
            new = np.zeros(_CODE_POINTS, np.bool_)
            if _kernels.mark_code_points(data, offsets, self._known, new):
                self._learn(np.flatnonzero(new))
            out = np.zeros((len(self.patterns), len(offsets) - 1), np.int64)
            _kernels.class_counts(data, offsets, self._table, self.runs, out)
        return out

    def _learn(self, cps: np.ndarray) -> None:
        chars = pa.array([chr(c) for c in cps.tolist()], pa.string())
        for b, pattern in enumerate(self.patterns):
            hit = pc.match_substring_regex(chars, pattern).to_numpy(zero_copy_only=False).astype(bool)
            self._table[cps[hit]] |= np.uint8(1 << b)
        self._known[cps] = True


_SPACE_RUNS = CharClasses((SPLIT_WHITESPACE,), (True,))


def trimmed_word_counts(text: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``len(pc.utf8_split_whitespace(t))`` for every non-empty text ``t`` that neither starts nor ends
    with whitespace (``Docs.lines``: trimmed, empty lines left out), without making the pieces:
    Arrow cuts such a text at each maximal whitespace run, so it has one word more than runs.
    (At the ends Arrow's pieces are irregular: "a  " splits into "a", "", "". Not for such texts.)"""
    return _SPACE_RUNS.counts(text)[0] + 1
