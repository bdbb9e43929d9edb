"""Stages and readers from other packages, found through Python entry points.

A package registers a stage type under group ``datapipe.stages`` (``name = "module:StageClass"``)
and an input format under group ``datapipe.readers`` (``name = "module:SPEC"``, a ``ReaderSpec``);
the stage and reader registries (one ``Registry`` each) ask here, lazily, and pipeline files may then name them without
an edit to datapipe (``datapipe/stages/__init__.py``, ``datapipe/readers/registry.py``).
"""

from datapipe.plugins.entry_points import READER_GROUP, STAGE_GROUP, Plugin, PluginError, discover
from datapipe.plugins.registry import Registry

__all__ = ["READER_GROUP", "STAGE_GROUP", "Plugin", "PluginError", "Registry", "discover"]
