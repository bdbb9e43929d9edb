"""A Ray worker sizes the tokenizer's thread pool (rayon) to the CPUs of its task, not the machine's
cores (engine/executors/ray/worker.py ``size_thread_pools``), and keeps a value the user set."""

from __future__ import annotations

import os

import pytest

ray = pytest.importorskip("ray")


def _sized(preset: str | None) -> str | None:
    from datapipe.engine.executors.ray import worker

    os.environ.pop("RAYON_NUM_THREADS", None)  # workers are reused: start each call from scratch
    if preset is not None:
        os.environ["RAYON_NUM_THREADS"] = preset
    worker.size_thread_pools()
    value = os.environ.get("RAYON_NUM_THREADS")
    os.environ.pop("RAYON_NUM_THREADS", None)
    return value


def test_pool_follows_the_task_cpus_and_a_user_setting_wins(ray_local) -> None:
    sized = ray.remote(_sized)
    assert ray.get(sized.options(num_cpus=1).remote(None)) == "1"
    assert ray.get(sized.options(num_cpus=2).remote(None)) == "2"
    assert ray.get(sized.options(num_cpus=0.5).remote(None)) == "1"
    assert ray.get(sized.options(num_cpus=1).remote("3")) == "3"
