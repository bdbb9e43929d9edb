"""`datapipe explain` asks each stage of the run for its own lines (``Stage.explain``): a stage's way of
grading a document sits in the stage, and a new one (a plugin's too) adds its lines without editing audit/."""

from __future__ import annotations

from typing import Any

from datapipe.audit.explain import stage_sections
from datapipe.stages import STAGES
from datapipe.stages.explain_section import ExplainSection, RecordedRun


def _run(stages: list[Any], answers: list[tuple[Any, ...]] | None = None) -> RecordedRun:
    def query(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        return answers or []

    return RecordedRun({"config": {"stages": stages}}, query, lambda entry: False)


def test_each_stage_of_the_run_adds_its_sections_in_pipeline_order() -> None:
    length = STAGES["length"]

    def explain(cls: type, row: dict[str, Any], run: RecordedRun) -> list[ExplainSection]:
        (options,) = run.stage_options("length_graded")
        return [ExplainSection("length bounds", [f"  n_chars={row['n_chars']}  (min {options['min_chars']})"])]

    graded = type("LengthGraded", (length,), {"name": "length_graded", "explain": classmethod(explain)})
    row = {"n_chars": 40, "cls_q_hq": 0.3}
    stages = [
        {"length_graded": {"min_chars": 50}},
        {"classify": {"models": {"q": {"path": "q.bin"}}, "keep": [{"score": "cls_q_hq", "min": 0.5}]}},
        {"not_installed": {}},  # a plugin stage missing here: left out, not an error
        "length",  # a stage that has nothing to say
    ]
    with STAGES.override(graded):
        sections = stage_sections(row, _run(stages))
    assert sections == [
        ExplainSection("length bounds", ["  n_chars=40  (min 50)"]),
        ExplainSection("classify keep rules, in the order they are checked", ["  FAIL cls_q_hq=0.3000  (>= 0.5)"]),
    ]


def test_a_percentile_rule_reads_its_cut_off_through_the_runs_query() -> None:
    rule = {"score": "cls_q_hq", "min_percentile": 20, "per": ["lang"]}
    run = _run([{"classify": {"keep": [rule]}}], answers=[("cls_q_hq=0.1 < 0.34 (p20 of lang=zh, 1200 docs)",)])
    (section,) = stage_sections({"cls_q_hq": 0.5, "lang": "zh"}, run)
    assert section.lines == ["  ok   cls_q_hq=0.5000  (>= 0.34, the p20 cut-off of lang=zh)"]
