"""The options of the ``annotate`` stage: what to ask (identity) and how to reach the server (run settings)."""

from __future__ import annotations

import os
import re
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from datapipe.config.sections import SOURCE_KINDS
from datapipe.errors import UsageError
from datapipe.stages.base import StageOptions


class Sample(StageOptions):
    fraction: float = Field(
        1.0, gt=0.0, le=1.0, description="Share of documents asked about, picked by a seeded hash of their ids."
    )
    max_docs: int | None = Field(
        None,
        ge=1,
        description="At most this many documents asked about in the whole corpus: the sampled ones with the smallest "
        "seeded hash (ties by id), the same whatever the sharding or order; a global step finds them before any request.",
    )
    seed: int = Field(0, description="Seed of the hash that picks the sample; another seed picks other documents.")


class Prices(StageOptions):
    prompt: float = Field(ge=0.0, description="Price of one million prompt tokens (any currency; the report shows the number).")
    completion: float = Field(ge=0.0, description="Price of one million completion tokens, in the same currency.")
    currency: str = Field("USD", description="The currency's name, shown beside the cost estimate.")


class AnswerRule(StageOptions):
    field: str = Field(description="An answer field (a property of the schema) the rule reads.")
    min: float | None = Field(None, description="Drop documents whose answer is below this (numbers).")
    max: float | None = Field(None, description="Drop documents whose answer is above this (numbers).")
    values: list[str | int | bool] | None = Field(None, description="Drop documents whose answer is not one of these values.")

    @model_validator(mode="after")
    def _one_test(self) -> AnswerRule:
        if self.min is None and self.max is None and self.values is None:
            raise ValueError("give min, max and/or values")
        return self


# Column suffixes of the stage's own columns, besides one per answer field.
PROVENANCE = (
    "error",
    "error_detail",
    "model",
    "endpoint",
    "prompt_sha256",
    "schema_sha256",
    "params",
    "prompt_tokens",
    "completion_tokens",
)


class AnnotateOptions(StageOptions):
    # Identity: what is asked, of which model, and what becomes of the answers.
    model: str = Field(description="The model name sent to the server (as the server knows it, e.g. the one vLLM serves).")
    prompt: str | None = Field(
        None,
        description="The user message: a template where {{text}}, {{id}}, {{source}}, {{kind}}, {{url}} or any "
        "other column (lang after langid) is replaced by the document's value.",
    )
    prompt_file: str | None = Field(
        None, description="The prompt template in a file (relative to the pipeline file), instead of prompt."
    )
    system: str | None = Field(None, description="A system message sent before the prompt (same {{column}} placeholders).")
    output_schema: dict[str, Any] | None = Field(
        None, description="JSON Schema of an answer: an object whose properties become typed columns <prefix>_<property>."
    )
    output_schema_file: str | None = Field(
        None,
        description="The answer's JSON Schema in a JSON or YAML file (relative to the pipeline file), instead of output_schema.",
    )
    response_format: Literal["json_schema", "json_object", "none"] = Field(
        "json_schema",
        description="What the request asks of the server: json_schema (structured output constrained by the schema), "
        "json_object (any JSON object), or none (the prompt alone asks for JSON).",
    )
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="Sampling temperature.")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="Nucleus sampling; unset: the server's default.")
    max_tokens: int = Field(512, ge=1, description="Most completion tokens per answer.")
    seed: int | None = Field(None, description="Sampling seed sent to the server (where it supports one).")
    extra: dict[str, Any] = Field(
        {}, description="Further request fields sent as they are (e.g. top_k, repetition_penalty for vLLM)."
    )
    max_chars: int = Field(20_000, ge=1, description="Characters of a document's text put into the prompt (its prefix).")
    sample: Sample = Field(
        default_factory=Sample, description="Which documents are asked about; the others get error not_sampled."
    )
    prefix: str = Field(
        "llm", description="Column name prefix: <prefix>_<property> for answers, <prefix>_model etc. for provenance."
    )
    keep: list[AnswerRule] = Field([], description="Keep rules on answer fields; none: annotate only, drop nothing.")
    kinds: list[str] = Field(list(SOURCE_KINDS), description="Source kinds the stage applies to.")
    # Run settings: how the work is done; not part of the run's identity.
    endpoint: str = Field(
        description="Base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1 (requests go to "
        "<endpoint>/chat/completions); a resumed run may use another server."
    )
    endpoint_env: str | None = Field(
        None,
        description="Name of an environment variable that, when set, gives the base URL instead of endpoint "
        "(one pipeline file for a local vLLM server, a cluster's and a test server).",
    )
    api_key_env: str | None = Field(
        None, description="Name of the environment variable holding the API key (sent as a Bearer token; never recorded)."
    )
    max_in_flight: int = Field(8, ge=1, le=1024, description="Requests in flight at once per map task.")
    timeout_s: float = Field(120.0, gt=0.0, description="Seconds to wait for one answer before the request counts as timed out.")
    max_retries: int = Field(
        6, ge=0, description="Retries of a request after a 429, a 5xx, a timeout, a broken connection or an unreadable response."
    )
    backoff_s: float = Field(1.0, gt=0.0, description="Wait before the first retry; doubled for each further one (with jitter).")
    max_backoff_s: float = Field(
        60.0, gt=0.0, description="Longest wait between two tries (a Retry-After header is honoured up to it)."
    )
    max_failures: int = Field(
        10,
        ge=0,
        description="Documents of one map task whose requests may fail after every retry (error request_failed); past "
        "this and max_failed_fraction the task fails, keeping its answers for the next attempt.",
    )
    max_failed_fraction: float = Field(
        0.05, ge=0.0, le=1.0, description="Share of a task's requested documents that may fail so."
    )
    prices: Prices | None = Field(
        None, description="Prices per million tokens, for the cost estimate of `datapipe stats` and the report."
    )

    run_settings: ClassVar[frozenset[str]] = frozenset(
        {
            "endpoint",
            "endpoint_env",
            "api_key_env",
            "max_in_flight",
            "timeout_s",
            "max_retries",
            "backoff_s",
            "max_backoff_s",
            "max_failures",
            "max_failed_fraction",
            "prices",
        }
    )

    @model_validator(mode="after")
    def _sources(self) -> AnnotateOptions:
        if (self.prompt is None) == (self.prompt_file is None):
            raise ValueError("give exactly one of prompt and prompt_file")
        if (self.output_schema is None) == (self.output_schema_file is None):
            raise ValueError("give exactly one of output_schema and output_schema_file")
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.prefix):
            raise ValueError(f"prefix names columns: use a-z, 0-9 and _, starting with a letter (got {self.prefix!r})")
        if not re.match(r"https?://[^/]+", self.endpoint):
            raise ValueError(f"endpoint must be an http:// or https:// URL (got {self.endpoint!r})")
        if self.endpoint_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.endpoint_env):
            raise ValueError("endpoint_env is the name of an environment variable (letters, digits, _), not the URL itself")
        if self.api_key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env):
            raise ValueError("api_key_env is the name of an environment variable (letters, digits, _), not the key itself")
        return self


def endpoint_of(o: AnnotateOptions) -> str:
    """The base URL requests go to: $endpoint_env where set, else ``endpoint``."""
    url = os.environ.get(o.endpoint_env) if o.endpoint_env else None
    if url and not re.match(r"https?://[^/]+", url):
        raise UsageError(f"annotate: ${o.endpoint_env} (endpoint_env) must be an http:// or https:// URL (got {url!r})")
    return url or o.endpoint
