"""The one base of datapipe's errors, and what the ``datapipe`` command does with them.

Every error datapipe raises on purpose derives from ``DatapipeError``: its message says what is
wrong (naming the file, folder, key or option), and ``hint``, when set, says in one line what to
do. The command line catches ``DatapipeError`` once, around every command (cli/__init__.py),
prints ``error: <message>`` and the hint on a line of its own, and exits with the error's
``exit_code``. Anything else that escapes a command is a bug and keeps its traceback.

Exit codes of ``datapipe``:

    0    done
    1    the work failed: a run or export that cannot go on (a failed task, a full disk, a run
         folder in use by another driver, object storage that cannot be used, a model that
         cannot be had, a corrupt shard). The message says why; after the fix, the same
         command resumes where it stopped.
    2    the command cannot be done as asked: a pipeline file with errors, an option value, a
         file or folder the user named that is missing or is not what the command needs (not
         a run folder, a glob matching nothing), SQL that is not one read-only query. Nothing
         was written. (click's own usage errors also exit 2.)
    130  interrupted (Ctrl-C, or SIGTERM for a run): finished work is kept, and running the same
         command again resumes it (128 + SIGINT, as shells report an interrupted command).

Domain errors keep the built-in base they had (``ValueError``, ``RuntimeError``, ...) as a second
base, so callers that catch those keep working. This module imports nothing: ``datapipe.loader``
raises these errors in training jobs that must not import the engine.
"""

from __future__ import annotations

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class DatapipeError(Exception):
    """An error datapipe raises on purpose. ``str()`` is the message; ``hint`` one line of what to do.

    ``retryable``: whether another attempt of the same task (on another worker or node, later) may
    succeed; an executor that retries failed tasks retries only those (as Dolma's error kinds do).
    False for what the same inputs and options give again: every error with the usage exit code
    (a pipeline file, rule set or tokenizer setting that cannot be used, a model that needs a
    package not installed, a device the machine lacks), unless its class says otherwise."""

    exit_code: int = EXIT_FAILURE
    hint: str | None = None
    retryable: bool = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.exit_code == EXIT_USAGE and "retryable" not in vars(cls):
            cls.retryable = False  # what the user must change first: the same on every attempt

    def __init__(self, *args: object, hint: str | None = None) -> None:
        super().__init__(*args)
        if hint is not None:
            self.hint = hint


class UsageError(DatapipeError, ValueError):
    """A value the user gave cannot be used: an option, or a file or folder the user named."""

    exit_code = EXIT_USAGE
    retryable = False


class InputNotFound(UsageError, FileNotFoundError):
    """A file, glob or folder the user named is not there (or a glob matches no file)."""


class PipelineError(DatapipeError, RuntimeError):
    """The run cannot go on; the message says why and what to do."""
