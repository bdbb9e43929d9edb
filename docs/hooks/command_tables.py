"""The command tables of README.md and docs/index.md, generated from the ``datapipe`` click commands.

Both pages hold the table between two markers. ``python docs/hooks/command_tables.py --write``
puts the current table there (commit the result); ``tests/docs/test_command_tables.py`` fails when a
page's table differs from the commands, so a new command or option cannot be left out. As an MkDocs
hook it also fills docs/index.md's table when the site is built.

A row is a command (a group's subcommands each get one): its arguments, then its options (every
option of a command of at most ``ALL_OPTIONS`` of them, else the required ones and ``[OPTIONS]``:
``--help`` lists the rest), and the first sentence of its help.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
START = "<!-- commands:start (generated from the click commands: python docs/hooks/command_tables.py --write) -->"
END = "<!-- commands:end -->"
PAGES = (ROOT / "README.md", ROOT / "docs" / "index.md")
ALL_OPTIONS = 8  # a command with more options shows its required ones and [OPTIONS]


def _main() -> Any:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # this checkout's datapipe, not another installed copy
    from datapipe.cli import main

    return main


def _option(param: Any) -> str:
    import click

    name = max(param.opts, key=len)  # --output rather than -o
    if param.is_flag:
        flags = "/".join(max(p, key=len) for p in (param.opts, param.secondary_opts) if p)
        return f"[{flags}]"
    if isinstance(param.type, click.Choice):
        value = "|".join(str(c) for c in param.type.choices)
    else:
        value = param.metavar or param.name.upper()
    shown = f"{name} {value}" + ("..." if param.multiple else "")
    return shown if param.required else f"[{shown}]"


def _synopsis(path: str, command: Any) -> str:
    import click

    args = [p for p in command.params if isinstance(p, click.Argument)]
    options = [p for p in command.params if isinstance(p, click.Option) and not p.hidden and p.name != "help"]
    words = [path]
    for arg in args:
        if arg.metavar:
            words.append(arg.metavar)
        elif arg.nargs == -1:
            words.append(f"[{arg.name.upper()}]...")
        else:
            words.append(arg.name.upper() if arg.required else f"[{arg.name.upper()}]")
    if len(options) <= ALL_OPTIONS:
        words += [_option(o) for o in options]
    else:
        words += [_option(o) for o in options if o.required] + ["[OPTIONS]"]
    return " ".join(words)


def _summary(command: Any) -> str:
    """The first sentence of the command's help, on one line."""
    text = " ".join((command.help or "").split("\n\n", 1)[0].split())
    return text.split(". ", 1)[0].rstrip(".")


def _rows(group: Any, prefix: str) -> list[tuple[str, str]]:
    import click

    rows = []
    for name in sorted(group.commands):
        command = group.commands[name]
        if command.hidden:
            continue
        if isinstance(command, click.Group):
            rows += _rows(command, f"{prefix} {name}")
        else:
            rows.append((_synopsis(f"{prefix} {name}", command), _summary(command)))
    return rows


def render() -> str:
    """The table (markdown), the commands in alphabetical order."""
    rows = ["| command | what it does |", "|---|---|"]
    for synopsis, summary in _rows(_main(), "datapipe"):
        rows.append(f"| `{_cell(synopsis)}` | {_cell(summary)} |")
    return "\n".join(rows)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a | of the text, not a cell separator (also inside `code`)


def fill(text: str, table: str) -> str:
    """``text`` with ``table`` between its markers; ValueError where it has none."""
    if START not in text or END not in text:
        raise ValueError(f"no {START!r} ... {END!r} block")
    head, rest = text.split(START, 1)
    return f"{head}{START}\n{table}\n{END}{rest.split(END, 1)[1]}"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return fill(markdown, render()) if page.file.src_uri == "index.md" else markdown


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="put the table into README.md and docs/index.md")
    args = ap.parse_args()
    table = render()
    if not args.write:
        print(table)
        return 0
    for page in PAGES:
        page.write_text(fill(page.read_text(encoding="utf-8"), table), encoding="utf-8")
        print(f"wrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
