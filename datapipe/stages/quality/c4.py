"""C4 rules (Raffel et al. 2020, "Exploring the Limits of Transfer Learning", sec. 2.2).

C4 removes bad lines (no terminal punctuation, fewer than 3 words, "javascript", cookie and
policy notices) and drops pages with "lorem ipsum", a curly bracket, or fewer than 5
sentences left. Here nothing is removed: the signals count what C4 would keep, and the
page-level rules decide.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datapipe.stages.quality.charclass import trimmed_word_counts
from datapipe.stages.quality.rules import Filter, Rule, register
from datapipe.stages.quality.text import ENDS_WITH_TERMINAL, Docs, to_np

POLICY = r"terms of use|privacy policy|cookie policy|uses cookies|use of cookies|use cookies"


def _c4(docs: Docs, params: dict[str, Any], batch: pa.Table) -> dict[str, np.ndarray]:
    lines = docs.lines
    n_words = trimmed_word_counts(lines.values)  # the lines' words, counted without splitting them again
    # C4's line rules in turn, each on the lines still kept (same result, less text read): the
    # notices are looked for in lines that end a sentence and have 3 words, sentences counted in
    # the lines kept.
    good = lines.matches(ENDS_WITH_TERMINAL) & (n_words >= 3)
    idx = np.flatnonzero(good)
    lower = pc.utf8_lower(lines.values.take(pa.array(idx)))
    javascript = to_np(pc.match_substring(lower, "javascript")).astype(bool)
    notice = javascript | to_np(pc.match_substring_regex(lower, POLICY)).astype(bool)
    good[idx[notice]] = False
    # Sentences in the kept lines: terminal punctuation followed by a space or the line end.
    ends = np.zeros(len(good))
    ends[good] = to_np(pc.count_substring_regex(lines.values.filter(pa.array(good)), r"[.!?。！？]+[\"'”’)]*(\s|$)"))
    return {
        "c4_lorem_ipsum": to_np(pc.match_substring(docs.lower, "lorem ipsum")).astype(bool),
        "c4_curly_bracket": docs.byte_counts("{") > 0,
        "c4_good_lines": lines.per_doc(good).astype(np.int32),
        "c4_sentences": lines.per_doc(ends).astype(np.int32),
    }


register(
    Filter(
        "c4",
        {"c4_lorem_ipsum": pa.bool_(), "c4_curly_bracket": pa.bool_(), "c4_good_lines": pa.int32(), "c4_sentences": pa.int32()},
        (
            Rule("lorem_ipsum", "c4_lorem_ipsum", "true"),
            Rule("curly_bracket", "c4_curly_bracket", "true"),
            Rule("too_few_sentences", "c4_sentences", "min", "min_sentences"),
        ),
        _c4,
    )
)
