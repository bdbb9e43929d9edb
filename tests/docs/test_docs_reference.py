"""The documentation's pipeline-file reference is generated from the models and complete.

``docs/hooks/reference.py`` renders ``docs/reference.md`` at build time from the pydantic models
the pipeline loader validates against. These tests render it without MkDocs and check that every
stage and every section is on it, and that no field of any of those models lacks a description
(a field without one would show as an empty cell).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _hook():
    name = "datapipe_docs_reference_hook"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "hooks" / "reference.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_reference_lists_every_stage_section_and_reader() -> None:
    from datapipe.readers import READER_SPECS
    from datapipe.stages import STAGES

    page = _hook().render()
    expected = {"langid", "length", "quality", "pii", "dedup", "minhash", "boilerplate", "license", "decontaminate", "classify"}
    assert expected <= set(STAGES)
    for name in STAGES:
        assert f"### `{name}` {{#stage-{name}}}" in page, name
        for key in STAGES[name].Options.model_fields:
            assert f"| `{key}` |" in page, (name, key)
    for section in ("Top level", "`sources[]`", "`tokenize`", "`limits`", "`split`"):
        assert f"### {section} " in page, section
    for fmt in (f for f in READER_SPECS if READER_SPECS[f].options is not None):
        assert f"`{fmt}`" in page, fmt
    # nested models get their own table, at their key path
    for path in ("stages[].langid.by_kind.<kind>", "stages[].classify.keep[]", "stages[].decontaminate.benchmarks[]"):
        assert f"`{path}`" in page, path


def test_reference_shows_defaults_from_the_models() -> None:
    page = _hook().render()
    assert "| `seq_len` | integer; ≥ 8, ≤ 1048576 | `2048` |" in page
    assert "| `max_record_bytes` | integer; ≥ 1024, ≤ 4294967296 | `67108864` (64 MiB) |" in page
    assert "| `name` | string; matching" in page and "| required |" in page


def test_every_field_has_a_description() -> None:
    missing = _hook().undocumented()
    assert not missing, (
        "fields without a description (add Field(description=...), one sentence; they are "
        "the generated docs/reference.md): " + ", ".join(missing)
    )


def test_a_field_without_description_is_reported(monkeypatch) -> None:
    from pydantic import BaseModel

    hook = _hook()

    class Bare(BaseModel):
        documented: int = 1
        undocumented_field: int = 2

    Bare.model_fields["documented"].description = "Has one."
    real = hook._models

    def with_bare():
        pipeline, stages, readers, formats = real()
        return pipeline, {**stages, "bare": Bare}, readers, formats

    monkeypatch.setattr(hook, "_models", with_bare)
    assert [m.rsplit(".", 1)[1] for m in hook.undocumented()] == ["undocumented_field"]
