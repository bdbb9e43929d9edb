"""A small OpenAI-compatible chat-completions server for the annotate tests, run as a real process.

It answers from the request alone: the document is the user message's text between ``<doc>`` and
``</doc>`` (the whole message without them), and the answer is computed from it (``expected_answer``),
so a test can tell which document an answer went to. Every request it finishes is appended to a
log file as one JSON line (document hash, attempt, status, tokens): the tests count requests and
tokens from it. Attempts per document are counted from the log, so they carry over a restart.

With ``--faults`` the document's hash picks what it gets (``FAULTS``): a 429, two 500s, a timeout
(no reply before the client gives up), a 200 whose body is not JSON, an answer that is not JSON,
one that breaks the schema, a refusal, or a plain answer. ``--restart-after N`` makes the process
exit at its Nth request without replying (the test's ``FakeOpenAI`` starts it again on the same
port). ``--api-key K`` answers 401 to a request without ``Authorization: Bearer K``.

    python tests/support/openai_server.py --port-file F --log L [--faults] [--delay S] ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

DOC = re.compile(r"<doc>\n(.*)\n</doc>", re.S)
RESTART_EXIT = 3
# hash bucket (int(hash, 16) % 10) -> the fault, and on which attempts it happens (None: every attempt)
FAULTS: dict[int, tuple[str, frozenset[int] | None]] = {
    0: ("429", frozenset({1})),
    1: ("500", frozenset({1, 2})),
    2: ("timeout", frozenset({1})),
    3: ("malformed", frozenset({1})),
    4: ("not_json", None),
    5: ("schema_violation", None),
    6: ("refusal", None),
}


def doc_text(prompt: str) -> str:
    m = DOC.search(prompt)
    return m.group(1) if m else prompt


def doc_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fault_of(h: str, attempt: int) -> str | None:
    kind, attempts = FAULTS.get(int(h, 16) % 10, (None, None))
    if kind is None or (attempts is not None and attempt not in attempts):
        return None
    return kind


# The prompt and output schema of the runs against this server: its answers (expected_answer) fit them.
DESCRIBE_PROMPT = "Describe the document below as JSON.\n<doc>\n{{text}}\n</doc>"
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "n_chars": {"type": "integer"},
        "has_digit": {"type": "boolean"},
        "first_word": {"type": "string"},
        "digit_share": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["n_chars", "has_digit", "first_word", "digit_share", "tags"],
}


def expected_answer(text: str) -> dict[str, Any]:
    """The answer the server gives for a document's text (what the tests check the columns against)."""
    digits = sum(c.isdigit() for c in text)
    words = text.split()
    return {
        "n_chars": len(text),
        "has_digit": digits > 0,
        "first_word": words[0] if words else "",
        "digit_share": round(digits / len(text), 6) if text else 0.0,
        "tags": ["long" if len(text) > 500 else "short", "digits" if digits else "no_digits"],
    }


# The recipe pipeline (pipelines/annotate_train_classify.yaml) asks for an educational-value grade.
# Asked with a schema that has edu_score, the server grades by a rule a text classifier can learn
# from the words alone: one point per topic word of EDU_WORDS the text has, at most 5.
EDU_WORDS = (
    "history", "university", "science", "century", "government", "theory", "research", "population",
    "education", "culture", "历史", "大学", "科学", "世纪", "政府", "理论", "研究", "人口", "教育", "文化",
)  # fmt: skip


def edu_answer(text: str) -> dict[str, Any]:
    """The grade the server gives a document's text when asked for edu_score."""
    lower = text.lower()
    hits = [w for w in EDU_WORDS if w in lower]
    return {"edu_score": min(5, len(hits)), "reason": ", ".join(hits[:5]) or "no topic words"}


def answer_for(body: dict[str, Any], text: str) -> dict[str, Any]:
    """``edu_answer`` when the request's schema asks for edu_score, else ``expected_answer``."""
    fmt = body.get("response_format") or {}
    properties = ((fmt.get("json_schema") or {}).get("schema") or {}).get("properties") or {}
    return edu_answer(text) if "edu_score" in properties else expected_answer(text)


def tokens_of(prompt: str, content: str) -> tuple[int, int]:
    return len(prompt.encode()) // 4 + 1, len(content.encode()) // 4 + 1


class State:
    def __init__(self, log: Path, faults: bool, delay: float, timeout_sleep: float, restart_after: int, api_key: str | None):
        self.log = log
        self.faults = faults
        self.delay = delay
        self.timeout_sleep = timeout_sleep
        self.restart_after = restart_after
        self.api_key = api_key
        self.lock = threading.Lock()
        self.received = 0
        self.attempts: Counter[str] = Counter()
        if log.exists():
            for line in log.read_text().splitlines():
                row = json.loads(line)
                if row.get("doc"):
                    self.attempts[row["doc"]] += 1

    def write_log(self, row: dict[str, Any]) -> None:
        with open(self.log, "a") as fh:
            fh.write(json.dumps(row) + "\n")
            fh.flush()


class Handler(BaseHTTPRequestHandler):
    server: Any

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        state: State = self.server.state
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        prompt = body["messages"][-1]["content"]
        text = doc_text(prompt)
        h = doc_hash(text)
        with state.lock:
            state.received += 1
            state.attempts[h] += 1
            attempt = state.attempts[h]
            if state.restart_after and state.received == state.restart_after:
                state.write_log({"doc": h, "attempt": attempt, "status": "restart", "prompt_tokens": 0, "completion_tokens": 0})
                os._exit(RESTART_EXIT)  # mid-run, other requests in flight: no reply to any of them
        if state.delay:
            time.sleep(state.delay)
        if state.api_key and self.headers.get("Authorization") != f"Bearer {state.api_key}":
            self._send(401, b'{"error": {"message": "invalid api key"}}', h, attempt, "401")
            return
        fault = fault_of(h, attempt) if state.faults else None
        if fault == "429":
            self._send(429, b'{"error": {"message": "rate limited"}}', h, attempt, "429", {"Retry-After": "0"})
            return
        if fault == "500":
            self._send(500, b"internal error", h, attempt, "500")
            return
        if fault == "timeout":  # logged first: the run may be over before the sleep is
            with state.lock:
                state.write_log({"doc": h, "attempt": attempt, "status": "timeout", "prompt_tokens": 0, "completion_tokens": 0})
            time.sleep(state.timeout_sleep)  # the client has given up by now
            self.close_connection = True
            return
        if fault == "malformed":
            self._send(200, b'{"id": "x", "choices": [{"message": ', h, attempt, "malformed")
            return
        answer = answer_for(body, text)
        message: dict[str, Any] = {"role": "assistant", "content": json.dumps(answer)}
        if fault == "not_json":
            message["content"] = f"Sure! This document has {len(text)} characters."
        elif fault == "schema_violation":
            first = next(iter(answer))  # an integer field (n_chars, edu_score) as a string
            message["content"] = json.dumps({**answer, first: str(answer[first])})
        elif fault == "refusal":
            message = {"role": "assistant", "content": None, "refusal": "I cannot help with that."}
        pt, ct = tokens_of(prompt, message["content"] or message.get("refusal") or "")
        reply = {
            "id": f"chatcmpl-{h}",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
        }
        self._send(200, json.dumps(reply).encode(), h, attempt, "ok", tokens=(pt, ct))

    def _send(
        self,
        code: int,
        data: bytes,
        h: str,
        attempt: int,
        status: str,
        headers: dict[str, str] | None = None,
        tokens: tuple[int, int] = (0, 0),
    ) -> None:
        state: State = self.server.state
        with state.lock:  # sent and logged together: a restart never falls between the two
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
            state.write_log(
                {"doc": h, "attempt": attempt, "status": status, "prompt_tokens": tokens[0], "completion_tokens": tokens[1]}
            )


class Server(ThreadingHTTPServer):
    request_queue_size = 256  # the default backlog of 5 resets connections of a client with more in flight


def serve(args: argparse.Namespace) -> None:
    server = Server(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.state = State(Path(args.log), args.faults, args.delay, args.timeout_sleep, args.restart_after, args.api_key)  # type: ignore[attr-defined]
    tmp = Path(args.port_file + ".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.replace(args.port_file)
    server.serve_forever()


# --- the tests' side -----------------------------------------------------------------------------


class FakeOpenAI:
    """The server as a subprocess on 127.0.0.1, started again after a planned restart (``--restart-after``)."""

    def __init__(self, folder: Path, *, faults: bool = False, delay: float = 0.0, timeout_sleep: float = 1.0,
                 restart_after: int = 0, api_key: str | None = None) -> None:  # fmt: skip
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.log = folder / "requests.jsonl"
        self.port_file = folder / "port"
        self.options = {"faults": faults, "delay": delay, "timeout_sleep": timeout_sleep, "api_key": api_key}
        self.restart_after = restart_after
        self.port = 0
        self.restarts = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _spawn(self, restart_after: int) -> None:
        self.port_file.unlink(missing_ok=True)
        cmd = [sys.executable, __file__, "--port", str(self.port), "--port-file", str(self.port_file), "--log", str(self.log)]
        cmd += ["--delay", str(self.options["delay"]), "--timeout-sleep", str(self.options["timeout_sleep"])]
        cmd += ["--restart-after", str(restart_after)]
        if self.options["faults"]:
            cmd.append("--faults")
        if self.options["api_key"]:
            cmd += ["--api-key", str(self.options["api_key"])]
        self.proc = subprocess.Popen(cmd)
        deadline = time.monotonic() + 30
        while not self.port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the fake OpenAI server did not start (exit {self.proc.poll()})")
            time.sleep(0.02)
        self.port = int(self.port_file.read_text())

    def start(self) -> FakeOpenAI:
        self._stopping.clear()
        self._spawn(self.restart_after if self.restarts == 0 else 0)
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()
        return self

    def _watch(self) -> None:
        while not self._stopping.is_set():
            proc = self.proc
            assert proc is not None
            if proc.wait() == RESTART_EXIT and not self._stopping.is_set():
                self.restarts += 1
                time.sleep(0.3)  # down for a moment: the client's requests fail and are retried
                self._spawn(0)
            else:
                return

    def stop(self) -> None:
        self._stopping.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if self._watcher is not None:
            self._watcher.join(10)

    def rows(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--faults", action="store_true")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--timeout-sleep", type=float, default=1.0)
    parser.add_argument("--restart-after", type=int, default=0)
    parser.add_argument("--api-key")
    serve(parser.parse_args())
