"""Every use of Ray's private API (all in datapipe/engine/executors/ray/), each checked by name.

Each use has a fallback, so a Ray that moved the attribute still runs datapipe, only without what the
use bought: these tests are what notices. Ray is imported, never started. When one fails after a Ray
upgrade, find the attribute's new home in that Ray, update the module named in the message, and raise
the upper bound of ``ray`` in pyproject.toml.
"""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")


def _moved(what: str, where: str, loses: str) -> str:
    return f"Ray {ray.__version__} moved {what}: {where} falls back, and a run loses {loses}"


def test_worker_call_counts_for_making_way() -> None:
    from datapipe.engine.executors.ray import recycle

    assert recycle.call_counts() is not None, _moved(
        "ray._private.worker.global_worker.function_actor_manager's _function_execution_info / _num_task_executions",
        "engine/executors/ray/recycle.py call_counts",
        "recycling of workers that hold too much memory (workers: in the pipeline file)",
    )


def test_node_session_dir_for_the_watchdog() -> None:
    from ray._private import worker
    from ray._private.node import Node

    assert hasattr(worker.global_worker, "node") and callable(getattr(Node, "get_session_dir_path", None)), _moved(
        "ray._private.worker.global_worker.node / Node.get_session_dir_path",
        "engine/executors/ray/runtime.py session_dir",
        "the watchdog that stops an embedded Ray's processes after a killed driver",
    )


def test_node_services_an_embedded_ray_skips() -> None:
    from datapipe.engine.executors.ray import runtime

    assert runtime.node_class() is not None, _moved(
        f"ray._private.node.Node's {', '.join(runtime._CLUSTER_SERVICES)}",
        "engine/executors/ray/runtime.py node_class",
        "the lean start of an embedded Ray (the monitor, log monitor and API server start again)",
    )


def test_agent_names_and_port_files_for_the_stand_ins() -> None:
    from datapipe.engine.executors.ray import runtime

    assert runtime.stand_in_modes() is not None, _moved(
        "ray._private.ray_constants.PROCESS_TYPE_*_AGENT or ray._raylet's port file names",
        "engine/executors/ray/runtime.py stand_in_modes",
        "the stand-ins for the raylet's two agents (Ray's own agents start, importing Ray)",
    )


def test_agent_command_builder_for_the_stand_ins() -> None:
    from datapipe.engine.executors.ray import runtime

    assert runtime.services_module() is not None, _moved(
        f"ray._private.services.{runtime._COMMAND_BUILDER}",
        "engine/executors/ray/runtime.py services_module",
        "the stand-ins for the raylet's two agents (Ray's own agents start, importing Ray)",
    )


def test_object_ref_completion_callback() -> None:
    assert callable(getattr(ray.ObjectRef, "_on_completed", None)), _moved(
        "ray.ObjectRef._on_completed",
        "engine/executors/ray/executor.py _when_done",
        "the cheaper result callback (ObjectRef.future() costs the driver more per task)",
    )


def test_driver_error_printer_for_holding_retry_notices() -> None:
    from datapipe.engine.executors.ray import notices

    assert notices.printer_module() is not None, _moved(
        "ray._private.worker.print_to_stdstream",
        "engine/executors/ray/notices.py printer_module",
        "quiet failures: Ray's notices of retried task attempts print again before datapipe's one-line error",
    )
