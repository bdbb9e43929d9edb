"""datapipe: pretraining-data pipeline for Chinese/English corpora.

Importing the package is cheap on purpose: training jobs import ``datapipe.loader``
and must not pay for Ray, DuckDB or the engine.
"""

__version__ = "0.1.0"

import os as _os

if _os.environ.get("DATAPIPE_ARROW_WITHOUT_PANDAS"):  # a `datapipe run` worker (datapipe/runtime/arrow_pandas.py)
    from datapipe.runtime.arrow_pandas import arrow_without_pandas as _skip

    _skip()
