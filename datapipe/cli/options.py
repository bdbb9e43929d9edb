"""What the command modules share: the one way a command fails, the heartbeat of a long step, the
parameter types of a run folder to read and one to write, and whether the process is the program."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import NoReturn

import click

from datapipe.errors import EXIT_USAGE

# True once the group runs as the program (the process is ours to shape); False when a user's own
# process (a notebook, a test, a job script) drives the commands through ``main.main``.
_AS_PROGRAM = False


def mark_as_program() -> None:
    global _AS_PROGRAM
    _AS_PROGRAM = True


def as_program() -> bool:
    """Whether the group runs as the program (``datapipe``, ``python -m datapipe.cli``): only then may a
    command shape the process as a whole."""
    return _AS_PROGRAM


def fail(message: str, code: int = EXIT_USAGE, hint: str | None = None) -> NoReturn:
    """One ``error:`` line (and the hint on its own line), then exit with ``code`` (datapipe/errors.py)."""
    click.echo(f"error: {message}", err=True)
    if hint:
        click.echo(f"hint: {hint}", err=True)
    sys.exit(code)


def heartbeat(doing: str, when: bool = True) -> contextlib.AbstractContextManager[object]:
    """``doing, 2m05s elapsed`` every $DATAPIPE_PROGRESS_INTERVAL seconds on stderr while a step runs."""
    from datapipe.runtime.heartbeat import Heartbeat, duration

    return Heartbeat(lambda elapsed: f"{doing}, {duration(elapsed)} elapsed") if when else contextlib.nullcontext()


class RunDir(click.ParamType):
    """A run folder to read: a path, or a URI (s3://bucket/run) whose small files are fetched to a local mirror."""

    name = "run_dir"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        from datapipe.storage.uri import StorageError, local_run_dir

        try:
            return local_run_dir(str(value))
        except StorageError as exc:
            self.fail(str(exc), param, ctx)


class Output(click.ParamType):
    """A run folder to write: a path, or a URI kept as written (run_folder/remote.py)."""

    name = "output"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> Path | str:
        from datapipe.storage.uri import is_uri

        return str(value) if is_uri(str(value)) else Path(str(value))


RUN_DIR = RunDir()
