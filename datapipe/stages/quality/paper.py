"""Paper rules (LaTeX or plain text): minimum length, share of LaTeX markup, empty sections.

Markup is what a reader does not read: ``\\commands``, braces, ``$``, ``%`` comments. A
section is empty when fewer than ``empty_section_chars`` characters follow its heading
before the next heading.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datapipe.stages.quality.rules import Filter, Rule, register
from datapipe.stages.quality.text import Docs, ratio, to_np

F32 = pa.float32()
MARKUP = r"\\[a-zA-Z@]+\*?|\\[%$&#_{}]|[{}$\\]|(?m:%.*$)"
HEADING = re.compile(r"\\(?:sub)*section\*?\{[^}]*\}|^#{1,4} .*$", re.M)


def _empty_sections(text: str, min_chars: int) -> tuple[int, int]:
    heads = list(HEADING.finditer(text))
    ends = [h.start() for h in heads[1:]] + [len(text)]
    bodies = [text[h.end() : e] for h, e in zip(heads, ends)]
    return len(heads), sum(len("".join(b.split())) < min_chars for b in bodies)


def _paper(docs: Docs, params: dict[str, Any], batch: pa.Table) -> dict[str, np.ndarray]:
    min_chars = int(params.get("empty_section_chars", 20))
    n_sec = np.zeros(docs.n, dtype=np.int32)
    n_empty = np.zeros(docs.n, dtype=np.int32)
    for i in np.flatnonzero(to_np(pc.match_substring_regex(docs.text, r"\\(sub)*section|(?m)^#{1,4} "))):
        n_sec[i], n_empty[i] = _empty_sections(docs.text[i].as_py(), min_chars)
    markup = to_np(pc.utf8_length(pc.replace_substring_regex(docs.text, MARKUP, ""))).astype(np.int64)
    return {
        "paper_chars": docs.n_chars.astype(np.int32),
        "paper_markup_frac": ratio(docs.n_chars - markup, docs.n_chars),
        "paper_sections": n_sec,
        "paper_empty_section_frac": ratio(n_empty, n_sec),
    }


register(
    Filter(
        "paper",
        {"paper_chars": pa.int32(), "paper_markup_frac": F32, "paper_sections": pa.int32(), "paper_empty_section_frac": F32},
        (
            Rule("too_short", "paper_chars", "min", "min_chars"),
            Rule("markup_frac", "paper_markup_frac", "max"),
            Rule("empty_sections", "paper_empty_section_frac", "max"),
        ),
        _paper,
        frozenset({"empty_section_chars"}),
    )
)
