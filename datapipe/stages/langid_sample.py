"""What of a long document fastText reads: a few evenly spaced windows, the whole text only when in doubt.

fastText lid.176 averages the embeddings of a text's words and character n-grams, so its answer on a
long page is settled by a small, representative part of it, while its cost grows with every
character. The langid stage gives a document longer than ``sample.chars`` the text of ``windows``
windows spread from its start to its end (each cut at whitespace or a CJK full stop, so no word is
split where a boundary is near), and reads the whole prefix of ``max_chars`` as before when the
windows' score is below ``full_below``. Shorter documents are read whole, exactly as before.

The defaults are measured on the 27,369 documents of ../shared/data/corpus (``bench/perf/langid.py
--sample``, ``bench/results/langid_prefix.json``): the stage decides as with the whole 20,000-character
prefix on all but one of them, fastText reading 29.5% of the characters with 2.7-2.8x less CPU (two
runs). Chosen against raw fastText on the same documents: 4 windows of 150 characters alone differ
from the whole prefix in language or keep on 10 documents, on none with the re-read under 0.7 or 0.8;
a 600, 1,000 or 2,000-character prefix with the re-read under 0.8 on 10, 8 and 2.
"""

from __future__ import annotations

import re

from pydantic import Field, model_validator

from datapipe.stages.base import StageOptions

# Where a window may be cut: whitespace (fastText's own word boundary) or a CJK sentence end.
_BOUNDARY = re.compile(r"[\s。！？]")
MIN_WINDOW_CHARS = 25  # a window narrower than a few words is not a sample of the language


class SampleOptions(StageOptions):
    chars: int = Field(600, ge=100, description="Documents longer than this are judged on this many characters of windows.")
    windows: int = Field(4, ge=1, le=64, description="Windows, evenly spaced from the start to the end of the text.")
    full_below: float = Field(
        0.8, ge=0.0, le=1.0, description="A windows' score under this reads the whole text (max_chars) instead."
    )

    @model_validator(mode="after")
    def _window_width(self) -> SampleOptions:
        if self.chars // self.windows < MIN_WINDOW_CHARS:
            raise ValueError(
                f"chars / windows is {self.chars // self.windows} characters per window; "
                f"at least {MIN_WINDOW_CHARS} are needed (raise chars or lower windows)"
            )
        return self


def sample_text(text: str, chars: int, windows: int) -> str:
    """``text`` itself when it has at most ``chars`` characters, else ``windows`` windows of
    ``chars // windows`` characters evenly spaced over it (the first at its start, the last at its
    end), joined by spaces. A window starts after and ends before a boundary found in its first or
    last quarter; a run without one (a long CJK paragraph) is cut where it falls."""
    n = len(text)
    if n <= chars:
        return text
    width = chars // windows
    parts = []
    for i in range(windows):
        start = (n - width) * i // (windows - 1) if windows > 1 else 0
        end = start + width
        if start > 0 and not _BOUNDARY.match(text, start - 1):
            m = _BOUNDARY.search(text, start, start + width // 4)
            start = m.end() if m else start
        if end < n and not _BOUNDARY.match(text, end):
            last = [m.start() for m in _BOUNDARY.finditer(text, end - width // 4, end)]
            end = last[-1] if last else end
        parts.append(text[start:end])
    return " ".join(parts)
