"""Ray's notices of the attempts of datapipe's tasks that it retries, kept off the terminal.

Ray's driver prints them from its error-listening thread as they happen (``(raylet) Task ray_run_task
failed. There are 3 retries remaining, so the task will be retried. Error: User exception: ...`` and
the task's traceback), before and after datapipe says, once, what failed and what to do. They go to
``engine/failures.py`` instead, which writes them to the failed run's log.

That thread prints through ``ray._private.worker.print_to_stdstream``, looked up by name for each
message (``printer_module``: a private API, tested in tests/engine/test_ray_private.py); the name is
replaced once per process by a filter that holds the notices about the remote functions named to
``hold_retry_notices`` and passes every other message on (a worker killed for memory, a shared
session's other tasks). Never undone: the notice of a task's last retried attempt can reach the driver
after its failure was reported, and ``ray.shutdown()`` ends the thread that prints them anyway.
"""

from __future__ import annotations

import re
import threading
from types import ModuleType
from typing import Any

from datapipe.engine import failures

# Ray's notice of an attempt it retries (src/ray/core_worker/task_manager.cc): "Task <name> failed.
# There are N retries remaining, so the task will be retried. Error: ..." (an OOM kill and a
# preempted node say "will be retried" too).
RETRY_NOTICE = re.compile(r"Task (\S+) failed\b.*\b(?:retries remaining|will be retried)\b", re.S)

_tasks: set[str] = set()  # remote functions whose retry notices are held
_replaced: list[Any] = []  # Ray's own printer, once replaced
_lock = threading.Lock()


def printer_module() -> ModuleType | None:
    """``ray._private.worker`` when it prints the driver's error messages through ``print_to_stdstream``
    (a private API); None where Ray moved it: the notices then print as before."""
    try:
        from ray._private import worker
    except ImportError:
        return None
    return worker if callable(vars(worker).get("print_to_stdstream")) else None


def hold_retry_notices(task: str) -> None:
    """From now on in this process, hold Ray's notices of retried attempts of the remote function named
    ``task`` (``failures.hold``) instead of printing them; the notices held so far are dropped (they
    are an earlier run's). Called when a run's Ray executor opens."""
    failures.clear_held()
    with _lock:
        _tasks.add(task)
        module = None if _replaced else printer_module()
        if module is None:
            return
        printer = vars(module)["print_to_stdstream"]

        def filtered(data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
            lines = [str(line) for line in data.get("lines") or ()]
            if data.get("pid") == "raylet" and lines and all(_ours(line) for line in lines):
                failures.hold(lines)
                return
            printer(data, *args, **kwargs)

        setattr(module, "print_to_stdstream", filtered)  # noqa: B010 - a module's attribute, by name
        _replaced.append(printer)


def _ours(line: str) -> bool:
    """Whether ``line`` is Ray's notice of a retried attempt of a held task."""
    match = RETRY_NOTICE.match(line)
    return match is not None and match.group(1) in _tasks
