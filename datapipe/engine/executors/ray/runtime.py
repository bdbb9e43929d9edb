"""Starting or joining Ray. Embedded by default: on loopback, files in datapipe's cache, quiet.

On one machine Ray would otherwise bind to the machine's network address, attach to a
stale cluster recorded in /tmp, write session files under /tmp and ~/.ray, and print a
token-auth warning on every start. An embedded run avoids all of that; a real cluster
(``--ray-address``) keeps Ray's own defaults.

Embedded Ray's processes must not outlive the run. ``ray.shutdown()`` stops them when the
driver exits normally, but a driver that is killed (SIGKILL, OOM killer) takes the GCS and
raylet with it while the dashboard agent and runtime-env agent notice the dead raylet,
then spend Ray's hard-coded 60 s trying to report it to the dead GCS. A tiny watchdog process,
started with the session, waits on a pipe from the driver; when the pipe closes (normal exit or death) it stops whatever
process of that session is left.

An embedded Ray is one node that lives for one run, so it starts without the head's services
for a cluster that it cannot use (``_one_node_services``): the autoscaler monitor (nothing to
scale), the log monitor (``log_to_driver=False``: nothing to stream) and the dashboard/job API
server. Each is a Python process importing Ray: seconds of CPU and of start-up, and hundreds of
MiB, for nothing a one-run node uses. Ray's dashboard, job submission
and state API (``ray list tasks``) need them: for those, start a cluster (``ray start --head``)
and pass its address (``--ray-address``).

The raylet's two Python agents (dashboard, runtime environments) are stand-ins of the standard
library (agent_stub.py: a fraction of the agents' CPU, and the raylet starts its workers sooner):
an embedded Ray has no dashboard or metrics, and starts Ray's runtime-env agent only when a
task asks for a ``runtime_env``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from datapipe.storage.cache import cache_dir

LOOPBACK = "127.0.0.1"


def _embedded_env(ray_dir: Path) -> None:
    # Without this, Ray swaps 127.0.0.1 for the machine's address.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if "RAY_AUTH_MODE" in os.environ:
        return  # the user chose; respect it
    if "ray" in sys.modules:
        # Ray caches its auth mode when imported: turning token mode on now would leave this
        # process without the token the cluster demands. The cluster listens on loopback only.
        os.environ["RAY_AUTH_MODE"] = "disabled"
        return
    # Token auth stays on (any local process could otherwise submit code), with the token kept
    # in our cache rather than ~/.ray, and the mode set explicitly so Ray does not warn.
    token = ray_dir / "auth_token"
    if not token.is_file():
        ray_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ.setdefault("RAY_AUTH_TOKEN_PATH", str(token))


def _session_dir() -> Path:
    """Ray's session folder: in datapipe's cache, unless that path is too long for Ray's
    Unix sockets (107 bytes, of which Ray's own names take about 60)."""
    preferred = cache_dir() / "ray"
    if len(str(preferred)) <= 45:
        return preferred
    return Path(tempfile.gettempdir()) / f"datapipe-ray-{os.getuid()}"


def _prune_sessions(ray_dir: Path, keep: int = 5) -> None:
    """Ray never deletes old session folders (logs, sockets): keep the newest few.

    A session whose starting process still runs is never removed: the cache is shared by
    every datapipe process of the user, and deleting a live session's logs makes its
    workers fail (a long test session beside many short runs did exactly that).
    """
    sessions = sorted(p for p in ray_dir.glob("session_2*") if p.is_dir() and not p.is_symlink())
    for old in sessions[:-keep] if len(sessions) > keep else []:
        if not _session_alive(old):
            shutil.rmtree(old, ignore_errors=True)


def _session_alive(session: Path) -> bool:
    """Ray names sessions session_<date>_<time>_<micros>_<pid of the process that started it>."""
    pid = session.name.rsplit("_", 1)[-1]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's process
        return True
    return True


# Runs as `python -c WATCHDOG <driver pid> <session dir>`; Linux only (/proc), elsewhere it does
# nothing. It cannot find the session's processes by command line alone (Ray's agents retitle
# themselves) nor by parent after the driver died (they are re-parented), so while the driver
# lives it notes, with their start times, the driver's children started for this session (the
# session folder is in their command line) and all their descendants; then it stops those left.
WATCHDOG = r"""
import os, select, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: outlive the driver
driver, session, me = int(sys.argv[1]), sys.argv[2].encode(), os.getpid()
def table():
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
                out[int(d)] = (int(rest[1]), rest[19], rest[0])  # parent, start time, state
            except (OSError, IndexError, ValueError):
                pass
    return out
def ours(pid, parent):
    if parent in seen:
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return parent == driver and session in f.read()
    except OSError:
        return False
def discover():
    procs, grew = table(), True
    while grew:
        grew = False
        for pid, (parent, start, _) in procs.items():
            if pid not in seen and pid != me and (parent == driver or parent in seen) and ours(pid, parent):
                seen[pid] = start
                grew = True
seen, began = {}, time.monotonic()
while True:
    discover()
    # Ray starts its services and first workers in the first seconds: look every second then, every
    # 5 s after (a scan of /proc costs little CPU, but not nothing), and once more at the end
    wait = 1.0 if time.monotonic() - began < 15 else 5.0
    if select.select([sys.stdin], [], [], wait)[0] and not os.read(sys.stdin.fileno(), 4096):
        break  # the driver closed the pipe or died
discover()  # workers started since the last look, while the processes that started them still live
def left():
    procs = table()
    return [p for p, start in seen.items() if p in procs and procs[p][1] == start and procs[p][2] != "Z"]
for sig, grace in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 1.0)):
    pids, deadline = left(), time.time() + grace
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    while pids and time.time() < deadline:
        time.sleep(0.05)
        pids = left()
"""


def session_dir() -> str | None:
    """The session folder of the Ray node this process started (Ray's private ``Node``), or None."""
    try:
        from ray._private.worker import global_worker

        node = global_worker.node
        return node.get_session_dir_path() if node is not None else None
    except Exception:  # noqa: BLE001 - a private API; without it we only lose the cleanup
        return None


def _start_watchdog() -> subprocess.Popen | None:
    """Start the reaper of this Ray session's processes (see the module docstring)."""
    session = session_dir()
    if not session or not os.path.isdir("/proc"):
        return None
    # The pipe's write end stays in this process only (non-inheritable), so its death closes it.
    return subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", WATCHDOG, str(os.getpid()), session],  # stdlib only: no site to import
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )


def _stop_watchdog(watchdog: subprocess.Popen | None) -> None:
    if watchdog is not None and watchdog.stdin is not None:
        watchdog.stdin.close()  # it stops what ray.shutdown() left, then exits; no need to wait


# The head-node services ray.init starts that a one-node, one-run Ray does not need (see the
# module docstring). ray.init has no switch for them, so while it builds the node these methods
# of Ray's (private) Node class do nothing; a Ray without them (renamed, moved) starts them all.
_CLUSTER_SERVICES = ("start_monitor", "start_log_monitor", "start_api_server")


def node_class() -> type | None:
    """Ray's private ``Node`` class, if it has the methods that start ``_CLUSTER_SERVICES``."""
    try:
        from ray._private.node import Node
    except ImportError:
        return None
    return Node if all(name in vars(Node) for name in _CLUSTER_SERVICES) else None


@contextlib.contextmanager
def _one_node_services() -> Iterator[None]:
    node = node_class()
    if node is None:
        yield  # not the Node this was written against: leave it alone
        return
    with _patched(node, dict.fromkeys(_CLUSTER_SERVICES, _not_started)):
        yield


@contextlib.contextmanager
def _patched(owner: object, replacements: dict[str, Any]) -> Iterator[None]:
    """``owner``'s attributes (a class's or a module's own) replaced while the block runs, then put back."""
    saved = {name: vars(owner)[name] for name in replacements}
    for name, value in replacements.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(owner, name, value)


def _not_started(self: object, *args: object, **kwargs: object) -> None:
    return None


# The raylet's two Python agents, each importing Ray for nothing an embedded run uses: they are
# replaced by stand-ins of the standard library (agent_stub.py says what each does and why that
# is enough). Ray builds each agent's command line from this function of its services module (the
# interpreter, before the agent's script), so while ray.init starts the raylet it puts the stand-in
# first, with Ray's command after it. A Ray without that function or those names runs its own agents.
AGENT_STUB = str(Path(__file__).with_name("agent_stub.py"))
_COMMAND_BUILDER = "_build_python_executable_command_memory_profileable"


def stand_in_modes() -> dict[str, list[str]] | None:
    """Ray's process type of each agent -> the stand-in's mode and the names of its port files."""
    try:
        from ray import _raylet
        from ray._private import ray_constants
    except ImportError:
        return None
    raylet: Any = _raylet  # names its type stubs leave out
    try:
        dashboard = [raylet.METRICS_AGENT_PORT_NAME, raylet.METRICS_EXPORT_PORT_NAME, raylet.DASHBOARD_AGENT_LISTEN_PORT_NAME]
        modes = {
            ray_constants.PROCESS_TYPE_DASHBOARD_AGENT: ["dashboard", *dashboard],
            ray_constants.PROCESS_TYPE_RUNTIME_ENV_AGENT: ["runtime-env", raylet.RUNTIME_ENV_AGENT_PORT_NAME],
        }
        # The stand-ins name the port files the way Ray does (<name>_<node id> in the session folder).
        if raylet.get_port_filename("ab" * 28, "x_port") != "x_port_" + "ab" * 28:
            return None
    except AttributeError:
        return None
    return modes


def services_module() -> Any:
    """Ray's private ``services`` module, if it builds the agents' commands with ``_COMMAND_BUILDER``."""
    try:
        from ray._private import services
    except ImportError:
        return None
    return services if callable(services.__dict__.get(_COMMAND_BUILDER)) else None


@contextlib.contextmanager
def _agent_stand_ins() -> Iterator[None]:
    services = services_module()
    modes = stand_in_modes()
    if services is None or modes is None or os.name != "posix":  # (the stand-ins wait on POSIX pipes)
        yield  # not the Ray this was written against: its own agents
        return
    build = services.__dict__[_COMMAND_BUILDER]

    def stand_in(component: str, *args: Any, **kwargs: Any) -> list[str]:
        command = build(component, *args, **kwargs)
        mode = modes.get(component)
        return command if mode is None else [sys.executable, "-I", "-S", AGENT_STUB, *mode, "--", *command]

    with _patched(services, {_COMMAND_BUILDER: stand_in}):
        yield


# Ray's own observability, which an embedded Ray reports to nobody (no dashboard, no state API, no
# Prometheus): every process records metrics (exported every 10 s), and every worker and the driver
# buffer each task's state changes and send them to the GCS every second, where they are kept for
# `ray list tasks` and the dashboard's timeline. Both are Ray settings documented in its
# src/ray/common/ray_config_def.h ("Setting the value to 0 disables the task event recording and
# reporting"); passed as ``_system_config``, which only a new cluster takes, so a cluster joined with
# --ray-address keeps its own.
EMBEDDED_SYSTEM_CONFIG: dict[str, object] = {
    "enable_metrics_collection": False,
    "task_events_report_interval_ms": 0,
}


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[str]:
    """Yield a description of the Ray cluster in use; shut down only what we started."""
    if not address and "ray" not in sys.modules:
        _embedded_env(cache_dir() / "ray")  # must precede `import ray`
    import ray

    if ray.is_initialized():  # a caller (a test, a notebook) already connected: use it as is
        yield "existing Ray connection"
        return
    if address:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        where = f"Ray cluster at {address}"
    else:
        ray_dir = _session_dir()
        _embedded_env(cache_dir() / "ray")  # no-op when done above
        os.environ.setdefault("RAY_TMPDIR", str(ray_dir))  # any other Ray file goes there too, not /tmp/ray
        _prune_sessions(ray_dir)
        with _one_node_services(), _agent_stand_ins():
            ray.init(
                address="local",  # never attach to a stale cluster recorded on the machine
                num_cpus=num_cpus,
                _node_ip_address=LOOPBACK,
                _temp_dir=str(ray_dir),
                include_dashboard=False,
                logging_level=logging.WARNING,
                log_to_driver=False,
                _system_config=EMBEDDED_SYSTEM_CONFIG,
            )
        where = f"embedded Ray ({int(ray.cluster_resources().get('CPU', 0))} CPUs, loopback)"
    watchdog = None if address else _start_watchdog()
    try:
        yield where
    finally:
        ray.shutdown()
        _stop_watchdog(watchdog)
