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


def test_stage_modules_load_numba_only_when_a_kernel_runs() -> None:
    """runtime/jit.py lazy_numba: a driver imports every stage module of its pipeline to plan it and
    runs none of their kernels on Ray, so importing them must not load numba (~60-80 MiB RSS); the
    first call of a kernel loads it, and the module's kernels are numba's dispatchers from then on."""
    code = (
        "import sys\n"
        "import datapipe.stages.langid, datapipe.stages.quality, datapipe.stages.minhash, datapipe.stages.dedup\n"
        "import datapipe.stages.decontaminate, datapipe.stages.boilerplate, datapipe.stages.substrings\n"
        "print('numba' in sys.modules)\n"
        "from datapipe.stages import cjk\n"
        "d, _, _ = cjk.line_script_counts(['ab 中文'])\n"
        "from numba.core.registry import CPUDispatcher\n"
        "print('numba' in sys.modules, int(d['han'][0]), isinstance(cjk._count_kernel, CPUDispatcher))\n"
        "import numpy as np\nfrom datapipe.dedup.cluster import UnionFind\n"  # a kernel calling one: _union_kernel -> _find
        "u = UnionFind(5); u.union(np.array([0, 3]), np.array([3, 4])); print(*u.roots().tolist())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True", "2", "True", "0", "1", "2", "0", "0"]
