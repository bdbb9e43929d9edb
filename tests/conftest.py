"""The test suite's layout, its tiers, and the fixtures every folder shares.

Layout (one folder per concept of ``datapipe/``; every folder is a package, so ``tests.<folder>.<module>``
imports work and basenames may repeat across folders):

    tests/support/      helpers, not tests: shared_data (``shared_path``, ``PROJECT_ROOT``), golden_outputs
                        (``python -m tests.support.golden_outputs --write``), loader_helpers, export_helpers,
                        ingest_helpers, license_layouts/_variants, pii_sample, boilerplate_corpus
    tests/data/, tests/fixtures/   data files (and the scripts that made them)
    tests/<concept>/    unit tests mirroring datapipe/<concept>/: assets, audit, classify, cli, dedup, engine,
                        export, license, loader, pipeline, readers, run_folder, runtime, stages, text,
                        tokens, train; tests/bench/ checks bench/'s harness and README table
    tests/e2e/          whole runs: the demo and real pipelines, resume after SIGKILL, two-node Ray,
                        object storage, golden outputs, ``datapipe run`` in a subprocess
    tests/faults/       fault suites: hostile records and formats, corrupt shards, disk full, node loss
    tests/test_imports.py, tests/test_layout.py   guards on datapipe/'s import graph and file layout

Markers (declared in pyproject.toml; the ones marked * are set here, in pytest_collection_modifyitems):

    e2e*          every test under tests/e2e/, and every test that uses the ``ray_local`` fixture
                  (directly or through another fixture): whole runs in this process on embedded Ray
    faults*       every test under tests/faults/
    ray*          needs Ray: uses ``ray_local``; tests that start Ray in a subprocess carry it themselves
                  and are then slow* as well: no test that starts Ray is in the fast tier
    shared_data*  reads ../shared/data: the test, a fixture it uses, or a tests.* helper they call
                  (followed by name, transitively) calls ``shared_path`` or reads ``SHARED_DATA``
    torch*        names ``torch`` the same way (or is marked by hand: ablate's training through the CLI);
                  skipped, saying why, where torch is not installed
    boto3*        names ``boto3``, ``moto_server`` or ``CountingS3`` (an S3 server on loopback); skipped
                  where boto3 is not installed
    slow*         long on 2 cores: Ray started in a subprocess (resume, two-node, node loss, S3; set here
                  on a ``ray`` test that is not e2e), and whole-corpus sweeps or subprocess matrices
                  (quality kernels, loader corruption)

Tiers:

    python -m pytest -q -n 3 --dist loadfile       everything, in three processes (CI: .ci/run)
    python -m pytest -q -m "not e2e and not slow"  the fast loop: no Ray started, no whole run on Ray;
                                                   needs neither torch, boto3 nor ../shared/data (their
                                                   tests skip without them). A test that takes tens of
                                                   seconds goes to e2e/ or gets marked slow
    python -m pytest -q tests/stages               one folder
    python -m pytest -q -m "not shared_data"       without ../shared/data
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import inspect
import os
import shutil
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from tests.support.shared_data import PROJECT_ROOT

TESTS = Path(__file__).resolve().parent
# tests/<folder>/...: markers every test in the folder gets
FOLDER_MARKERS = {"e2e": ("e2e",), "faults": ("faults",)}
# a test that uses the fixture (directly or through other fixtures) gets the markers
FIXTURE_MARKERS = {"ray_local": ("ray", "e2e")}
# a test whose code, fixtures or tests.* helpers (followed by name, transitively) load one of these
# names gets the marker: ../shared/data (tests/support/shared_data.py), torch, boto3 and moto's S3
NAME_MARKERS = {
    "shared_data": frozenset({"shared_path", "SHARED_DATA"}),
    "torch": frozenset({"torch"}),
    "boto3": frozenset({"boto3", "moto_server", "CountingS3", "counting_s3"}),
}
# optional packages behind a marker: a test that needs one that is not installed is skipped, saying so
OPTIONAL = {
    "torch": ("torch", "torch is not installed (the build for the machine, or pip's default: pip install 'datapipe[ablate]')"),
    "boto3": ("boto3", "boto3 is not installed (pip install 'datapipe[s3]'; the tests' S3 server needs moto[server])"),
}


def pytest_configure(config: pytest.Config) -> None:
    _isolate_xdist_worker()


def _isolate_xdist_worker() -> None:
    """Under pytest-xdist (``-n 3``) each worker process gets its own datapipe cache folder, so the
    embedded Rays keep their session files (sockets, logs) apart. What datapipe builds once and shares
    between processes by design is linked to the base cache: the language-ID model (fetched under a file
    lock), the numba warm-up stamps and the Unicode tables (written whole by rename)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    from datapipe.storage.cache import cache_dir

    base = cache_dir()
    # short: Ray's socket paths must stay under 107 bytes
    mine = Path(tempfile.mkdtemp(prefix=f"dp-{worker}-", dir="/tmp" if os.path.isdir("/tmp") else None))
    for shared in ("models", "numba-warm", "tables"):
        (base / shared).mkdir(parents=True, exist_ok=True)
        (mine / shared).symlink_to(base / shared, target_is_directory=True)
    os.environ["DATAPIPE_CACHE_DIR"] = str(mine)
    # removed at the worker's exit: registered before Ray's own exit handlers, so run after them (Ray's
    # processes write their logs there until they have stopped)
    atexit.register(shutil.rmtree, mine, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            folder = Path(item.path).resolve().relative_to(TESTS).parts[0]
        except ValueError:
            continue
        names = set(FOLDER_MARKERS.get(folder, ()))
        for fixture in getattr(item, "fixturenames", ()):
            names.update(FIXTURE_MARKERS.get(fixture, ()))
        loaded = _names_loaded(item)
        names.update(marker for marker, wanted in NAME_MARKERS.items() if wanted & loaded)
        have = {m.name for m in item.iter_markers()}
        if "ray" in names | have and not {"e2e", "slow"} & (names | have):
            names.add("slow")  # the fast loop starts no Ray: a test that does is slow unless it is e2e
        for name in sorted(names - have):
            item.add_marker(name)
        for marker, (module, reason) in OPTIONAL.items():
            if marker in names | have and not _installed(module):
                item.add_marker(pytest.mark.skip(reason=f"needs {marker}: {reason}"))


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _names_loaded(item: pytest.Item) -> set[str]:
    """Every name the test function and its fixtures load, and those of the functions of tests.*
    modules that those names are bound to, transitively."""
    funcs = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        funcs += [d.func for defs in info.name2fixturedefs.values() for d in defs]
    seen: set[types.CodeType] = set()
    names: set[str] = set()
    for func in funcs:
        if func is not None:
            _collect(func, seen, names)
    return names


def _collect(func: Any, seen: set[types.CodeType], names: set[str]) -> None:
    func = inspect.unwrap(func)
    code = getattr(func, "__code__", None)
    if code is not None and getattr(func, "__module__", "").startswith("tests"):
        _collect_code(code, getattr(func, "__globals__", {}), seen, names)


def _collect_code(code: types.CodeType, namespace: dict[str, Any], seen: set[types.CodeType], names: set[str]) -> None:
    if code in seen:
        return
    seen.add(code)
    names.update(code.co_names)
    for const in code.co_consts:  # nested functions, lambdas, comprehensions
        if isinstance(const, types.CodeType):
            _collect_code(const, namespace, seen, names)
    # names imported inside the function (`from tests.x import f`: "tests.x" and "f" are both in co_names)
    namespaces = [namespace] + [vars(m) for m in map(_tests_module, code.co_names) if m is not None]
    for ns in namespaces:
        for name in code.co_names:
            if callable(ns.get(name)):
                _collect(ns[name], seen, names)


def _tests_module(name: str) -> types.ModuleType | None:
    if not name.startswith("tests."):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


@pytest.fixture(scope="session")
def ray_local():
    """One embedded Ray for the whole session: each run_pipeline call reuses it (starting Ray costs seconds)."""
    from datapipe.engine.executors.ray.runtime import ray_session

    with ray_session(num_cpus=2) as where:
        yield where


def _copy_demo_project(folder: Path) -> Path:
    shutil.copytree(PROJECT_ROOT / "pipelines", folder / "pipelines")
    shutil.copytree(PROJECT_ROOT / "tokenizer", folder / "tokenizer")
    return folder


@pytest.fixture
def demo_project(tmp_path: Path) -> Path:
    """A copy of the demo pipeline, its data and tokenizer, laid out as in the repository."""
    return _copy_demo_project(tmp_path)


class DemoRun(NamedTuple):
    project: Path  # as ``demo_project``: pipelines/demo.yaml, pipelines/demo/data, tokenizer/
    out: Path  # the complete run folder
    result: Any  # the RunResult of the run


@pytest.fixture(scope="session")
def demo_run(ray_local, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    """The demo pipeline run once on the session's Ray, for the tests that only read a complete demo run
    (a run costs seconds; several tests used to make their own). A test that writes into a run folder, or
    reruns it, makes its own run. Teardown fails if any file of the run folder was added, removed or changed."""
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    project = _copy_demo_project(tmp_path_factory.mktemp("demo_run"))
    out = project / "out"
    result = run_pipeline(load_pipeline(project / "pipelines" / "demo.yaml"), output=out, show_progress=False, log=lambda m: None)
    before = _files(out)
    yield DemoRun(project, out, result)
    after = _files(out)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"a test wrote into the shared demo run (use its own run): {changed}"


@pytest.fixture(scope="session")
def view_runs(tmp_path_factory: pytest.TempPathFactory):
    """Two small real-data runs for the ``datapipe view`` tests (tests/support/view_runs.py): built once per
    test process, in process (no Ray), read only."""
    from tests.support.view_runs import build_view_runs

    return build_view_runs(tmp_path_factory.mktemp("view_runs"))


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def write_pipeline(folder: Path, config: dict[str, Any], name: str = "pipeline.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(config, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path
