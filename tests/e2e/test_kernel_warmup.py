"""The kernel warm-up compiles exactly what the stages run: after it, a pipeline over real zh/en
pages, web pages and benchmarks (every stage with a numba kernel) compiles nothing, and the
runner's stamp makes the next run skip the warm-up."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from datapipe.assets.models import lid_model_path
from datapipe.runtime import kernel_warmup
from tests.conftest import write_pipeline
from tests.support.shared_data import PROJECT_ROOT, shared_path

# Runs the pipeline in this process and prints, per numba kernel of the map/reduce stages (the
# loader's are compiled in training processes), how often it loaded from the cache and compiled.
RUN_AND_COUNT = """
import json, sys
from pathlib import Path
from numba.core.registry import CPUDispatcher
from datapipe.pipeline.load import load_pipeline
from datapipe.engine.runner import run_pipeline
run_pipeline(load_pipeline(Path(sys.argv[1])), output=Path(sys.argv[2]), show_progress=False,
             log=lambda m: None, in_process=True)
stats = {}
for name, mod in list(sys.modules.items()):
    if name.startswith("datapipe") and not name.startswith("datapipe.loader"):
        for attr, v in list(vars(mod).items()):
            if isinstance(v, CPUDispatcher):
                s = v.stats
                stats[f"{name}:{attr}"] = [sum(s.cache_hits.values()), sum(s.cache_misses.values())]
print(json.dumps(stats))
"""


def _lines(name: str, n: int, cut: int = 3000) -> str:
    with shared_path("corpus", name).open(encoding="utf-8") as f:
        rows = [json.loads(next(f)) for _ in range(n)]
    return "".join(json.dumps({**r, "text": r["text"][:cut]}, ensure_ascii=False) + "\n" for r in rows)


def test_after_the_warm_up_no_stage_compiles_a_kernel(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
        "DATAPIPE_CACHE_DIR": str(tmp_path / "cache"),
        "DATAPIPE_LID_MODEL": str(lid_model_path()),
        "PYTHONPATH": os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    warm = subprocess.run(
        [sys.executable, "-m", "datapipe.runtime.kernel_warmup"], env=env, capture_output=True, text=True, timeout=600
    )
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert warm.stdout.count(": compiled") == len(kernel_warmup.warm_kernels())  # a fresh cache: all compiled
    assert len(list((tmp_path / "cache" / "numba-warm").iterdir())) == 1  # the stamp a run looks for

    data = tmp_path / "data"
    (data / "pages").mkdir(parents=True)
    (data / "zh.jsonl").write_text(_lines("zh_wikipedia.jsonl", 60), encoding="utf-8")
    (data / "en.jsonl").write_text(_lines("en_wikipedia.jsonl", 60), encoding="utf-8")
    for page in ("eng.html", "cmn_hans.html", "cmn_hant.html", "fra.html", "deu_1996.html"):
        shutil.copy(shared_path("web", "html", "udhr", page), data / "pages")
    bench = shared_path("benchmarks")
    pipeline = write_pipeline(
        tmp_path,
        {
            "name": "every_kernel",
            "sources": [
                {"name": "wiki", "kind": "web", "paths": ["data/*.jsonl"]},
                {"name": "pages", "kind": "web", "paths": ["data/pages"]},
            ],
            "stages": [
                {"langid": {"min_score": 0.0}},
                {"quality": {"rules": "auto"}},
                {"dedup": {"exact": True}},
                {"minhash": {"threshold": 0.7, "fold_script": True}},
                {"boilerplate": {"unit": "line", "min_docs": 2}},
                {
                    "decontaminate": {
                        "benchmarks": [
                            {"name": "gsm8k", "paths": [str(bench / "gsm8k_test.jsonl")], "fields": ["question", "answer"]},
                            {
                                "name": "cmrc2018",
                                "paths": [str(bench / "cmrc2018_dev.jsonl")],
                                "fields": ["context", "question"],
                                "id_field": "id",
                            },
                        ]
                    }
                },
            ],
        },
    )
    proc = subprocess.run(
        [sys.executable, "-c", RUN_AND_COUNT, str(pipeline), str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    compiled = {k: v for k, v in stats.items() if v[1]}
    assert not compiled, f"kernels compiled after the warm-up (declare their signatures: njit(..., warm=[...])): {compiled}"
    used = {k for k, (hits, _) in stats.items() if hits}
    # the run reached each stage's main kernel (script counts, quality, shingles, MinHash, boilerplate,
    # decontamination), so the zero above is no run that skipped them (MinHash's clusters settle in star
    # steps of the shuffle since issue 48: no union-find over a cluster in a run)
    assert {
        "datapipe.stages.cjk:_count_kernel",
        "datapipe.stages.quality._kernels:ngram_signals",
        "datapipe.stages.quality._kernels:char_tokens",
        "datapipe.dedup.shingles:_shingle_kernel_jit",
        "datapipe.dedup.minhash:_affine32_jit",
        "datapipe.stages.boilerplate:_fnv1a_kernel",
        "datapipe.decontaminate.ngrams:_ngram_kernel_jit",
    } <= used, used


def test_the_stamp_makes_the_next_run_skip_the_warm_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAPIPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    first = kernel_warmup.start()
    assert first is not None and first.wait()
    assert first.stamp.is_file() and first.stamp == kernel_warmup.stamp_path()
    indexes = list((tmp_path / "numba").rglob("*.nbi"))
    assert len(indexes) >= len(kernel_warmup.warm_kernels()), indexes
    assert kernel_warmup.start() is None  # stamped: nothing to do, numba not even imported
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "other"))  # another cache: not warm there
    assert kernel_warmup.stamp_path() != first.stamp


def test_a_stamp_that_cannot_be_written_never_fails_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "numba-warm").write_text("a file where the stamps' folder goes")  # mkdir fails, even as root
    monkeypatch.setenv("DATAPIPE_CACHE_DIR", str(cache))
    # numba's own cache, as every run uses it (compiled by this session's runs, or here): whether the
    # warm-up compiles or loads, the stamp is written after it the same way (the test above compiles)
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    warmup = kernel_warmup.start()
    assert warmup is not None and warmup.wait()  # warmed up; no stamp, and nothing raised
    assert not warmup.stamp.exists()
    again = kernel_warmup.start()  # so the next run warms up again (loading from the cache: quick)
    assert again is not None and again.wait()
