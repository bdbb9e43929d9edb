"""What ``datapipe view RUN [RUN_B]`` does: open the runs, start the server, print its URL, open a
browser unless told not to, and serve until Ctrl-C."""

from __future__ import annotations

import threading
import webbrowser
from collections.abc import Callable
from pathlib import Path

from datapipe.view.pages import App
from datapipe.view.runs import RunView
from datapipe.view.server import ViewServer, is_loopback


def open_runs(folders: list[Path]) -> list[RunView]:
    """The runs to show; a folder that is not a run folder is an AuditError naming it."""
    runs = []
    for folder in folders:
        run = RunView(folder)
        run.run_json()  # not a run folder: refused now, with its reason, not on the first page
        runs.append(run)
    return runs


def make_server(
    folders: list[Path],
    host: str = "127.0.0.1",
    port: int = 8765,
    memory_limit: str | None = None,
    sql_timeout: float | None = None,
) -> ViewServer:
    app = App(open_runs(folders), memory_limit=memory_limit, sql_timeout=sql_timeout)
    server = ViewServer(app, host, port)
    app.warm()
    return server


def serve(
    folders: list[Path],
    host: str = "127.0.0.1",
    port: int = 8765,
    browser: bool = True,
    memory_limit: str | None = None,
    sql_timeout: float | None = None,
    echo: Callable[[str], None] = print,
) -> None:
    server = make_server(folders, host, port, memory_limit, sql_timeout)
    echo(f"datapipe view: serving {', '.join(str(r.location) for r in server.app.runs.values())}")
    echo(f"  open {server.url}")
    if not is_loopback(host):
        echo(f"  listening on {host}, not only this machine: every request needs the token above (Ctrl-C to stop)")
    else:
        echo("  (Ctrl-C to stop)")
    if browser:
        threading.Thread(target=webbrowser.open, args=(server.url,), daemon=True).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    echo("datapipe view: stopped")
