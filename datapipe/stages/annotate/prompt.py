"""Prompt templates and the request a document becomes.

A template names document columns as ``{{text}}``, ``{{ id }}``, ``{{lang}}``; anything else in
it, single braces of a JSON example included, is sent as written. A document's request body is
the model, the messages and the sampling parameters; its sha256 is the key of the answer in the
journal, so a document is asked again only if what would be sent differs.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def placeholders(template: str) -> list[str]:
    """The column names a template uses, in order of first use."""
    return list(dict.fromkeys(PLACEHOLDER.findall(template)))


def render(template: str, values: Mapping[str, Any]) -> str:
    """The template with each placeholder replaced by the value (null: empty)."""

    def fill(m: re.Match[str]) -> str:
        value = values[m.group(1)]
        return "" if value is None else str(value)

    return PLACEHOLDER.sub(fill, template)


def canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def sha256_of(data: Any) -> str:
    return hashlib.sha256(canonical(data)).hexdigest()


def response_format(kind: str, schema: dict[str, Any]) -> dict[str, Any] | None:
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": "annotation", "schema": schema, "strict": True}}
    if kind == "json_object":
        return {"type": "json_object"}
    return None


def request_body(
    model: str, system: str | None, prompt: str, params: Mapping[str, Any], fmt: dict[str, Any] | None
) -> dict[str, Any]:
    """The chat-completions request for one document (``params``: sampling parameters and extras)."""
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": prompt}]
    body: dict[str, Any] = {"model": model, "messages": messages, **params}
    if fmt is not None:
        body["response_format"] = fmt
    return body
