"""The ``datapipe`` command line: the command group, how it runs as a program, and its one error handler.

The commands live by group beside it: ``run.py`` (run, validate, models fetch), ``audit.py`` (sql,
explain, stats, report), ``train.py`` (train-tokenizer, train-classifier), ``export.py``,
``view.py`` (the web app), ``cluster.py`` (kuberay, slurm, beside what they render) and
``ablate.py`` (ablate, mix-search).
Each imports what it runs when it runs, so ``datapipe --help`` imports none of the engine.
"""

from __future__ import annotations

import os
import sys

import click

from datapipe import __version__
from datapipe.cli.options import fail, mark_as_program
from datapipe.errors import EXIT_INTERRUPTED, DatapipeError


class _Program(click.Group):
    """The command group. Called as a program (the ``datapipe`` script, ``python -m datapipe.cli``),
    it ends the process once the command is done without the interpreter's teardown: with numba,
    pyarrow, Ray and DuckDB loaded, tearing down the modules runs full garbage collections for
    nothing, a sizeable share of a small run. Exit handlers (Ray's shutdown, temporary folders,
    logging) still run. Tests drive commands through ``main.main`` (click's CliRunner), not here."""

    def __call__(self, *args: object, **kwargs: object) -> None:
        mark_as_program()
        try:
            super().__call__(*args, **kwargs)
            code: object = 0
        except SystemExit as exc:  # click ends every command with sys.exit
            code = exc.code
        status = code if isinstance(code, int) else 0 if code is None else 1
        if not isinstance(code, (int, type(None))):
            print(code, file=sys.stderr)  # as sys.exit does with a message
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe (`| head`) or stream: nothing more to say
                pass
        os._exit(status)

    def invoke(self, ctx: click.Context) -> object:
        """Every command, however called: a DatapipeError is its message (and hint) and its exit code,
        not a traceback; any other exception is a bug and keeps its traceback."""
        try:
            return super().invoke(ctx)
        except DatapipeError as exc:
            fail(str(exc), exc.exit_code, exc.hint)
        except KeyboardInterrupt:  # a run says how to resume (RunInterrupted); this is before or outside one
            fail("interrupted", EXIT_INTERRUPTED)


@click.group(cls=_Program, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="datapipe")
def main() -> None:
    """datapipe: pretraining-data pipeline for Chinese/English corpora.

    \b
    Typical use:
      datapipe validate pipelines/demo.yaml     check a pipeline file, do no work
      datapipe run pipelines/demo.yaml          run it (embedded Ray on this machine)
      datapipe sql out/demo "select stage, reason, count(*) from documents group by all"

    \b
    Off a terminal (a log file, CI, nohup, | tee), long steps print a progress line every
    $DATAPIPE_PROGRESS_INTERVAL seconds (default 15; 0: none) on stderr.
    """
    from datapipe.runtime.heartbeat import progress_interval

    progress_interval()  # a bad value is refused before any work, not when the first line is due


def _add_commands() -> None:
    from datapipe.cli import audit, cluster, export, run, train, view
    from datapipe.cli.ablate import ablate, mix_search  # torch is imported only when they run

    for command in (
        run.run,
        run.validate,
        run.models,
        audit.sql,
        audit.explain,
        audit.stats,
        audit.report,
        view.view,
        train.train_tokenizer,
        train.train_classifier,
        export.export_cmd,
        cluster.cluster,
        ablate,
        mix_search,
    ):
        main.add_command(command)


_add_commands()
