"""engine/tasks/prefetch.py: batches read ahead on a thread come in order, errors where they happened."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from datapipe.engine.tasks.prefetch import prefetched


def test_items_come_in_order_from_another_thread() -> None:
    producers: set[str] = set()

    def items() -> Iterator[int]:
        for i in range(50):
            producers.add(threading.current_thread().name)
            yield i

    assert list(prefetched(items())) == list(range(50))
    assert producers == {"datapipe-read-ahead"}


def test_an_error_of_the_reader_is_raised_after_the_items_before_it() -> None:
    def items() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("bad record")

    got = []
    with pytest.raises(ValueError, match="bad record"):
        for x in prefetched(items()):
            got.append(x)
    assert got == [1, 2]


def test_stopping_early_closes_the_reader() -> None:
    closed = threading.Event()

    def items() -> Iterator[int]:
        try:
            yield from range(1000)
        finally:
            closed.set()

    gen = prefetched(items())
    assert next(gen) == 0
    gen.close()
    assert closed.wait(5)
