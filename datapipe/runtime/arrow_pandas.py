"""Keep pandas out of pipeline processes.

pyarrow imports pandas (0.25-0.4 s of CPU) the first time it converts Python objects
(``pa.array(list)``, ``pa.scalar``), only to ask whether they are pandas objects. A pipeline
process (the ``datapipe run`` driver, its Ray workers) never holds one: datapipe does not use
pandas. ``arrow_without_pandas`` lets that first probe find no pandas, so pyarrow never imports
it; ``Table.to_pandas`` would still import it on demand. Not for general use: in a process that
later hands pandas objects to ``pa.array``, pyarrow would treat them as plain sequences (a
Series' NaN would stay NaN instead of becoming null), which is why only the ``run`` command turns
it on, for itself and, through ``ENV``, for the Ray workers it starts.
"""

from __future__ import annotations

import os
import sys

ENV = "DATAPIPE_ARROW_WITHOUT_PANDAS"  # set by `datapipe run`; Ray workers inherit it


class _HidePandas:
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("hidden from pyarrow's pandas probe", name=name)


def arrow_without_pandas() -> None:
    """Answer pyarrow's once-per-process pandas probe with "no pandas" (see above)."""
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    hide = _HidePandas()
    sys.meta_path.insert(0, hide)
    try:
        pa.array([None])  # the probe runs on the first conversion of a Python sequence, then never again
    finally:
        sys.meta_path.remove(hide)


def enable_for_run() -> None:
    """In the ``run`` driver: skip pandas here and in the workers Ray starts from this process."""
    os.environ[ENV] = "1"
    arrow_without_pandas()
