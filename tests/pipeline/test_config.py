"""Bad pipeline files fail before any work, naming the key path, the value and what is allowed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from datapipe.cli import main
from datapipe.pipeline.load import ConfigError, load_pipeline
from tests.support.shared_data import PROJECT_ROOT

TOKENIZER = str(PROJECT_ROOT / "tokenizer" / "demo.json")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    return tmp_path


def base() -> dict:
    return {
        "name": "t",
        "sources": [{"name": "web_en", "kind": "web", "paths": ["data/*.jsonl"]}],
        "stages": [{"langid": {"keep": ["en"]}}, {"length": {}}, {"dedup": {"exact": True}}],
        "tokenize": {"tokenizer": TOKENIZER, "seq_len": 128},
    }


def with_(path: str, value) -> dict:
    """base() with one key set; path like 'stages.2.dedup.threshold'."""
    cfg = base()
    node = cfg
    parts = path.split(".")
    for p in parts[:-1]:
        node = node[int(p)] if p.isdigit() else node[p]
    last = parts[-1]
    node[int(last) if last.isdigit() else last] = value
    return cfg


BAD = [
    ("unknown top-level key", with_("colour", "red"), ["colour: unknown key", "allowed keys here: name, output, sources"]),
    (
        "unknown stage option",
        with_("stages.2.dedup.threshold", 0.8),
        ["stages[2].dedup.threshold: unknown key", "allowed keys here: exact"],
    ),
    (
        "out of range",
        with_("stages.0.langid.min_score", 1.5),
        ["stages[0].langid.min_score: 1.5 is not allowed", "less than or equal to 1"],
    ),
    ("wrong type", with_("tokenize.seq_len", "long"), ['tokenize.seq_len: "long" is not allowed', "valid integer"]),
    ("seq_len too small", with_("tokenize.seq_len", 4), ["tokenize.seq_len: 4 is not allowed", "greater than or equal to 8"]),
    (
        "unknown stage type",
        with_("stages.1", {"lenght": {}}),
        [
            "stages[1]: unknown stage type 'lenght'",
            "allowed: ",
            "classify, decontaminate, dedup, langid, length, license, minhash",
        ],
    ),
    (
        "two keys in a stage",
        with_("stages.1", {"length": {}, "langid": {}}),
        ["stages[1]: each stage is a mapping with exactly one key"],
    ),
    (
        "bad source kind",
        with_("sources.0.kind", "video"),
        ['sources[0].kind: "video" is not allowed', "'web', 'code', 'paper' or 'text'"],
    ),
    (
        "glob matches nothing",
        with_("sources.0.paths", ["nothing/*.jsonl"]),
        ["sources[0].paths[0]: 'nothing/*.jsonl' matches no file"],
    ),
    ("mixture names no source", with_("mixture", {"web_xx": 1.0}), ["mixture.web_xx: not a source name", "sources are: web_en"]),
    ("negative mixture weight", with_("mixture", {"web_en": -1.0}), ["mixture.web_en: -1.0 is not allowed"]),
    ("tokenizer missing", with_("tokenize.tokenizer", "nope/tok.json"), ["tokenize.tokenizer: file not found"]),
    ("missing sources", {"name": "t"}, ["sources: required key is missing"]),
    ("unsafe source name", with_("sources.0.name", "../escape"), ['sources[0].name: "../escape" is not allowed']),
    (
        "unsupported format",
        with_("sources.0.format", "pdf"),
        ["sources[0].format: 'pdf' is not supported", "allowed: arxiv, html, jsonl, parquet, repo, warc, wat, wet"],
    ),
    (
        "min above max",
        with_("stages.1.length", {"min_chars": 10, "max_chars": 5}),
        ["stages[1].length: ", "max_chars (5) must be >= min_chars (10)"],
    ),
    ("stage options not a mapping", with_("stages.1.length", [1, 2]), ["stages[1].length: options must be a mapping"]),
    ("dedup without a method", with_("stages.2.dedup.exact", False), ["stages[2].dedup: ", "set exact: true and/or url: true"]),
    (
        "eos token not in vocabulary",
        with_("tokenize.eos_token", "<nope>"),
        ["tokenize.eos_token: token '<nope>' is not in the vocabulary"],
    ),
    (
        "duplicate source names",
        with_("sources", [{"name": "a", "paths": ["data/*.jsonl"]}, {"name": "a", "paths": ["data/*.jsonl"]}]),
        ["sources: the name 'a' is used by more than one source"],
    ),
]


@pytest.mark.parametrize("label,config,expected", BAD, ids=[b[0] for b in BAD])
def test_bad_pipeline_is_refused_with_key_path(folder: Path, label: str, config: dict, expected: list[str]) -> None:
    import yaml

    path = folder / "p.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    message = str(info.value)
    for fragment in expected:
        assert fragment in message, f"{label}: {fragment!r} not in:\n{message}"


def test_unsafe_yaml_and_bad_yaml_are_refused(folder: Path) -> None:
    path = folder / "p.yaml"
    path.write_text("name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_pipeline(path)
    path.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_pipeline(path)
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_pipeline(path)


def test_all_problems_are_reported_at_once(folder: Path) -> None:
    import yaml

    cfg = with_("stages.0.langid.min_score", 2)
    cfg["tokenize"]["seq_len"] = 1
    path = folder / "p.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    assert len(info.value.problems) == 2


def test_validate_command_exit_codes(folder: Path) -> None:
    import yaml

    good = folder / "good.yaml"
    good.write_text(yaml.safe_dump(base()))
    result = CliRunner().invoke(main, ["validate", str(good)])
    assert result.exit_code == 0, result.output
    assert "source web_en (web): 1 input file(s), format jsonl" in result.output
    bad = folder / "bad.yaml"
    bad.write_text(yaml.safe_dump(with_("stages.0.langid.min_score", 1.5)))
    result = CliRunner().invoke(main, ["validate", str(bad)])
    assert result.exit_code == 2
    assert "stages[0].langid.min_score" in result.output


def test_defaults_are_filled_and_paths_resolved(folder: Path) -> None:
    import yaml

    path = folder / "p.yaml"
    path.write_text(yaml.safe_dump(base()))
    pipe = load_pipeline(path)
    assert pipe.default_output() == folder / "out" / "t"
    assert [f.name for f, _ in pipe.inputs["web_en"]] == ["a.jsonl"]
    normalized = pipe.normalized()
    assert normalized["stages"][1] == {"length": {"min_chars": 1, "max_chars": 1_000_000}}
    assert len(normalized["tokenize"]["tokenizer_sha256"]) == 64
