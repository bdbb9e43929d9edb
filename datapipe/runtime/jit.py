"""numba for datapipe's kernels, without loading SciPy.

The first time a process compiles a numba kernel or loads one from numba's cache, numba's CPU
target imports ``numba.np.arraymath``, which probes for a BLAS by importing ``scipy.linalg``: a
cost in every process (driver and each Ray worker), for nothing, as no datapipe kernel does
linear algebra. ``load_numba`` imports that module with SciPy hidden, so the probe
answers "no BLAS". Its only effect is that numba's ``np.correlate``/``np.convolve`` use their
plain loop; ``np.dot`` and ``np.linalg`` still import SciPy when a kernel uses them.

Likewise numba's typing context builds a ``cffi.FFI()`` (importing cffi and pycparser) to
recognise cffi functions passed to kernels, which datapipe never does: its module is imported
here with cffi hidden, so numba's cffi support is off in the process (cffi itself still imports
normally).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any


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


# Lazy kernels. A stage module builds its kernels at import, but the driver imports every stage
# module of a pipeline only to validate and plan it: with eager ``numba.njit`` that loads numba and
# llvmlite into the driver for kernels it never runs when the map tasks run on Ray. ``lazy_numba()``
# stands in for the ``numba`` module in such a module; its ``njit`` returns a :class:`LazyKernel`
# that imports numba and makes the real dispatcher on its first use.
#
# ``njit(..., warm=[signature, ...])`` declares, beside the kernel, the argument types the code
# passes it: ``runtime/kernel_warmup.py`` compiles those ahead of the workers (it finds the modules
# that declare some by reading the package's files). A signature is a tuple of ``arr(dtype, ndim,
# readonly)`` for array arguments and numba type names (``"int64"``) for scalars.

ArgSpec = tuple[str, int, bool] | str  # (dtype, ndim, readonly) of a C-contiguous array, or a scalar type
Signature = tuple[ArgSpec, ...]


def arr(dtype: str, ndim: int = 1, readonly: bool = False) -> tuple[str, int, bool]:
    """A C-contiguous array argument of a warm-up signature; ``readonly``: viewed on an Arrow buffer
    (``np.frombuffer``), which numba types apart from a writable array."""
    return (dtype, ndim, readonly)


class LazyKernel:
    """``numba.njit(**options)(func)``, made on first call or attribute access (``.compile``, ``.stats``).

    Making it also rebinds, in ``func``'s module, every lazy kernel (to its dispatcher) and the
    lazy ``numba`` (to the module): a kernel compiling later looks its callees and ``numba.*`` up
    in those globals, and numba types only real dispatchers. The cache key (the function's name
    and source file) is the same as an eager ``@numba.njit(cache=True)`` one's.
    """

    def __init__(self, func: Callable[..., Any], options: dict[str, Any], warm: Sequence[Signature] = ()) -> None:
        self.py_func = func
        self._options = options
        self._dispatcher: Any = None
        self.warm = tuple(warm)  # the signatures the warm-up compiles
        functools.update_wrapper(self, func)
        if self.warm:
            WARM.append(self)

    def dispatcher(self) -> Any:
        if self._dispatcher is None:
            with _LOCK:
                if self._dispatcher is None:
                    self._dispatcher = load_numba().njit(**self._options)(self.py_func)
                    _bind_module(self.py_func.__globals__)
        return self._dispatcher

    def __call__(self, *args: Any) -> Any:
        return self.dispatcher()(*args)

    def __getattr__(self, name: str) -> Any:  # only names not set in __init__: the dispatcher's
        if name.startswith("_"):  # (and none while unpickling or copying, before __init__ ran)
            raise AttributeError(name)
        return getattr(self.dispatcher(), name)


class LazyNumba:
    """What ``lazy_numba()`` returns: ``njit`` without importing numba; any other name imports it."""

    def njit(self, *args: Any, warm: Sequence[Signature] = (), **options: Any) -> Any:
        if args and callable(args[0]):  # bare @njit
            return LazyKernel(args[0], options, warm)
        return lambda func: LazyKernel(func, options, warm)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(load_numba(), name)


def lazy_numba() -> Any:
    """A stand-in for ``numba`` whose ``njit`` kernels compile (or load from numba's cache) on first use."""
    return _LAZY


def _bind_module(namespace: dict[str, Any]) -> None:
    for name, value in list(namespace.items()):
        if isinstance(value, LazyKernel):
            namespace[name] = value.dispatcher()
        elif value is _LAZY:
            namespace[name] = load_numba()


_LAZY = LazyNumba()
_LOCK = threading.RLock()
WARM: list[LazyKernel] = []  # every lazy kernel made with warm-up signatures, in the order made
