"""Per-process caches of what stages load (models, dictionaries, indexes), and one way to drop them.

A Ray worker keeps what a stage loaded for every later task of the same stage, which is the point:
a model is loaded once per worker, not once per task. Once a phase is over its stages are not run
again in that run, yet a reused worker would carry their models into every later phase (the
Traditional/Simplified dictionaries of langid alone are ~90 MiB) and its later tasks would peak
that much higher. The engine drops them when a worker moves on to another phase
(``engine/plan.py``: ``forget_stages``); a stage that is needed again loads again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

_CLEARERS: list[Callable[[], None]] = []

C = TypeVar("C", bound=dict)


def process_cache(cache: C) -> C:
    """Register a module-level cache (a dict) to be emptied by :func:`clear_process_caches`."""
    _CLEARERS.append(cache.clear)
    return cache


def clear_process_caches() -> None:
    for clear in _CLEARERS:
        clear()
