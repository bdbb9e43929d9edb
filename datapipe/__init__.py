"""datapipe: pretraining-data pipeline for Chinese/English corpora.

Importing the package is cheap on purpose: training jobs import ``datapipe.loader``
and must not pay for Ray, DuckDB or the engine.
"""

__version__ = "0.1.0"
