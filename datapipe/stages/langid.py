"""Language identification with fastText lid.176, per document.

Signals: ``lang`` (ISO 639 code as lid.176 names it: zh, en, ja, yue, ...) and
``lang_score`` (the model's probability). The decision keeps configured languages
above ``min_score``. Code is not filtered by natural language by default.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datapipe.models import ensure_lid_model
from datapipe.stages.base import Decision, Resources, Stage, StageOptions
from datapipe.stages.columns import set_column

_MODELS: dict[str, object] = {}  # one loaded model per worker process


class LangIdOptions(StageOptions):
    keep: list[str] | None = Field(None, description="Languages to keep (lid.176 codes); omit to keep all.")
    min_score: float = Field(0.5, ge=0.0, le=1.0, description="Minimum probability of the top language.")
    kinds: list[str] = Field(["web", "paper", "text"], description="Source kinds the stage applies to.")
    max_chars: int = Field(20_000, ge=100, description="Characters of each document the model reads.")
    model: str | None = Field(None, description="Path to a fastText model; default lid.176.ftz (fetched).")


class LangId(Stage):
    name = "langid"
    Options = LangIdOptions
    resources = Resources(num_cpus=1, memory_mb=300)

    def prepare(self) -> None:
        self._model_path()  # fetch once on the driver; a clear error here beats one per task

    def setup(self) -> None:
        path = str(self._model_path())
        if path not in _MODELS:
            import fasttext

            fasttext.FastText.eprint = lambda *a, **k: None  # silence its load-time warning
            _MODELS[path] = fasttext.load_model(path)
        self._model = _MODELS[path]

    def _model_path(self) -> Path:
        if self.options.model:
            p = Path(self.options.model)
            return p if p.is_absolute() else Path(self.context.pipeline_dir) / p
        return ensure_lid_model()

    def applies_to(self, kind: str) -> bool:
        return kind in self.options.kinds

    def compute(self, batch: pa.Table) -> pa.Table:
        if not hasattr(self, "_model"):
            self.setup()
        # fastText reads one line: newlines become spaces; long documents are judged by a prefix.
        text = pc.utf8_slice_codeunits(pc.fill_null(batch["text"], ""), 0, self.options.max_chars)
        text = pc.replace_substring_regex(text, r"\s+", " ")
        labels, scores = self._model.predict(text.to_pylist(), k=1)
        lang = [lab[0][9:] if lab else None for lab in labels]  # strip "__label__"
        score = np.array([s[0] if len(s) else 0.0 for s in scores], dtype=np.float32)
        batch = set_column(batch, "lang", pa.array(lang, pa.string()))
        return set_column(batch, "lang_score", pa.array(np.minimum(score, 1.0), pa.float32()))

    def decide(self, batch: pa.Table) -> Decision:
        lang, score = batch["lang"], batch["lang_score"]
        low = pc.less(score, self.options.min_score)
        detail = pc.binary_join_element_wise("lang=", lang, " score=",
                                             pc.cast(pc.round(score, 3), pa.string()), "")
        if self.options.keep is not None:
            other = pc.invert(pc.is_in(lang, pa.array(self.options.keep, pa.string())))
            other = pc.fill_null(other, True)
        else:
            other = pc.equal(score, -1.0)  # all false
        null = pa.scalar(None, pa.string())
        reason = pc.if_else(other, "language_not_kept", pc.if_else(low, "low_language_score", null))
        return Decision(reason, pc.if_else(pc.is_null(reason), null, detail))
