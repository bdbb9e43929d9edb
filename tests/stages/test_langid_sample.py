"""fastText reads windows of a long document (``sample``) and answers as it does on the whole text.

Real held-out data: UDHR pages (30 languages lid.176 knows; 3-20k characters each) and the full
zh Wikipedia articles (mixed script, with Japanese quotes and conversion markup).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from datapipe.stages.base import StageContext
from datapipe.stages.langid import LangId, LangIdOptions
from datapipe.stages.langid_sample import SampleOptions, sample_text
from tests.stages.test_langid_accuracy import udhr_text
from tests.support.shared_data import shared_path

PAGES = (
    "arb cmn_hans cmn_hans_beijing cmn_hant deu_1996 eng fra hin ind ita jpn jpn_osaka kor nld pol por_BR rus spa tha tur "
    "ukr vie yue"
).split()


class Recorder:
    """A fastText model that remembers how many characters it was given."""

    def __init__(self, model: Any) -> None:
        self.model, self.chars = model, 0

    def predict(self, texts: list[str], k: int = 1) -> Any:
        self.chars += sum(map(len, texts))
        return self.model.predict(texts, k=k)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    lines = shared_path("corpus", "zh_wikipedia.jsonl").read_text(encoding="utf-8").splitlines()
    articles = [d["text"] for d in map(json.loads, lines) if d["source"].startswith("zhwiki")]
    return [udhr_text(p) for p in PAGES] + articles


def answers(sample: SampleOptions | None, texts: list[str]) -> tuple[list[tuple[str, str | None]], int]:
    options = LangIdOptions(keep=["zh", "en"]).model_copy(update={"sample": sample})
    stage = LangId(options, StageContext(".", "."))
    stage.setup()
    stage._model = recorder = Recorder(stage.fasttext_model)
    out = stage.compute(pa.table({"text": texts}))
    return list(zip(out["lang"].to_pylist(), stage.decide(out).reason.to_pylist())), recorder.chars


def test_windows_answer_as_the_whole_text(texts: list[str]) -> None:
    assert len(texts) == 87 and sum(len(t) > 600 for t in texts) >= 70
    full, full_chars = answers(None, texts)
    sampled, sampled_chars = answers(SampleOptions(), texts)
    assert sampled == full, [(i, f, s) for i, (f, s) in enumerate(zip(full, sampled)) if f != s]
    assert sampled_chars < 0.25 * full_chars, (sampled_chars, full_chars)  # it did read less
    # The comparison can fail: 20 characters are too few to tell these languages apart.
    tiny = SampleOptions.model_construct(chars=20, windows=1, full_below=0.8)
    assert answers(tiny, texts)[0] != full


def test_short_texts_are_read_whole_and_windows_do_not_split_words() -> None:
    assert sample_text("short text", 600, 4) == "short text"
    text = " ".join(f"word{i:04d}" for i in range(500))  # 4,499 characters
    got = sample_text(text, 600, 4)
    assert len(got) <= 600 and got.startswith("word0000 ") and got.endswith(" word0499")
    assert set(got.split()) <= set(text.split())  # every token is a whole word of the text


def test_a_changed_sample_recomputes_the_signals() -> None:
    """``sample`` changes lang and lang_score: a re-decided run (``run --from``) must not reuse them."""
    from datapipe.engine.redecide import config_changes

    assert "sample" not in LangId.decision_options
    old = LangIdOptions().model_dump(mode="json")
    new = LangIdOptions(sample={"chars": 1000}).model_dump(mode="json")
    assert config_changes(old, new, "stages[0].langid") == ["stages[0].langid.sample.chars: 600 -> 1000"]
