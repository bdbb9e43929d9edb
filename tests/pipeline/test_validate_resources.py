"""Validation checks every file and value a run needs (issue 16, item 3), before any work starts.

Each case is a pipeline over the real corpora in ../shared/data that used to pass `datapipe validate`
and then crash in `run` (a RuleSetError traceback) or silently drop everything (`keep: [chinese]`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from datapipe.cli import main
from datapipe.pipeline.load import ConfigError, load_pipeline
from datapipe.text.langcodes import LID176_CODES, LID176_NAMES, suggest_language
from tests.support.shared_data import PROJECT_ROOT, shared_path


def write_pipeline(folder: Path, stages: list, **extra) -> Path:
    sources = [
        {"name": "oiwiki", "kind": "web", "paths": [str(shared_path("corpus", "zh_oiwiki.jsonl"))]},
        {"name": "enwiki", "kind": "web", "paths": [str(shared_path("corpus", "en_wikipedia.jsonl"))]},
    ]
    cfg = {"name": "t", "sources": sources, "stages": stages, **extra}
    path = folder / "p.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True))
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    return info.value.problems


def test_shipped_codes_are_the_models_labels() -> None:
    import fasttext

    from datapipe.assets.models import lid_model_path

    path = lid_model_path()
    if not path.is_file():
        pytest.skip(f"the language-ID model is not at {path} (datapipe models fetch)")
    labels = {lab.removeprefix("__label__") for lab in fasttext.load_model(str(path)).get_labels()}
    assert labels == LID176_CODES and len(labels) == 176
    assert set(LID176_NAMES) == labels


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ("chinese", "zh"),
        ("english", "en"),
        ("japanese", "ja"),
        ("cantonese", "yue"),
        ("EN", "en"),
        ("zh-CN", "zh"),
        ("zh_Hant", "zh"),
        ("eng", "en"),
        ("Mandarin", "zh"),
        ("germn", "de"),
    ],
)
def test_suggestions(value: str, code: str) -> None:
    assert suggest_language(value) == code


def test_language_names_instead_of_codes_fail_with_a_suggestion(tmp_path: Path) -> None:
    path = write_pipeline(
        tmp_path,
        [
            {
                "langid": {
                    "keep": ["chinese", "english"],
                    "fraction_langs": ["zh", "en"],
                    "by_kind": {"web": {"keep": ["japanese"]}},
                }
            }
        ],
    )
    found = problems(path)
    assert (
        "stages[0].langid.keep[0]: 'chinese' is not a language code of the lid.176 model; did you mean 'zh' (Chinese)?" in found
    )
    assert any(p.startswith("stages[0].langid.keep[1]: 'english'") and "did you mean 'en'" in p for p in found)
    assert any(p.startswith("stages[0].langid.by_kind.web.keep[0]: 'japanese'") and "'ja'" in p for p in found)
    assert len(found) == 3
    # The codes it suggests validate.
    write_pipeline(tmp_path, [{"langid": {"keep": ["zh", "en"], "by_kind": {"web": {"keep": ["ja"]}}}}])
    assert load_pipeline(path).stage_options[0][1].keep == ["zh", "en"]


def test_kinds_typos_and_rules_that_never_apply(tmp_path: Path) -> None:
    path = write_pipeline(
        tmp_path,
        [
            {"langid": {"keep": ["zh"], "kinds": ["webpage"], "by_kind": {"paper": {}}}},
            {"pii": {"kinds": ["web", "txt"]}},
            {"langid": {"keep": ["zh"], "mixed_min_fraction": 0.5, "line_fractions": False}},
        ],
    )
    found = problems(path)
    assert "stages[0].langid.kinds[0]: 'webpage' is not a source kind; allowed: web, code, paper, text" in found
    assert any(p.startswith("stages[0].langid.by_kind.paper: paper is not in kinds") for p in found)
    assert any(p.startswith("stages[1].pii.kinds[1]: 'txt' is not a source kind") for p in found)
    assert any(p.startswith("stages[2].langid.mixed_min_fraction: needs keep") for p in found)


def test_missing_rule_file_fails_validate_and_run_before_any_work(tmp_path: Path) -> None:
    path = write_pipeline(
        tmp_path,
        [{"langid": {"keep": ["zh", "en"]}}, {"quality": {"rules": {"zh_web": "nope/zh_web.yaml"}}}],
        output=str(tmp_path / "out"),
    )
    expected = f"stages[1].quality.rules.zh_web: file not found: {tmp_path / 'nope' / 'zh_web.yaml'} (a preset name is one of: fineweb_datatrove)"
    assert problems(path) == [expected]
    runner = CliRunner()
    for command in (["validate", str(path)], ["run", str(path), "--no-progress"]):
        result = runner.invoke(main, command)
        assert result.exit_code == 2, result.output
        assert expected in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()  # run stopped before creating its folder


def test_rule_sets_are_loaded_by_the_stages_loader_and_their_values_checked(tmp_path: Path) -> None:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "broken.yaml").write_text("filters:\n  c4: {lorem_ipsum: true\n")
    (tmp_path / "rules" / "unknown.yaml").write_text("filters:\n  gopher_qualty: {min_words: 50}\n")
    (tmp_path / "rules" / "values.yaml").write_text(
        "filters:\n  c4: {lorem_ipsum: yes please, min_sentences: '5'}\n"
        "  blocklist: {max_spam_words: 2, spam_list: /nonexistent/spam.txt}\n"
    )
    path = write_pipeline(
        tmp_path,
        [
            {
                "quality": {
                    "rules": {
                        "web": "rules/broken.yaml",
                        "code": "rules/unknown.yaml",
                        "paper": "rules/values.yaml",
                        "chinese_web": "x.yaml",
                        "zh_web": str(PROJECT_ROOT / "filters/quality/zh_web.yaml"),
                    }
                }
            }
        ],
    )
    found = problems(path)
    broken = [p for p in found if p.startswith("stages[0].quality.rules.web: ")]
    assert len(broken) == 1 and f"{tmp_path / 'rules' / 'broken.yaml'}, line 3" in broken[0]
    assert "<unicode string>" not in broken[0]
    assert any(p.startswith("stages[0].quality.rules.code: ") and "unknown filter 'gopher_qualty'" in p for p in found)
    values = [p for p in found if p.startswith("stages[0].quality.rules.paper: ")]
    assert any("filters.c4.lorem_ipsum: 'yes please' is not allowed: use true or false" in p for p in values)
    assert any("filters.c4.min_sentences: '5' is not allowed: a number is needed" in p for p in values)
    assert any("filters.blocklist.spam_list: file not found: /nonexistent/spam.txt" in p for p in values)
    assert any(p.startswith("stages[0].quality.rules.chinese_web: 'chinese'") and "'zh'" in p for p in found)
    # zh_web is a lang-specific key, and no langid stage runs before quality: it could never apply.
    assert any(p.startswith("stages[0].quality.rules.zh_web: no langid stage") for p in found)


def test_pipeline_yaml_syntax_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"name: t\nsources:\n  - {{name: a, paths: [{shared_path('corpus', 'zh_oiwiki.jsonl')}]\nstages: []\n")
    found = problems(path)
    assert len(found) == 1 and found[0].startswith(f"{path}, line 4, column 1: not valid YAML: ")
    assert "<unicode string>" not in found[0]


def test_score_column_and_metadata_file_are_checked(tmp_path: Path) -> None:
    path = write_pipeline(
        tmp_path, [{"langid": {"keep": ["zh", "en"]}}, {"minhash": {"survivor": "best", "score_column": "lang_scor"}}]
    )
    assert problems(path) == [
        "stages[1].minhash.score_column: 'lang_scor' is not a column of the documents at this stage; did you mean 'lang_score'?"
    ]
    write_pipeline(
        tmp_path, [{"langid": {"keep": ["zh", "en"]}}, {"minhash": {"survivor": "best", "score_column": "lang_score"}}]
    )
    load_pipeline(path)
    cfg = yaml.safe_load(path.read_text())
    cfg["sources"][0]["options"] = {"metadata": "meta/arxiv.jsonl"}
    path.write_text(yaml.safe_dump(cfg))
    assert problems(path) == [f"sources[0].options.metadata: file not found: {tmp_path / 'meta' / 'arxiv.jsonl'}"]


def test_custom_model_path_is_checked(tmp_path: Path) -> None:
    path = write_pipeline(tmp_path, [{"langid": {"keep": ["zh"], "model": "models/lid.bin"}}])
    assert problems(path) == [f"stages[0].langid.model: file not found: {tmp_path / 'models' / 'lid.bin'}"]


def test_text_field_no_record_has_is_caught(tmp_path: Path) -> None:
    he = str(shared_path("benchmarks", "HumanEval.jsonl.gz"))
    path = write_pipeline(tmp_path, [])
    cfg = yaml.safe_load(path.read_text())
    cfg["sources"][0]["text_field"] = "content"
    cfg["sources"].append({"name": "he", "kind": "code", "paths": [he], "options": {"content_field": "code"}})
    cfg["sources"].append({"name": "he_ok", "kind": "code", "paths": [he], "options": {"content_field": "prompt"}})
    path.write_text(yaml.safe_dump(cfg))
    found = problems(path)
    assert len(found) == 2
    assert found[0].startswith("sources[0].text_field: 'content' is not a field of the first records of ")
    assert "(fields: lang, source, text)" in found[0]
    assert found[1].startswith("sources[2].options.content_field: 'code' is not a field of the first records of ")
    assert "canonical_solution, entry_point, prompt, task_id, test" in found[1]


def test_score_column_must_be_numeric(tmp_path: Path) -> None:
    path = write_pipeline(
        tmp_path, [{"langid": {"keep": ["zh", "en"]}}, {"minhash": {"survivor": "best", "score_column": "lang"}}]
    )
    assert problems(path) == [
        "stages[1].minhash.score_column: 'lang' is not numeric; survivor: best needs a numeric "
        "signal (higher is better), e.g. lang_score or n_chars"
    ]
