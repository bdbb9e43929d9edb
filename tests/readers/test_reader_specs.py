"""Reader specs (datapipe/readers/spec.py): each format declared once, and everything asks the spec."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from datapipe.plugins import PluginError
from datapipe.readers import READER_SPECS, infer_format, reader_spec
from datapipe.readers.spec import ReaderSpec


def _nothing(file, batch_size):  # type: ignore[no-untyped-def]
    return iter(())


@pytest.mark.parametrize(
    "name,kind,fmt",
    [
        ("a.jsonl.gz", "text", "jsonl"),
        ("a.json", "text", "jsonl"),
        ("a.pq", "text", "parquet"),
        ("x.warc.wet.gz", "text", "wet"),
        ("x.warc.gz", "text", "warc"),
        ("x.arc", "text", "warc"),
        ("x.xhtml", "web", "html"),
        ("x.tex.gz", "text", "arxiv"),
        ("x.tar.gz", "code", "repo"),
        ("x.tar.gz", "paper", "arxiv"),
        ("x.tar.gz", "text", None),
        # A bare .gz is an arXiv single-file source in a paper source only, and only when no longer
        # suffix claims it: a gzipped JSONL or WARC stays what its name says.
        ("1603.07285.gz", "paper", "arxiv"),
        ("1603.07285.gz", "text", None),
        ("a.jsonl.gz", "paper", "jsonl"),
        ("crawl.warc.gz", "paper", "warc"),
    ],
)
def test_formats_are_inferred_from_the_specs_suffixes(name: str, kind: str, fmt: str | None) -> None:
    assert infer_format(Path(name), kind) == fmt


def test_folders_take_their_format_from_the_source_kind(tmp_path: Path) -> None:
    assert [infer_format(tmp_path, k) for k in ("code", "web", "paper", "text")] == ["repo", "html", "arxiv", None]
    assert {f for f, s in READER_SPECS.items() if s.folders} == {"repo", "html", "arxiv"}


def test_a_spec_with_bad_fields_is_refused_naming_them() -> None:
    with pytest.raises(ValueError, match=r"reader spec 'x': suffixes must be lower-case .*'TXT'"):
        ReaderSpec("x", _nothing, suffixes=("TXT",))
    with pytest.raises(ValueError, match="prepass_count counts within byte ranges"):
        ReaderSpec("x", _nothing, split_points=lambda p, s, t, c: [0], split_unit="row_groups", prepass_count=lambda p, s, e: 0)


def test_two_formats_claiming_one_suffix_or_folder_kind_are_refused() -> None:
    thief = ReaderSpec("other", _nothing, suffixes=(".jsonl",), folders=True, folder_kinds=frozenset({"code"}))
    with READER_SPECS.override(thief), pytest.raises(PluginError) as err:
        infer_format(Path("a.jsonl"))
    assert "built-in reader 'other' and built-in reader 'jsonl' both claim the suffix '.jsonl'" in str(err.value)
    assert "both claim the folders of kind 'code'" in str(err.value)
    assert infer_format(Path("a.jsonl")) == "jsonl" and "other" not in READER_SPECS  # the override is gone


def test_an_override_replaces_a_spec_for_a_block_only() -> None:
    spec = reader_spec("jsonl")
    with READER_SPECS.override(replace(spec, read=_nothing)):
        assert reader_spec("jsonl").read is _nothing and reader_spec("jsonl").suffixes == spec.suffixes
    assert reader_spec("jsonl") == spec
    with pytest.raises(RuntimeError), READER_SPECS.override(replace(spec, read=_nothing)):
        raise RuntimeError("a failing test body")
    assert reader_spec("jsonl") is spec  # restored when the block raises too
    with pytest.raises(TypeError):
        READER_SPECS["jsonl"] = spec  # type: ignore[index]  # no production view to assign through
