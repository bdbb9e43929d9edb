"""A Ray worker's pyarrow pool: jemalloc unless the user chose one (``use_returning_pool``), checked in
fresh processes (a pool is chosen once per process, before its first allocation matters)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import pyarrow as pa
from datapipe.runtime.release_memory import release_memory, use_returning_pool
before = pa.default_memory_pool().backend_name
now = use_returning_pool()
table = pa.table({"x": list(range(100_000))})  # allocated from the pool now in use
assert pa.default_memory_pool().bytes_allocated() > 0
del table
release_memory()
print(before, now, pa.default_memory_pool().backend_name)
"""


def _pools(env: dict[str, str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env={**{k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}, "PYTHONPATH": str(ROOT), **env},
        timeout=120,
        check=True,
    )
    return out.stdout.split()


def test_a_worker_allocates_from_jemalloc_unless_the_user_chose_a_pool() -> None:
    import pyarrow as pa

    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        pytest.skip("this pyarrow build has no jemalloc: the default pool is kept")
    before, now, used = _pools({})
    assert (now, used) == ("jemalloc", "jemalloc"), before
    assert _pools({"ARROW_DEFAULT_MEMORY_POOL": "system"}) == ["system", "system", "system"]
