"""FineWeb's own rules (Penedo et al. 2024, "The FineWeb Datasets", sec. 3.3 and datatrove's
FineWebQualityFilter): lines ending in punctuation, short lines, duplicated-line characters,
and newlines per word (list-like pages)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from datapipe.stages.quality.rules import Filter, Rule, register
from datapipe.stages.quality.text import ENDS_WITH_TERMINAL, Docs, duplicates, ratio

F32 = pa.float32()


def _fineweb(docs: Docs, params: dict[str, Any], batch: pa.Table) -> dict[str, np.ndarray]:
    lines = docs.lines
    n_lines = lines.per_doc()
    short = params.get("short_line_length", 30)
    _, dup_chars = duplicates(lines)
    return {
        "fineweb_line_punct_ratio": ratio(lines.per_doc(lines.matches(ENDS_WITH_TERMINAL)), n_lines),
        "fineweb_short_line_ratio": ratio(lines.per_doc(lines.lengths <= short), n_lines),
        "fineweb_char_dup_ratio": ratio(dup_chars, lines.per_doc(lines.lengths)),
        "fineweb_newline_ratio": ratio(docs.byte_counts("\n"), docs.words.per_doc()),
    }


register(
    Filter(
        "fineweb",
        {
            "fineweb_line_punct_ratio": F32,
            "fineweb_short_line_ratio": F32,
            "fineweb_char_dup_ratio": F32,
            "fineweb_newline_ratio": F32,
        },
        (
            Rule("line_punct_ratio", "fineweb_line_punct_ratio", "min"),
            Rule("short_line_ratio", "fineweb_short_line_ratio", "max"),
            Rule("char_dup_ratio", "fineweb_char_dup_ratio", "max"),
            Rule("newline_ratio", "fineweb_newline_ratio", "max"),
        ),
        _fineweb,
        frozenset({"short_line_length"}),
    )
)
