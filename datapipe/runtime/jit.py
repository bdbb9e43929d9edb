"""numba for datapipe's kernels, without loading SciPy.

The first time a process compiles a numba kernel or loads one from numba's cache, numba's CPU
target imports ``numba.np.arraymath``, which probes for a BLAS by importing ``scipy.linalg``:
about 0.45 s of CPU in every process (driver and each Ray worker), for nothing, as no datapipe
kernel does linear algebra. ``load_numba`` imports that module with SciPy hidden, so the probe
answers "no BLAS". Its only effect is that numba's ``np.correlate``/``np.convolve`` use their
plain loop; ``np.dot`` and ``np.linalg`` still import SciPy when a kernel uses them.

Likewise numba's typing context builds a ``cffi.FFI()`` (importing cffi and pycparser, ~80 ms of
CPU) to recognise cffi functions passed to kernels, which datapipe never does: its module is
imported here with cffi hidden, so numba's cffi support is off in the process (cffi itself still
imports normally).
"""

from __future__ import annotations

import sys
from types import ModuleType


def load_numba() -> ModuleType:
    """``import numba``, with numba's BLAS probe done without importing SciPy (see above)."""
    import numba

    if "numba.np.arraymath" not in sys.modules and "scipy.linalg" not in sys.modules:
        # (numba itself imports the light `scipy` package; the probe's cost is scipy.linalg)
        sys.modules["scipy.linalg"] = None  # type: ignore[assignment]  # its import raises ImportError
        try:
            import numba.np.arraymath  # noqa: F401
        finally:
            if sys.modules.get("scipy.linalg", 0) is None:
                del sys.modules["scipy.linalg"]
    if "numba.core.typing.cffi_utils" not in sys.modules and "cffi" not in sys.modules:
        sys.modules["cffi"] = None  # type: ignore[assignment]
        try:
            import numba.core.typing.cffi_utils  # noqa: F401
        finally:
            if sys.modules.get("cffi", 0) is None:
                del sys.modules["cffi"]
    return numba
