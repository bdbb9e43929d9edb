"""The engine's error, defined with datapipe's other errors in datapipe/errors.py; this import path stays."""

from datapipe.errors import PipelineError

__all__ = ["PipelineError"]
