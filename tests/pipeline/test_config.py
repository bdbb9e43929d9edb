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
    (tmp_path / "data" / "p.html").write_text("<html><body><p>hello</p></body></html>\n")
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
    (
        "langid sample windows too narrow",
        with_("stages.0.langid.sample", {"chars": 100, "windows": 8}),
        ["stages[0].langid.sample: ", "12 characters per window; at least 25"],
    ),
    (
        "langid sample bound too small",
        with_("stages.0.langid.sample", {"chars": 20}),
        ["stages[0].langid.sample.chars: 20 is not allowed"],
    ),
    ("wrong type", with_("tokenize.seq_len", "long"), ['tokenize.seq_len: "long" is not allowed', "valid integer"]),
    ("seq_len too small", with_("tokenize.seq_len", 4), ["tokenize.seq_len: 4 is not allowed", "greater than or equal to 8"]),
    (
        "partition bytes too small",
        {**base(), "split": {"partition_bytes": 1000}},
        ["split.partition_bytes: 1000 is not allowed", "greater than or equal to 1048576"],
    ),
    (
        "merge memory not a number",
        {**base(), "split": {"merge_memory_bytes": "lots"}},
        ['split.merge_memory_bytes: "lots" is not allowed', "valid integer"],
    ),
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
    (
        "partitions neither a number nor auto",
        with_("stages.2.dedup.partitions", "many"),
        ['stages[2].dedup.partitions: "many" is not allowed', "auto"],
    ),
    ("zero partitions", with_("stages.2.dedup.partitions", 0), ["stages[2].dedup.partitions: 0 is not allowed"]),
    ("stage options not a mapping", with_("stages.1.length", [1, 2]), ["stages[1].length: options must be a mapping"]),
    ("dedup without a method", with_("stages.2.dedup.exact", False), ["stages[2].dedup: ", "set exact: true and/or url: true"]),
    (
        "eos token not in vocabulary",
        with_("tokenize.eos_token", "<nope>"),
        ["tokenize.eos_token: token '<nope>' is not in the vocabulary"],
    ),
    (
        "a license field where records have no fields",
        with_("sources", [{"name": "pages", "kind": "web", "paths": ["data/p.html"], "license_field": "license"}]),
        ["sources[0].license_field: read from records with named fields (jsonl, parquet) only; this source has html inputs"],
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


def test_langid_threshold_above_the_windows_re_read_is_warned(folder: Path) -> None:
    """min_score 0.9 with sample.full_below 0.8 runs, but long documents scoring 0.8-0.9 on their windows
    would be decided on them alone: the warning names the key and the fix; at full_below 0.9, nothing."""
    import yaml

    path = folder / "p.yaml"
    path.write_text(yaml.safe_dump(with_("stages.0.langid", {"keep": ["en"], "min_score": 0.9})))
    (warning,) = load_pipeline(path).warnings
    assert warning.startswith("stages[0].langid.sample.full_below: 0.8 is below min_score (0.9)"), warning
    assert "set full_below to at least 0.9" in warning
    ok = {"keep": ["en"], "min_score": 0.9, "sample": {"full_below": 0.9}}
    path.write_text(yaml.safe_dump(with_("stages.0.langid", ok)))
    assert load_pipeline(path).warnings == []


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


MANY_MISTAKES = """\
name: t
sources:
  - name: web_en
    kind: website            # web
    paths: [data/*.jsonl]
    text_field: body         # the records have text only
  - name: more
    paths: [data/*.jsonl]
    text_feild: content      # text_field
  - name: web_zh             # no paths
stages:
  - langid: {keep: [cn, eng, zh-TW], min_scor: 0.5}
  - lenght: {min_chars: 20}
  - length: {min_chars: 20, max_char: 10}
  - dedup: {exact: true, treshold: 2}
  - minhash: {threshhold: 0.7}
tokenize:
  tokenizer: TOKENIZER
  seqlen: 512
  packing: best-fit
mixture: {web_en: 0.5, web_xx: 0.5}
batchsize: 10
"""


def test_every_mistake_is_reported_in_one_pass_with_suggestions(folder: Path) -> None:
    """An unknown key no longer hides the checks that need the object: language codes, the text
    field, the mixture; each unknown key or value gets its nearest allowed one."""
    path = folder / "p.yaml"
    path.write_text(MANY_MISTAKES.replace("TOKENIZER", TOKENIZER), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    expected = [
        ("sources[0].kind:", '"website" is not allowed', "(did you mean 'web'?)"),
        ("sources[0].text_field:", "'body' is not a field", "(fields: text)"),
        ("sources[1].text_feild:", "unknown key (did you mean 'text_field'?)"),
        ("sources[2].paths:", "required key is missing"),
        ("stages[0].langid.keep[0]:", "'cn' is not a language code", "did you mean 'zh' (Chinese)?"),
        ("stages[0].langid.keep[1]:", "'eng' is not a language code", "did you mean 'en' (English)?"),
        ("stages[0].langid.keep[2]:", "'zh-TW' is not a language code", "did you mean 'zh' (Chinese)?", "hant or hans"),
        ("stages[0].langid.min_scor:", "unknown key (did you mean 'min_score'?)"),
        ("stages[1]:", "unknown stage type 'lenght' (did you mean 'length'?)", "allowed: annotate, boilerplate, classify"),
        ("stages[2].length.max_char:", "unknown key (did you mean 'max_chars'?)"),
        ("stages[3].dedup.treshold:", "unknown key; allowed keys here: exact, url, partitions"),
        ("stages[4].minhash.threshhold:", "unknown key (did you mean 'threshold'?)"),
        ("tokenize.seqlen:", "unknown key (did you mean 'seq_len'?)"),
        ("tokenize.packing:", '"best-fit" is not allowed', "(did you mean 'bestfit'?)"),
        ("mixture.web_xx:", "not a source name", "sources are: web_en, more, web_zh"),
        ("batchsize:", "unknown key (did you mean 'batch_size'?)"),
    ]
    problems = info.value.problems
    assert len(problems) == len(expected), "\n".join(problems)  # nothing left out, nothing made up
    for problem, (key, *fragments) in zip(problems, expected):  # in the order of the keys in the file
        assert problem.startswith(key + " "), (key, problem)
        for fragment in fragments:
            assert fragment in problem, (fragment, problem)
    # The command prints them all, one line each, under one error line.
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert lines[0] == f"error: invalid pipeline file {path}:"
    assert lines[1:] == [f"  - {p}" for p in problems]


def test_a_wrong_required_key_still_lets_the_rest_be_checked(folder: Path) -> None:
    """No name, a source that is not a mapping: the other sources, stages and mixture are still checked."""
    path = folder / "p.yaml"
    path.write_text(
        "sources:\n  - 5\n  - {name: a, paths: [nothing/*.jsonl]}\nstages:\n  - langid: {keep: [jp]}\nmixture: {a: 1, b: 1}\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    found = "\n".join(info.value.problems)
    for fragment in (
        "sources[0]: 5 is not allowed",
        "sources[1].paths[0]: 'nothing/*.jsonl' matches no file",  # the index as written, after the left-out one
        "stages[0].langid.keep[0]: 'jp' is not a language code of the lid.176 model; did you mean 'ja' (Japanese)?",
        "mixture.b: not a source name",
        "name: required key is missing",
    ):
        assert fragment in found, (fragment, found)
    assert len(info.value.problems) == 5, found
