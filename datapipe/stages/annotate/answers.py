"""An answer's JSON Schema as typed columns, and a model's reply checked against it.

Each top-level property of the schema becomes one column: string, integer, number and boolean
(also as ``["integer", "null"]``, or an ``enum`` of one type) map to string, int64, float64 and bool;
anything else (arrays, objects, mixed types) is kept as its JSON text. A reply that is not JSON,
breaks the schema or is a refusal gives null columns and an error code with a detail: never an
exception (``Verdict``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import jsonschema
import pyarrow as pa

_SIMPLE = {"string": pa.string(), "integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}
_FENCE = re.compile(r"^\s*```(?:json|JSON)?\s*\n(.*?)\n?```\s*$", re.S)
DETAIL_CHARS = 300  # of a bad reply, kept in the error detail


def schema_problems(schema: Any) -> list[str]:
    """What makes ``schema`` unusable as an answer schema (an object with properties, valid JSON Schema)."""
    if not isinstance(schema, dict):
        return ["must be a mapping (a JSON Schema object)"]
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        return [f"not a valid JSON Schema{f' at {where}' if where else ''}: {exc.message}"]
    if schema.get("type") != "object" or not isinstance(schema.get("properties"), dict) or not schema["properties"]:
        return ['must be {"type": "object", "properties": {...}} with at least one property: each becomes a column']
    return []


def field_type(prop: Any) -> pa.DataType:
    """The Arrow type of one property's column (JSON text where no single simple type fits)."""
    if not isinstance(prop, dict):
        return pa.string()
    kind = prop.get("type")
    if isinstance(kind, list):
        rest = [k for k in kind if k != "null"]
        kind = rest[0] if len(rest) == 1 else None
    if kind is None and isinstance(prop.get("enum"), list):
        kinds = {type(v) for v in prop["enum"] if v is not None}
        kind = {str: "string", bool: "boolean", int: "integer"}.get(next(iter(kinds))) if len(kinds) == 1 else None
    return _SIMPLE.get(kind, pa.string()) if isinstance(kind, str) else pa.string()


def column_name(prefix: str, prop: str) -> str:
    """``<prefix>_<property>``, the property lower-cased with other characters as ``_``."""
    return f"{prefix}_{re.sub(r'[^a-z0-9_]', '_', prop.lower())}"


@dataclass(frozen=True)
class Verdict:
    """One reply judged: the answer's values by property (empty when invalid), or an error and its detail."""

    values: dict[str, Any]
    error: str | None = None
    detail: str | None = None


class AnswerSchema:
    """The schema compiled once: its columns and a validator."""

    def __init__(self, schema: dict[str, Any], prefix: str) -> None:
        self.schema = schema
        self.fields: dict[str, pa.DataType] = {p: field_type(s) for p, s in schema["properties"].items()}
        self.columns = {p: column_name(prefix, p) for p in self.fields}
        self._validator = jsonschema.validators.validator_for(schema)(schema)

    def judge(self, content: str | None, refusal: str | None, finish_reason: str | None) -> Verdict:
        if refusal:
            return Verdict({}, "refusal", _brief(refusal))
        if finish_reason == "content_filter":
            return Verdict({}, "refusal", "finish_reason content_filter")
        if content is None or not content.strip():
            return Verdict({}, "empty", f"finish_reason {finish_reason}")
        text = content
        fenced = _FENCE.match(text)  # models asked without structured output often fence their JSON
        if fenced:
            text = fenced.group(1)
        try:
            answer = json.loads(text)
        except ValueError as exc:
            code = "truncated" if finish_reason == "length" else "not_json"
            return Verdict({}, code, f"{exc}: {_brief(content)}")
        errors = sorted(self._validator.iter_errors(answer), key=lambda e: list(e.absolute_path))
        if errors:
            first = errors[0]
            where = "/".join(str(p) for p in first.absolute_path)
            return Verdict({}, "schema_violation", f"{where + ': ' if where else ''}{first.message}"[:DETAIL_CHARS])
        return Verdict({p: _typed(answer.get(p), t) for p, t in self.fields.items()})


def _typed(value: Any, dtype: pa.DataType) -> Any:
    if value is None:
        return None
    if dtype == pa.string():
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    if dtype == pa.int64():
        return int(value)  # JSON Schema counts 3.0 as an integer
    if dtype == pa.float64():
        return float(value)
    return bool(value)


def _brief(text: str) -> str:
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS] + "..."
