"""The loader's watch on mapped shards (``verify.ShardWatch``) across a fork, as DataLoader workers
are made: a write to a shard once the child runs is seen by the parent and by the child, whichever
polls first (before, the child made its own inotify instance at its first poll, so a write between
the child's start and that poll went unseen by the child)."""

from __future__ import annotations

import os
import select
from pathlib import Path

import pytest

from datapipe.loader.verify import ShardWatch

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or not hasattr(os, "register_at_fork"), reason="needs fork")


def test_a_write_after_a_fork_is_seen_by_the_child_and_the_parent(tmp_path: Path) -> None:
    shard = tmp_path / "train-00000.arrow"
    shard.write_bytes(b"\0" * 4096)
    watch = ShardWatch()
    os.register_at_fork(after_in_child=watch._after_fork)  # as the module's own WATCH is
    if not watch.add(str(shard)):
        pytest.skip("no inotify here (or no watch left for this user)")
    assert not watch.poll()
    written_r, written_w = os.pipe()
    result_r, result_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: waits for the write, then polls once
        code = 1
        try:
            os.close(written_w)
            os.write(result_w, b"r")  # running: the fork's handlers are done
            os.read(written_r, 1)
            seen = watch.poll() and str(shard) in watch.changed and watch.watching(str(shard))
            os.write(result_w, b"1" if seen else b"0")
            code = 0
        finally:
            os._exit(code)
    os.close(written_r)
    os.close(result_w)
    assert select.select([result_r], [], [], 30)[0] and os.read(result_r, 1) == b"r"
    with open(shard, "r+b") as f:  # another process would do this: a write in place
        f.write(b"changed")
    os.write(written_w, b"x")
    ready = select.select([result_r], [], [], 30)[0]
    child_saw = os.read(result_r, 1) if ready else b"?"
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert child_saw == b"1", "the forked child did not see the write made after the fork"
    assert watch.poll() and str(shard) in watch.changed  # the parent's events are still the parent's
    watch.remove(str(shard))
