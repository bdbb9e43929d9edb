"""The viewer's threshold lines come from each stage's own declaration (``Stage.thresholds``), with the
options the run recorded: a plugin stage draws its own, an unknown stage type draws none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from datapipe.stages import STAGES, Stage
from datapipe.stages.explain_section import RecordedRun, Threshold, threshold_if_set
from datapipe.view.thresholds import thresholds


class Toxicity(Stage):
    name = "toxicity"

    @classmethod
    def thresholds(cls, options: dict[str, Any], run: RecordedRun) -> list[Threshold]:
        return threshold_if_set("tox_score", options.get("max_score"), "max", "toxicity.max_score")


def _labels(found: dict[str, list[Threshold]]) -> dict[str, list[str]]:
    return {column: [t.label for t in ts] for column, ts in found.items()}


def test_each_stage_declares_its_thresholds_from_the_recorded_options(tmp_path: Path) -> None:
    run = {
        "config": {
            "stages": [
                {"langid": {"keep": ["zh"], "min_score": 0.65, "by_kind": {"code": {"min_score": 0.2}}}},
                {"length": {"min_chars": 50}},
                {"classify": {"keep": [{"score": "cls_edu_high", "min": 0.3}, {"bucket": "edu", "min": 2}]}},
                {"toxicity": {"max_score": 0.8}},
                {"not_installed_here": {"min": 1}},
            ]
        }
    }
    (tmp_path / "run.json").write_text(json.dumps(run))
    with STAGES.override(Toxicity):
        found = _labels(thresholds(tmp_path, run))
    assert found == {
        "lang_score": ["langid.min_score >= 0.65", "langid.by_kind.code.min_score >= 0.2"],
        # length decides on the stripped length; drawn on the raw length's histogram too
        "n_chars_stripped": ["length.min_chars >= 50"],
        "n_chars": ["length.min_chars >= 50"],
        "cls_edu_high": ["classify keep cls_edu_high.min >= 0.3"],
        "tox_score": ["toxicity.max_score <= 0.8"],
    }
