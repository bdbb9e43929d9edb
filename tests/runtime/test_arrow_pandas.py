"""datapipe.runtime.arrow_pandas: a pipeline process converts Python objects to Arrow without importing pandas."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, env_on: bool) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "DATAPIPE_ARROW_WITHOUT_PANDAS"}
    if env_on:
        env["DATAPIPE_ARROW_WITHOUT_PANDAS"] = "1"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_workers_skip_pandas_and_convert_the_same() -> None:
    code = (
        "import sys\nimport datapipe.engine.tasks.map\nimport pyarrow as pa\n"
        "a = pa.array([1.5, None, float('nan')], pa.float32(), from_pandas=True)\n"
        "print('pandas' in sys.modules, a.null_count, pa.scalar(None, pa.string()).is_valid)"
    )
    assert _run(code, env_on=True) == ["False", "2", "False"]
    assert _run(code, env_on=False) == ["True", "2", "False"]  # the default: pyarrow imports it


def test_to_pandas_still_works_after_the_probe() -> None:
    code = (
        "from datapipe.runtime.arrow_pandas import arrow_without_pandas\narrow_without_pandas()\n"
        "import pyarrow as pa\nprint(type(pa.table({'a': [1]}).to_pandas()).__name__)"
    )
    assert _run(code, env_on=False) == ["DataFrame"]


def test_run_driven_from_a_users_process_leaves_its_pyarrow_alone(tmp_path: Path) -> None:
    """`datapipe run` through click's main.main (a notebook, a job script) must not change how that
    process's pyarrow treats pandas objects afterwards: a Series' NaN still becomes null."""
    import yaml

    (tmp_path / "docs.jsonl").write_text('{"text": "hello world, a document long enough"}\n', encoding="utf-8")
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "sources": [{"name": "web", "kind": "web", "paths": [str(tmp_path / "docs.jsonl")]}],
                "stages": [{"length": {"min_chars": 5}}],
                "tokenize": {"tokenizer": str(ROOT / "tokenizer" / "demo.json"), "seq_len": 64},
            }
        )
    )
    code = (
        "import os, sys\nfrom datapipe.cli import main\n"
        f"try:\n    main.main(['run', {str(pipeline)!r}, '--output', {str(tmp_path / 'out')!r}, '--in-process', "
        "'--no-progress'])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "import pandas, pyarrow as pa\n"
        "print(pa.array(pandas.Series([1.0, float('nan')])).null_count, "
        "'DATAPIPE_ARROW_WITHOUT_PANDAS' in os.environ)"
    )
    assert _run(code, env_on=False)[-2:] == ["1", "False"]
