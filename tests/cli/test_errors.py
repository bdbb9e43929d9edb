"""One base for datapipe's errors (datapipe/errors.py), caught once by the command line.

- every exception class defined in datapipe derives from DatapipeError, except the readers'
  internal limit signals listed in INTERNAL, each with its reason; none with the usage exit code is
  retryable (an executor retries a task only for an error that may pass on another attempt);
- real user mistakes give one ``error:`` line (a pipeline file's problems follow it as ``  - `` lines),
  the hint on a line of its own, no traceback, and the exit code datapipe/errors.py documents;
- an exception that is not a DatapipeError is a bug: it is not dressed up as a user error.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from datapipe.cli import main
from datapipe.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, DatapipeError, InputNotFound, UsageError

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "datapipe"

# Exceptions that are control flow inside one module, never seen by a user or a caller.
_READER_CAP = "a reader's cap on one input, caught in the reader: the rest of the input becomes one reject"
INTERNAL = {
    "datapipe.readers.base.LimitExceeded": _READER_CAP + " (also a runaway paper: includes, macros)",
    "datapipe.engine.executors.ray.executor.Retryable": "never raised: Ray's retry allow-list, which asks the error",
    "datapipe.engine.aggregate_tree.NoAggregates": "caught in its module: a run of a datapipe before aggregates scans instead",
}


def _module_names() -> list[str]:
    """Every module of datapipe/, from the files (engine/ is a namespace package: pkgutil skips it)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__main__":  # importing it runs the program
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _module_names():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # an optional library (torch for the loader's adapters)
            if (exc.name or "").split(".")[0] == "datapipe":
                raise
            continue
        todo = list(vars(module).values())
        while todo:
            obj = todo.pop()
            if inspect.isclass(obj) and obj.__module__ == name:
                todo += [v for v in vars(obj).values() if inspect.isclass(v)]  # nested classes
                if issubclass(obj, BaseException):
                    found[f"{name}.{obj.__qualname__}"] = obj
    return found


def test_every_datapipe_exception_derives_from_datapipe_error() -> None:
    classes = _exception_classes()
    assert "datapipe.pipeline.load.ConfigError" in classes and "datapipe.errors.PipelineError" in classes
    assert any(n.startswith("datapipe.engine.") for n in classes)  # the namespace package was walked
    stray = sorted(n for n, c in classes.items() if not issubclass(c, DatapipeError) and n not in INTERNAL)
    assert not stray, f"exceptions that do not derive from datapipe.errors.DatapipeError: {stray}"
    codes = {n: c.exit_code for n, c in classes.items() if issubclass(c, DatapipeError)}
    assert set(codes.values()) <= {EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED}, codes
    assert codes["datapipe.pipeline.load.ConfigError"] == EXIT_USAGE
    assert codes["datapipe.errors.PipelineError"] == EXIT_FAILURE
    # Retried only where another attempt may pass: never what the user must change first (exit 2).
    retried = sorted(n for n, c in classes.items() if issubclass(c, DatapipeError) and c.exit_code == EXIT_USAGE and c.retryable)
    assert not retried, f"usage errors that say another attempt may pass: {retried}"
    assert DatapipeError.retryable and classes["datapipe.errors.PipelineError"].retryable  # type: ignore[attr-defined]


def test_message_hint_and_builtin_bases_survive() -> None:
    err = InputNotFound("no files match x*.jsonl", hint="check the glob")
    assert str(err) == "no files match x*.jsonl" and err.hint == "check the glob"
    assert isinstance(err, FileNotFoundError) and isinstance(err, ValueError) and err.exit_code == EXIT_USAGE
    back = pickle.loads(pickle.dumps(err))  # as Ray hands a task's error to the driver
    assert type(back) is InputNotFound and str(back) == str(err) and back.hint == "check the glob"
    assert DatapipeError("x").hint is None and DatapipeError("x").exit_code == EXIT_FAILURE


def _cli(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, "-m", "datapipe.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def _invoke(*args: str) -> SimpleNamespace:
    """The command in this process (click's CliRunner; faster than a program): as ``_cli`` gives it."""
    res = CliRunner().invoke(main, list(args))
    assert isinstance(res.exception, SystemExit), res.exception  # not an exception out of the command
    return SimpleNamespace(returncode=res.exit_code, stdout=res.stdout, stderr=res.stderr)


def _one_error(res: subprocess.CompletedProcess | SimpleNamespace, code: int, *needles: str, problems: bool = False) -> str:
    """The error line, after checking: the exit code, no traceback, nothing on stdout, one `error:` line
    (with ``problems``, a pipeline file's `  - ` lines after it; else at most a `hint:` line)."""
    assert res.returncode == code, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr and res.stdout == "", res.stderr
    lines = [line for line in res.stderr.splitlines() if not line.startswith("datapipe: ")]  # a run's log lines
    assert lines and lines[0].startswith("error: "), res.stderr
    rest = lines[1:]
    assert all(line.startswith("  - ") for line in rest) if problems else len(rest) <= 1, res.stderr
    assert rest if problems else all(line.startswith("hint: ") for line in rest), res.stderr
    for needle in needles:
        assert needle in res.stderr, (needle, res.stderr)
    return lines[0]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A finished run folder (one source, one stage, in this process: a few seconds)."""
    base = tmp_path_factory.mktemp("errors")
    (base / "data").mkdir()
    (base / "data" / "a.jsonl").write_text(
        "".join(
            json.dumps({"text": f"This is a small English document, number {i}, with enough words in it."}) + "\n"
            for i in range(5)
        ),
        encoding="utf-8",
    )
    (base / "p.yaml").write_text(
        "name: tiny\nsources:\n  - {name: a, kind: web, paths: [data/a.jsonl]}\nstages:\n  - length: {min_chars: 10}\n",
        encoding="utf-8",
    )
    res = _cli("run", "p.yaml", "--output", "out", "--in-process", "--no-progress", cwd=base)
    assert res.returncode == 0, res.stderr
    return base / "out"


def test_user_mistakes_give_one_line_and_the_documented_code(tiny_run: Path, tmp_path: Path) -> None:
    base = tiny_run.parent
    _one_error(
        _cli("run", str(tmp_path / "missing.yaml")),
        EXIT_USAGE,
        f"pipeline file not found: {tmp_path / 'missing.yaml'}",
        problems=True,
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text((base / "p.yaml").read_text(encoding="utf-8") + "stagez: []\n", encoding="utf-8")
    _one_error(_cli("validate", str(bad)), EXIT_USAGE, "stagez: unknown key", problems=True)
    (tmp_path / "notrun").mkdir()
    _one_error(_cli("sql", str(tmp_path / "notrun"), "select 1"), EXIT_USAGE, f"no stats.duckdb in {tmp_path / 'notrun'}")
    _one_error(_invoke("sql", str(tiny_run), "select nope from documents"), EXIT_USAGE, "SQL error")
    _one_error(_invoke("explain", str(tiny_run), "a/nope#L1"), EXIT_USAGE, "no document 'a/nope#L1'")
    _one_error(_invoke("stats", str(tmp_path / "gone")), EXIT_USAGE, f"no run.json in {tmp_path / 'gone'}")
    _one_error(_invoke("stats", str(tiny_run), "--budget", "lots"), EXIT_USAGE, "not a token count: 'lots'")
    _one_error(
        _invoke("train-tokenizer", "--files", str(tmp_path / "nothing*.jsonl")),
        EXIT_USAGE,
        f"no files match {tmp_path / 'nothing*.jsonl'}",
    )
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    _one_error(
        _invoke("report", str(tiny_run), "--html", str(tmp_path / "a-file" / "r.html")),
        EXIT_FAILURE,
        f"cannot write {tmp_path / 'a-file' / 'r.html'}",
    )


def test_explain_with_an_almost_right_id_names_the_near_ones(tiny_run: Path) -> None:
    """Ids are <source>/<input file>#L<line>: a record without its L, a missing source or folder,
    a line past the end or a typo gets a hint with the ids that exist."""
    meant = "a/data/a.jsonl#L3"
    for typed in ("a/data/a.jsonl#3", "data/a.jsonl#L3", "a.jsonl#3", "A/data/a.jsonl#L3", "a/data/a.json#L3"):
        error = _one_error(_invoke("explain", str(tiny_run), typed), EXIT_USAGE, f"hint: did you mean {meant!r}?")
        assert error == f"error: no document {typed!r} in {tiny_run / 'stats.duckdb'}"
    _one_error(
        _invoke("explain", str(tiny_run), "a/data/a.jsonl#L9"),
        EXIT_USAGE,
        "hint: a/data/a.jsonl has 5 document(s) in this run; the nearest: 'a/data/a.jsonl#L5'",
    )
    far = _invoke("explain", str(tiny_run), "b/other.jsonl#L1")
    _one_error(far, EXIT_USAGE, "no document 'b/other.jsonl#L1'")
    assert "hint:" not in far.stderr  # nothing near: no made-up suggestion


def test_missing_filters_file_is_one_line_and_a_hint(tiny_run: Path, tmp_path: Path) -> None:
    """A broken installation: licenses/classes.yaml gone from the filters/ folder. The run stops at the
    start, naming the file, instead of failing every document of the license stage."""
    filters = tmp_path / "filters"
    shutil.copytree(ROOT / "filters", filters)
    (filters / "licenses" / "classes.yaml").unlink()
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(
        (tiny_run.parent / "p.yaml").read_text(encoding="utf-8").replace("data/", f"{tiny_run.parent}/data/")
        + "  - license: {}\n",
        encoding="utf-8",
    )
    res = _cli(
        "run",
        str(pipeline),
        "--output",
        str(tmp_path / "out"),
        "--in-process",
        "--no-progress",
        env={"DATAPIPE_FILTERS_DIR": str(filters)},
    )
    line = _one_error(res, EXIT_FAILURE, "hint: restore it")
    assert line == f"error: {filters / 'licenses' / 'classes.yaml'} is missing from datapipe's filters/ folder {filters}"


def test_a_bug_keeps_its_traceback_and_a_hint_gets_its_own_line(tiny_run: Path, monkeypatch) -> None:
    import datapipe.audit.mixture as mixture

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("a bug, not a user error")

    monkeypatch.setattr(mixture, "mixture_report", broken)
    res = CliRunner().invoke(main, ["stats", str(tiny_run)])
    assert isinstance(res.exception, ValueError) and res.exit_code == 1 and "error:" not in res.output

    def refused(*args: object, **kwargs: object) -> None:
        raise UsageError("the budget is too small", hint="give --budget 1B or more")

    monkeypatch.setattr(mixture, "mixture_report", refused)
    res = CliRunner().invoke(main, ["stats", str(tiny_run)])
    assert res.exit_code == EXIT_USAGE and isinstance(res.exception, SystemExit)
    assert res.output == "error: the budget is too small\nhint: give --budget 1B or more\n"
