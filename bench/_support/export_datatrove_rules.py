"""Writes the two data files behind datapipe's datatrove-compatible rules (``fineweb_datatrove``):

  datapipe/text/spacy_en_rules.json      spaCy's English tokenizer rules, which datatrove's English
                                         word splitter (``spacy.blank("en")``) applies, and the
                                         sentencizer's sentence-ending characters (C4's sentence count);
                                         re-implemented by datapipe/text/spacy_en.py
  datapipe/text/datatrove_chars.json     datatrove's PUNCTUATION and TERMINAL_PUNCTUATION
                                         (datatrove.utils.text), which Gopher and FineWeb rules read

Run with the python of a venv holding datatrove and spacy; it imports nothing from datapipe:

    <venv>/bin/python -m bench._support.export_datatrove_rules datapipe/text

spaCy is MIT licensed (Copyright (C) 2016-2024 ExplosionAI GmbH, 2016 spaCy GmbH, 2015 Matthew
Honnibal); datatrove is Apache-2.0 (Copyright Hugging Face). Each file names its source version.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def dump(path: Path, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=0)
        f.write("\n")


def main() -> None:
    from importlib.metadata import version

    import spacy
    from datatrove.utils.text import PUNCTUATION, TERMINAL_PUNCTUATION
    from spacy.attrs import ORTH
    from spacy.pipeline import Sentencizer

    out = Path(sys.argv[1])
    tok = spacy.blank("en").tokenizer
    assert tok.token_match is None  # the re-implementation has no token_match step
    dump(
        out / "spacy_en_rules.json",
        {
            "source": f"spacy {spacy.__version__}: spacy.blank('en').tokenizer and Sentencizer.default_punct_chars",
            "license": "MIT, Copyright (C) 2016-2024 ExplosionAI GmbH, 2016 spaCy GmbH, 2015 Matthew Honnibal",
            "faster_heuristics": bool(tok.faster_heuristics),
            "prefix": tok.prefix_search.__self__.pattern,
            "suffix": tok.suffix_search.__self__.pattern,
            "infix": tok.infix_finditer.__self__.pattern,
            "url": tok.url_match.__self__.pattern,
            "special_cases": {s: [t[ORTH] for t in subs] for s, subs in sorted(tok.rules.items())},
            "sentence_punct_chars": sorted(Sentencizer.default_punct_chars),
        },
    )
    dump(
        out / "datatrove_chars.json",
        {
            "source": f"datatrove {version('datatrove')}: datatrove.utils.text",
            "license": "Apache-2.0, Copyright Hugging Face",
            "punctuation": PUNCTUATION,
            "terminal_punctuation": "".join(sorted(TERMINAL_PUNCTUATION)),
        },
    )


if __name__ == "__main__":
    main()
