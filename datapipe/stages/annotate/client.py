"""One chat-completions request to an OpenAI-compatible server, with retries (standard library HTTP).

Retried with exponential backoff and jitter (a ``Retry-After`` header honoured up to the cap):
429, 408, 409 and 5xx replies, timeouts, refused or broken connections (a server restarting) and
replies that are not the JSON of a completion. Not retried: other 4xx replies (a request the server
will never take: the document's error says why) and 401/403/404, which mean the endpoint, key or
model is wrong for every document (``EndpointBroken``: the task stops asking and fails).
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from datapipe.stages.annotate.journal import Answer

RETRY_STATUS = frozenset({408, 409, 429})
BROKEN_STATUS = frozenset({401, 403, 404})
BODY_CHARS = 300  # of an error reply, kept in the document's error detail


@dataclass(frozen=True)
class Failure:
    """A request that got no answer: ``error`` a short code, ``detail`` the last thing that went wrong."""

    error: str  # request_failed (retries spent), request_rejected (a 4xx), not_asked (the task stopped asking)
    detail: str
    broken: bool = False  # the endpoint refuses every request (401/403/404): stop the task


@dataclass(frozen=True)
class ClientSettings:
    url: str  # <endpoint>/chat/completions
    api_key: str | None
    timeout_s: float
    max_retries: int
    backoff_s: float
    max_backoff_s: float


def completions_url(endpoint: str) -> str:
    return endpoint.rstrip("/") + "/chat/completions"


def endpoint_host(endpoint: str) -> str:
    """host[:port] of the endpoint, without any user or password written into the URL."""
    return urlsplit(endpoint).netloc.rsplit("@", 1)[-1]


@dataclass(frozen=True)
class _Retry:
    """One try that may succeed when repeated (``after``: the server's Retry-After, seconds)."""

    detail: str
    after: float | None = None


@dataclass(frozen=True)
class _Refused:
    """A reply that repeating will not change."""

    detail: str
    broken: bool


def ask(settings: ClientSettings, body: dict[str, Any], request: str, doc_id: str, stop: threading.Event) -> Answer | Failure:
    """Send ``body`` until it is answered, refused for good, or the retries are spent (or ``stop`` is set)."""
    data = json.dumps(body, ensure_ascii=False).encode()
    headers = {"Content-Type": "application/json"}
    if settings.api_key:
        headers["Authorization"] = f"Bearer {settings.api_key}"
    last = ""
    for attempt in range(settings.max_retries + 1):
        if stop.is_set():
            return Failure("not_asked", "the task stopped asking: " + (last or "an earlier request failed"))
        outcome = _once(settings, data, headers, request, doc_id)
        if isinstance(outcome, Answer):
            return outcome
        if isinstance(outcome, _Refused):
            return Failure("request_rejected", outcome.detail, broken=outcome.broken)
        last = outcome.detail
        if attempt == settings.max_retries:
            break
        delay = min(settings.max_backoff_s, settings.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)
        if outcome.after is not None:
            delay = max(delay, min(outcome.after, settings.max_backoff_s))
        stop.wait(delay)
    return Failure("request_failed", f"after {settings.max_retries + 1} tries: {last}")


def _once(
    settings: ClientSettings, data: bytes, headers: dict[str, str], request: str, doc_id: str
) -> Answer | _Retry | _Refused:
    req = urllib.request.Request(settings.url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=settings.timeout_s) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        text = _body_text(exc)
        if exc.code in RETRY_STATUS or exc.code >= 500:
            return _Retry(f"HTTP {exc.code}: {text}", _retry_after(exc.headers.get("Retry-After")))
        return _Refused(f"HTTP {exc.code}: {text}", broken=exc.code in BROKEN_STATUS)
    except (TimeoutError, OSError, http.client.HTTPException) as exc:  # URLError is an OSError
        reason = getattr(exc, "reason", None) or exc
        name = "timed out" if isinstance(reason, TimeoutError) or "timed out" in str(reason) else type(reason).__name__
        return _Retry(f"{name}: {reason}")
    try:
        reply = json.loads(raw)
        choice = reply["choices"][0]
        message = choice.get("message") or {}
        usage = reply.get("usage") or {}
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return _Retry(f"the reply is not a chat completion: {raw[:BODY_CHARS]!r}")
    return Answer(
        request=request,
        id=doc_id,
        content=_str_or_none(message.get("content")),
        refusal=_str_or_none(message.get("refusal")),
        finish_reason=_str_or_none(choice.get("finish_reason")),
        prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
        completion_tokens=_int_or_none(usage.get("completion_tokens")),
        model=_str_or_none(reply.get("model")),
        endpoint=endpoint_host(settings.url),
    )


def _body_text(exc: urllib.error.HTTPError) -> str:
    try:
        text = exc.read().decode("utf-8", "replace")
    except Exception:  # the body of an error reply is a courtesy: a broken one says nothing more
        text = ""
    text = " ".join(text.split())
    return text[:BODY_CHARS] or str(exc.reason)


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the backoff decides


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
