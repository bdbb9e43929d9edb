"""Reading the next batch of a task's input while the task works on the current one.

A map task reads a batch, then processes it. Where the processing runs on several threads (the
fast encoder of a run in the driver: tiktoken releases the GIL), reading is a stretch in which
one core works and the others wait; pyarrow's JSON parsing and the decompression release the GIL
too, so a thread can read ahead. Only the reader's own batches are fetched ahead: everything done
with them (counts, rejects, outputs) stays on the task's thread and in the same order, so the
outputs are the same. At most ``depth`` batches wait, so memory grows by that many batches.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")

_DONE = object()


def prefetched(items: Iterator[T], depth: int = 1) -> Iterator[T]:
    """``items`` in order, produced by a background thread up to ``depth`` ahead; an exception of
    the producer is raised here, where the item would have come. Closing this generator (or an
    exception in the consumer) stops the producer at its next item."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(x: object) -> bool:
        while not stop.is_set():
            try:
                q.put(x, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for x in items:
                if not put((x, None)):
                    return
            put((_DONE, None))
        except BaseException as exc:  # handed to the consumer, raised there
            put((_DONE, exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="datapipe-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            x, exc = q.get()
            if exc is not None:
                raise exc
            if x is _DONE:
                return
            yield x
    finally:
        stop.set()
        thread.join()
