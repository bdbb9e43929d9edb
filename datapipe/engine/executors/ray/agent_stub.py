"""Stand-ins for the two Python agents a raylet starts, for an embedded one-node Ray (runtime.py).

Run by the raylet, in place of Ray's agent, as::

    python -I -S agent_stub.py dashboard PORT_NAME... -- RAY'S AGENT COMMAND...
    python -I -S agent_stub.py runtime-env PORT_NAME -- RAY'S AGENT COMMAND...

Standard library only (``-I -S``: no site, no datapipe, no Ray to import), so each costs a small
fraction of Ray's agent (whose imports are Ray, gRPC, aiohttp and, for the dashboard agent, an
attempt at every dashboard module).

The raylet waits at start for each agent to write its port files into the session folder, and
fate-shares with both (an agent that exits takes the raylet with it), so each stand-in writes
its port files and then lives exactly as long as the raylet: until the pipe the raylet gives it
as stdin closes (or, without that pipe, until it is re-parented).

* ``dashboard``: the dashboard agent of a Ray without the dashboard's dependencies (``--minimal``)
  serves nothing: it writes -1 to its port files (metrics agent, metrics export, HTTP listen: none)
  and waits. An embedded run has no dashboard and no metrics (``enable_metrics_collection`` is off),
  so this stand-in does the same whatever Ray is installed.
* ``runtime-env``: the raylet asks the runtime-env agent for a task's environment only when the
  task has a ``runtime_env`` (datapipe sets one only for a test hook, ``runtime/faults.py``). The
  stand-in listens on the port it records, and on the first connection starts Ray's real agent
  (its port file written into a private folder) and relays every connection to it, so a
  ``runtime_env`` works as with Ray's own agent, a little later the first time (its start).

Anything it does not recognise in Ray's command (an option renamed, a fixed port), it runs Ray's
agent in its place, as is.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time


def _option(command: list[str], name: str) -> str | None:
    """The value of ``--name=value`` in Ray's agent command."""
    prefix = f"--{name}="
    return next((a[len(prefix) :] for a in command if a.startswith(prefix)), None)


def _write_port(path: str, port: int) -> None:
    """Whole or not at all: the raylet polls for the file and reads it once it exists."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, path)


def _wait_for_raylet() -> None:
    """Return when the raylet (our parent) is gone: its pipe on our stdin closes, or we are re-parented."""
    raylet = os.getppid()
    try:
        piped = stat.S_ISFIFO(os.fstat(0).st_mode)
    except OSError:
        piped = False
    while True:
        if piped:
            if select.select([0], [], [], 5.0)[0] and not os.read(0, 4096):
                return
        else:
            time.sleep(1.0)
        if os.getppid() != raylet:
            return


def _dashboard(names: list[str], command: list[str]) -> None:
    session, node = _option(command, "session-dir"), _option(command, "node-id") or os.environ.get("RAY_NODE_ID")
    if not session or not node or not names:
        os.execv(command[0], command)
    for name in names:
        _write_port(os.path.join(session, f"{name}_{node}"), -1)
    _outlive_ctrl_c()
    _wait_for_raylet()


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Copy a's bytes to b until a ends, then end b's side too."""
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    for s, how in ((b, socket.SHUT_WR), (a, socket.SHUT_RD)):
        try:
            s.shutdown(how)
        except OSError:
            pass


class _LazyAgent:
    """Ray's runtime-env agent, started on first use, with its port file in a private folder."""

    def __init__(self, name: str, node: str, session: str, command: list[str]) -> None:
        self.folder = os.path.join(session, "datapipe_runtime_env_agent")
        self.port_file = os.path.join(self.folder, f"{name}_{node}")
        # Its own port (0: any free one), written where the raylet does not look; the raylet talks to ours.
        self.command = [a for a in command if not a.startswith(("--session-dir=", "--runtime-env-agent-port="))]
        self.command += [f"--session-dir={self.folder}", "--runtime-env-agent-port=0"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.lock = threading.Lock()

    def address(self, host: str) -> tuple[str, int]:
        with self.lock:
            if self.proc is None:
                os.makedirs(self.folder, exist_ok=True)
                # stdin stays the raylet's pipe: the agent watches it as it would under the raylet.
                self.proc = subprocess.Popen(self.command)
            while not self.port:
                if self.proc.poll() is not None:  # it failed: so do we, as Ray's agent would have
                    os._exit(self.proc.returncode or 1)
                # It writes the port file once bound, before it listens: a port is its port once it answers.
                try:
                    with open(self.port_file) as f:
                        port = int(f.read())
                    socket.create_connection((host, port), timeout=5).close()
                    self.port = port
                except (OSError, ValueError):
                    time.sleep(0.05)
            return host, self.port

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()


def _runtime_env(names: list[str], command: list[str]) -> None:
    session, node = _option(command, "session-dir"), _option(command, "node-id") or os.environ.get("RAY_NODE_ID")
    host, port = _option(command, "node-ip-address"), _option(command, "runtime-env-agent-port")
    if len(names) != 1 or not session or not node or not host or port not in ("0", ""):
        os.execv(command[0], command)
    family, kind, proto, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(address)
    listener.listen(64)
    agent = _LazyAgent(names[0], node, session, command)

    def stop(*_: object) -> None:  # the raylet stops its agents with SIGTERM
        agent.stop()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    _outlive_ctrl_c()
    _write_port(os.path.join(session, f"{names[0]}_{node}"), listener.getsockname()[1])

    def accept() -> None:
        while True:
            client, _ = listener.accept()
            threading.Thread(target=_serve, args=(client, agent, address[0]), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    _wait_for_raylet()
    stop()


def _serve(client: socket.socket, agent: _LazyAgent, host: str) -> None:
    try:
        upstream = socket.create_connection(agent.address(host))
    except OSError:
        client.close()
        return
    back = threading.Thread(target=_relay, args=(upstream, client), daemon=True)
    back.start()
    _relay(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _outlive_ctrl_c() -> None:
    """The raylet decides when its agents end (stdin closes, or SIGTERM); a Ctrl-C meant for the driver
    must not end an agent first, which would end the raylet under a driver still shutting down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def main(argv: list[str]) -> None:
    split = argv.index("--")
    mode, names, command = argv[1], argv[2:split], argv[split + 1 :]
    if mode == "dashboard":
        _dashboard(names, command)
    elif mode == "runtime-env":
        _runtime_env(names, command)
    else:
        os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv)
