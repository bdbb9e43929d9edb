"""The folder where datapipe keeps models, object-store mirrors and Ray session files."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where datapipe keeps models and Ray session files: $DATAPIPE_CACHE_DIR, else the XDG cache."""
    env = os.environ.get("DATAPIPE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "datapipe"
