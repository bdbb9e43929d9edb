"""datatrove's per-document verdicts for bench/quality/fineweb_agreement.py. Run with the python of a venv
holding ``datatrove[processing]`` and spacy; it imports nothing from datapipe.

    <venv>/bin/python -m bench._support.datatrove_agreement DOCS.jsonl LID_MODEL OUT.jsonl

DOCS.jsonl: one ``{"id", "text"}`` per line. For each document, one line of OUT.jsonl:
``{"id", "en": LanguageFilter(["en"]) keeps it}`` and, for English documents, ``"reason"``: the
first failing filter's reason in datatrove's chain order (null: kept), ``"filters"``: ``{filter:
reason or null}``, ``"words"``: sha1 of datatrove's English words joined by spaces (it checks
datapipe's tokenizer). ``filters`` judges each filter on its own (FineWeb on the text
C4QualityFilter leaves when C4 keeps the document, as in the chain, since C4QualityFilter
rewrites ``doc.text``; on the original text otherwise).
Every filter has its defaults, as in bench/_support/datatrove_pipeline.py.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time


def main() -> None:
    from datatrove.data import Document
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
        LanguageFilter,
    )
    from datatrove.utils.text import split_into_words
    from fasttext.FastText import _FastText

    docs_path, model, out_path = sys.argv[1:4]
    lang = LanguageFilter(languages=["en"])
    lang.model._model = _FastText(model)  # no download: the lid.176 file datapipe uses
    filters = {
        "gopher_repetition": GopherRepetitionFilter(),
        "gopher_quality": GopherQualityFilter(),
        "c4": C4QualityFilter(),
        "fineweb": FineWebQualityFilter(),
    }

    def verdict(f, doc: Document) -> str | None:
        r = f.filter(doc)
        if r is True or (isinstance(r, tuple) and r[0]):
            return None
        return r[1] if isinstance(r, tuple) else "dropped"

    seconds = 0.0  # the four filters only, every filter on every English document
    with open(docs_path, encoding="utf-8") as fin, open(out_path, "w", encoding="utf-8") as fout:
        for line in fin:
            d = json.loads(line)
            doc = Document(text=d["text"], id=d["id"])
            en = bool(lang.filter(doc))
            rec: dict = {"id": d["id"], "en": en}
            if en:  # the comparison is on English documents only
                out: dict[str, str | None] = {}
                t = time.perf_counter()
                for name, f in filters.items():
                    if name == "fineweb" and out["c4"] is not None:
                        doc = Document(text=d["text"], id=d["id"])  # C4 dropped it: FineWeb on the original
                    out[name] = verdict(f, doc)  # C4QualityFilter rewrites doc.text when it keeps the page
                seconds += time.perf_counter() - t
                rec["reason"] = next((f"{k}:{v}" for k, v in out.items() if v is not None), None)
                rec["filters"] = out
                rec["words"] = hashlib.sha1(" ".join(split_into_words(d["text"], "eng")).encode("utf-8")).hexdigest()
            fout.write(json.dumps(rec) + "\n")
    print(json.dumps({"filter_seconds": seconds}))


if __name__ == "__main__":
    main()
