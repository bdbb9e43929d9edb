"""The command tables of README.md and docs/index.md are the click commands' own (issue 50, item 7).

``docs/hooks/command_tables.py`` renders the table from ``datapipe.cli.main``; a page whose table
differs (a command or an option added without ``--write``) fails here, naming the command to run.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[2]


def _hook():
    name = "datapipe_docs_command_tables_hook"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "hooks" / "command_tables.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_each_page_holds_the_table_of_the_commands() -> None:
    hook = _hook()
    table = hook.render()
    for page in hook.PAGES:
        text = page.read_text(encoding="utf-8")
        assert hook.fill(text, table) == text, (
            f"{page.relative_to(ROOT)}'s command table differs from the commands: run `python docs/hooks/command_tables.py --write`"
        )


def test_every_command_and_subcommand_is_a_row() -> None:
    table = _hook().render()
    for row in ("`datapipe ablate ", "`datapipe mix-search ", "`datapipe cluster kuberay ", "`datapipe cluster slurm "):
        assert row in table, row
    assert "[--from OLD_RUN]" in table.split("`datapipe run ", 1)[1].split("\n", 1)[0]


def test_a_new_command_or_option_changes_the_table() -> None:
    from datapipe.cli import main

    hook = _hook()
    before = hook.render()

    @click.command("lint-corpus")
    @click.argument("run_dir")
    @click.option("--strict", is_flag=True)
    def lint(run_dir: str, strict: bool) -> None:
        """Check a corpus. More text that is not shown."""

    main.add_command(lint)
    try:
        after = hook.render()
    finally:
        del main.commands["lint-corpus"]
    assert "| `datapipe lint-corpus RUN_DIR [--strict]` | Check a corpus |" in after and after != before
    assert hook.render() == before
