"""MkDocs hook: the pipeline-file reference, rendered from datapipe's pydantic models at build time.

``docs/reference.md`` holds the hand-written introduction and the marker below; when MkDocs
builds that page, this hook replaces the marker with one table per model (YAML key, type,
default, description), so the reference is always the code's own: a new option, a changed
default or a new stage appears on the next build, and nothing generated is committed.

The models come from where the pipeline loader takes them: the top-level ``PipelineConfig``
(its sections ``sources``, ``tokenize``, ``limits``, ``split`` reached by walking its fields),
every built-in stage's ``Options`` in the stage registry (``datapipe.stages.STAGES``) and every built-in
reader's options declared in its format's ``ReaderSpec`` (``datapipe.readers.READER_SPECS``); installed
plugins are left out. Nested models are walked recursively.

``tests/docs/test_docs_reference.py`` renders the page and fails when a field has no description.
``python docs/hooks/reference.py`` prints the whole page (the repository's file holds its introduction).
"""

from __future__ import annotations

import json
import re
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- reference:generated -->"
PAGE = "reference.md"
# Fields whose type says less than their place does: (model class name, key) -> type cell.
TYPE_OVERRIDES = {
    ("PipelineConfig", "stages"): "list of one-key mappings, [stage type](#stages) to its options",
    ("SourceConfig", "options"): "mapping: [the options of the source's reader](#reader-options)",
}


class Section(NamedTuple):
    """One model's table: its heading, anchor and the YAML key path it sits at."""

    title: str  # markdown shown in the heading
    anchor: str
    model: type
    path: str  # YAML key path of the model's keys, e.g. "stages[].langid.by_kind.<kind>"
    part: str  # "file", "stages" or "readers": the part of the page it is listed in
    level: int  # heading level


def _models() -> tuple[type, dict[str, type], dict[str, type], list[str]]:
    """(PipelineConfig, {stage: Options}, {format: reader options}, every reader format)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # this checkout's datapipe, not another installed copy
    from datapipe.pipeline.load import PipelineConfig
    from datapipe.readers import READER_SPECS
    from datapipe.stages import STAGES

    # Built-ins only: the page documents datapipe, not the plugins installed where it is built.
    formats = READER_SPECS.builtin_names()
    return (
        PipelineConfig,
        {name: STAGES[name].Options for name in STAGES.builtin_names()},
        {f: READER_SPECS[f].options for f in formats if READER_SPECS[f].options is not None},
        formats,
    )


def _is_model(tp: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _nested(annotation: Any) -> Iterator[tuple[str, type]]:
    """(key path suffix, model) of every model inside a field's type: M, list[M], dict[K, M], M | None."""
    annotation = _bare(annotation)
    if _is_model(annotation):
        yield "", annotation
        return
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is list:
        for suffix, model in _nested(args[0]):
            yield "[]" + suffix, model
    elif origin is dict:
        key = _key_name(args[0])
        for suffix, model in _nested(args[1]):
            yield f".<{key}>" + suffix, model
    elif origin in (typing.Union, types.UnionType):
        for arg in args:
            yield from _nested(arg)


def _bare(annotation: Any) -> Any:
    """``Annotated[T, ...]`` -> T (a tagged union, the mixture's weight-or-entry)."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _key_name(annotation: Any) -> str:
    return "kind" if typing.get_origin(annotation) is typing.Literal else "key"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def sections() -> list[Section]:
    """Every model of a pipeline file, in page order, each once per place it is used."""
    pipeline, stages, readers, _ = _models()
    out: list[Section] = []

    def walk(model: type, path: str, title: str, anchor: str, part: str, level: int, seen: tuple[type, ...] = ()) -> None:
        out.append(Section(title, anchor, model, path, part, level))
        for key, field in model.model_fields.items():
            for suffix, inner in _nested(field.annotation):
                if inner in seen or inner is model:
                    continue  # a model that contains itself: its table is already there
                sub = f"{path}.{key}{suffix}" if path else f"{key}{suffix}"
                walk(
                    inner,
                    sub,
                    f"`{sub}`",
                    _slug(f"{anchor}-{key}") if path else _slug(key),
                    part,
                    level if not path else level + 1,
                    seen + (model,),
                )

    # The file's own sections (sources[], tokenize, limits, split) sit beside the top level.
    walk(pipeline, "", "Top level", "top-level", "file", 3)
    for name, options in stages.items():
        walk(options, f"stages[].{name}", f"`{name}`", f"stage-{_slug(name)}", "stages", 3)
    grouped: dict[type, list[str]] = {}
    for fmt, model in readers.items():
        grouped.setdefault(model, []).append(fmt)
    for model, formats in grouped.items():
        title = ", ".join(f"`{f}`" for f in formats)
        walk(model, "sources[].options", title, f"reader-{_slug('-'.join(formats))}", "readers", 3)
    return out


def undocumented() -> list[str]:
    """``Model.field`` of every field on the reference page whose description is empty."""
    missing = []
    for section in sections():
        for key, field in section.model.model_fields.items():
            if not (field.description or "").strip():
                missing.append(f"{section.model.__module__}.{section.model.__qualname__}.{key}")
    return sorted(set(missing))


def _type(annotation: Any, links: dict[type, str]) -> str:
    annotation = _bare(annotation)
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    if _is_model(annotation):
        return f"[mapping](#{links[annotation]})" if annotation in links else "mapping"
    simple = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if annotation in simple:
        return simple[annotation]
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        names = [f"`{a}`" for a in args]
        return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    if origin is list:
        return f"list of {_type(args[0], links)}"
    if origin is dict:
        if typing.get_origin(args[0]) is typing.Literal:
            keys = "kind (" + ", ".join(f"`{a}`" for a in typing.get_args(args[0])) + ")"
        else:
            keys = _type(args[0], links)
        return f"mapping of {keys} to {_type(args[1], links)}"
    if origin in (typing.Union, types.UnionType):
        text = " or ".join(_type(a, links) for a in args if a is not type(None))
        return f"{text}, or null" if type(None) in args else text
    return getattr(annotation, "__name__", str(annotation))


def _constraints(field: Any) -> str:
    marks = []
    unit = "characters" if field.annotation is str else "items"
    for meta in field.metadata:
        for attr, sign in (
            ("ge", "≥"),
            ("gt", ">"),
            ("le", "≤"),
            ("lt", "<"),
            ("min_length", "at least"),
            ("max_length", "at most"),
        ):
            value = getattr(meta, attr, None)
            if value is not None:
                marks.append(f"{sign} {value}" + (f" {unit}" if attr.endswith("length") else ""))
        pattern = getattr(meta, "pattern", None)
        if pattern:
            marks.append(f"matching `{pattern}`")
    return ", ".join(marks)


def _size(value: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if value >= 1 << shift and value % (1 << shift) == 0:
            return f" ({value >> shift} {unit})"
    return ""


def _default(key: str, field: Any, links: dict[type, str]) -> str:
    from pydantic_core import PydanticUndefined

    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is PydanticUndefined:
        return "required"
    if _is_model(type(value)):
        target = links.get(type(value))
        return f"[its defaults](#{target})" if target else "its defaults"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    text = f"`{json.dumps(value, ensure_ascii=False)}`"
    if isinstance(value, int) and not isinstance(value, bool) and key.endswith("bytes"):
        text += _size(value)
    return text


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(section: Section, links: dict[type, str]) -> str:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for key, field in section.model.model_fields.items():
        kind = TYPE_OVERRIDES.get((section.model.__name__, key)) or _type(field.annotation, links)
        limits = _constraints(field)
        if limits:
            kind += f"; {limits}"
        text = field.description or ""
        if key in getattr(section.model, "run_settings", ()):  # a stage's StageOptions.run_settings
            text += " A run setting: not part of the run's identity."
        rows.append(f"| `{key}` | {_cell(kind)} | {_cell(_default(key, field, links))} | {_cell(text)} |")
    return "\n".join(rows)


def render() -> str:
    """The generated part of the reference page (markdown)."""
    pipeline, stages, readers, formats = _models()
    all_sections = sections()
    links: dict[type, str] = {}
    for section in all_sections:
        links.setdefault(section.model, section.anchor)
    stage_pages = {name: f"stages/{name}.md" for name in stages if (ROOT / "docs" / "stages" / f"{name}.md").is_file()}
    out: list[str] = []
    part = None
    for section in all_sections:
        kind = section.part
        if kind != part:
            part = kind
            out.append(
                {
                    "file": "## The pipeline file {#pipeline-file}",
                    "stages": "## Stages {#stages}\n\nEach item of `stages:` is a mapping with one key, the "
                    "stage type, whose value holds that stage's options (`{}` for the defaults).",
                    "readers": "## Reader options {#reader-options}\n\n`sources[].options`, checked against "
                    "the reader of the source's format. Formats that take no options: "
                    + ", ".join(f"`{f}`" for f in formats if f not in readers)
                    + ".",
                }[kind]
            )
        out.append(f"{'#' * section.level} {section.title} {{#{section.anchor}}}")
        if section.part == "readers" and section.path == "sources[].options":
            where = f"Keys under `sources[].options` of a source whose format is {section.title.replace(', ', ' or ')}."
        else:
            where = f"Keys under `{section.path}`." if section.path else "Keys at the top of the file."
        name = section.path.split(".")[1] if kind == "stages" else None
        if name in stage_pages and section.path == f"stages[].{name}":
            where += f" How the stage works: [{name}]({stage_pages[name]})."
        doc = section.model.__dict__.get("__doc__")
        if doc and kind != "stages":
            where += " " + " ".join(doc.split())
        out.append(where)
        out.append(_table(section, links))
    return "\n\n".join(out) + "\n"


def page() -> str:
    """The whole page: docs/reference.md's introduction with the generated tables in place."""
    return (ROOT / "docs" / PAGE).read_text(encoding="utf-8").replace(MARKER, render())


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"docs/{PAGE} lost its {MARKER} marker: the generated reference has nowhere to go")
    return markdown.replace(MARKER, render())


if __name__ == "__main__":  # python docs/hooks/reference.py: the page, without building the site
    sys.stdout.write(page())
