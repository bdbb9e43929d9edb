"""datapipe.runtime.jit.load_numba: numba starts without importing scipy.linalg or cffi."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_numba_kernels_load_without_scipy_linalg() -> None:
    """datapipe.runtime.jit.load_numba: numba's BLAS probe is answered without importing scipy.linalg
    (0.3-0.45 s per process); kernels still run, and np.dot in a kernel still finds SciPy."""
    code = (
        "import sys\nfrom datapipe.stages import cjk\nd, _, _ = cjk.line_script_counts(['ab 中文'])\n"
        "print(int(d['han'][0]), 'scipy.linalg' in sys.modules, 'cffi' in sys.modules)\n"
        "import numba, numpy as np\nf = numba.njit(lambda a: np.dot(a, a))\nprint(f(np.ones(3)))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2", "False", "False", "3.0"]
