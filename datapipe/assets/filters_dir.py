"""Where the declarative data files live: the project's top-level ``filters/`` folder.

Rule sets, word lists, blocklists and the license class table are data, not code, so they
sit beside the package in ``filters/`` where users read and edit them. Looked up in order:
``$DATAPIPE_FILTERS_DIR``; the ``filters/`` folder of the checkout the package runs from
(``pip install -e .``); the copy a wheel install puts under ``<prefix>/share/datapipe/filters``.
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from pathlib import Path

from datapipe.errors import DatapipeError


class FiltersNotFound(DatapipeError, FileNotFoundError):
    """datapipe's filters/ folder, or a file datapipe needs in it, is missing: an installation problem."""


@lru_cache(maxsize=1)
def filters_dir() -> Path:
    env = os.environ.get("DATAPIPE_FILTERS_DIR")
    candidates = [Path(env)] if env else []
    candidates += [Path(__file__).resolve().parents[2] / "filters", Path(sys.prefix) / "share" / "datapipe" / "filters"]
    for path in candidates:
        if (path / "quality").is_dir():
            return path
    raise FiltersNotFound(
        "datapipe's filters/ folder (rule sets, word lists) was not found; looked in " + ", ".join(map(str, candidates)),
        hint="set DATAPIPE_FILTERS_DIR to a folder with quality/, words/ and licenses/ in it",
    )


def filter_file(*parts: str) -> Path:
    path = filters_dir().joinpath(*parts)
    if not path.exists():
        raise FiltersNotFound(
            f"{path} is missing from datapipe's filters/ folder {filters_dir()}",
            hint="restore it (it ships with datapipe), or set DATAPIPE_FILTERS_DIR to a complete copy",
        )
    return path
