"""The answers journal: every reply of the model, appended as it arrives, read first by a resumed task.

One JSON line per answered request, keyed by the sha256 of the request body (the document's text,
the prompt, the model and the sampling parameters are all in it) and naming the document that asked.
Each line is one ``write`` to a file opened for appending, so a killed process leaves at most its
last line torn (skipped when read back); the kernel keeps what was written through a SIGKILL, and
the file is fsynced at the end of each batch and of the task, against a crash of the machine.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JOURNAL_NAME = "answers.jsonl"


@dataclass(frozen=True)
class Answer:
    """A model's reply to one request, as recorded (the raw content: judged again when read)."""

    request: str  # sha256 of the request body
    id: str  # the document that asked
    content: str | None
    refusal: str | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    model: str | None  # as the server named it in the reply
    endpoint: str | None = None  # host[:port] of the server that answered

    def as_json(self) -> str:
        return json.dumps(self.__dict__, ensure_ascii=False, sort_keys=True)


def read_journal(path: Path) -> dict[str, Answer]:
    """Request hash -> answer, from every whole line of the journal (a torn last line is skipped)."""
    out: dict[str, Answer] = {}
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return out
    for line in data.split(b"\n"):
        try:
            row = json.loads(line)
            answer = Answer(**{k: row.get(k) for k in Answer.__dataclass_fields__})
        except (ValueError, TypeError):
            continue  # a line cut by a kill, or an empty one
        if isinstance(answer.request, str):
            out[answer.request] = answer
    return out


class Journal:
    """The journal of one map task, open for appending (``folder`` None: kept in memory only)."""

    def __init__(self, folder: Path | None) -> None:
        self.path: Path | None = None
        self.answers: dict[str, Answer] = {}
        self._fd: int | None = None
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / JOURNAL_NAME
        self.answers = read_journal(self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if self.path.stat().st_size and not _ends_with_newline(self.path):
            os.write(self._fd, b"\n")  # a torn line ends here: the next one starts whole

    def record(self, answer: Answer) -> None:
        """Append one answer: one write, visible to a resumed task even if this process is killed next."""
        self.answers[answer.request] = answer
        if self._fd is None:
            return
        data = memoryview((answer.as_json() + "\n").encode())
        while data:  # a regular file takes it in one write; a short write goes on where it stopped
            data = data[os.write(self._fd, data) :]

    def sync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


def journal_answers(path: Path) -> dict[str, Any]:
    """The journal at ``path`` as plain data (request hash -> its fields): for tests and inspection."""
    return {k: v.__dict__ for k, v in read_journal(path).items()}
