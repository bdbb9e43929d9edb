"""A stage and a reader from a separately installed package, found through entry points only.

``tests/plugins/datapipe_toy_plugin`` is a package of its own: the ``shout`` stage (drops documents
containing a word, with the reason ``shouted``) and the ``lines`` format (``.lines`` files, one
document per line). It is pip-installed into a folder of its own and the ``datapipe`` CLI runs in a
subprocess with that folder on PYTHONPATH: nothing in datapipe names either, and Ray workers find
them as the driver does (the installed distribution's entry points). Plugins that cannot be used
are errors naming the entry point and its distribution, without a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from datapipe.audit.sql import connect as connect_stats
from tests.conftest import write_pipeline
from tests.support import plugin_example

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "tests" / "plugins" / "datapipe_toy_plugin"

# Six records: blank lines are none, line 5 is a read reject (not UTF-8), lines 2 and 6 say the word.
LINES = (
    b"A quiet first line of text.\nThis line says FORBIDDEN loudly.\n\nthird line, calm and long enough.\n"
    b"\xff\xfe not utf-8\nforbidden again, forbidden twice\nthe last line\n"
)
KEPT = {"toy/docs.lines#L1", "toy/docs.lines#L4", "toy/docs.lines#L7"}
REJECTED = {
    ("toy/docs.lines#L2", "shout", "shouted"),
    ("toy/docs.lines#L5", "read", "invalid_utf8"),
    ("toy/docs.lines#L6", "shout", "shouted"),
}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy plugin installed with pip into a target folder: no index (no internet), no build
    isolation (setuptools from this environment). Built from a copy, so the build leaves nothing here."""
    tmp = tmp_path_factory.mktemp("plugin")
    source = tmp / "source"
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp / "site"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(target.glob("datapipe_toy_plugin-*.dist-info/entry_points.txt"))
    return target


def _cli(site: list[Path], *args: str) -> subprocess.CompletedProcess[str]:
    paths = [*map(str, site), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    return subprocess.run([sys.executable, "-m", "datapipe.cli", *args], capture_output=True, text=True, env=env, timeout=600)


def _toy_pipeline(folder: Path) -> Path:
    (folder / "docs.lines").write_bytes(LINES)
    return write_pipeline(
        folder,
        {
            "name": "toy",
            "sources": [{"name": "toy", "paths": ["docs.lines"]}],
            "stages": [{"shout": {"word": "forbidden"}}, {"length": {"min_chars": 1}}],
        },
    )


def _check_run(out: Path) -> None:
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "complete"
    counts = run["counts"]
    assert counts["documents"] == 6 == counts["kept"] + counts["rejected"]
    assert (counts["kept"], counts["rejected"]) == (3, 3)
    with connect_stats(out) as con:
        kept = {r[0] for r in con.execute("select id from documents where status = 'kept'").fetchall()}
        rejected = set(con.execute("select id, stage, reason from documents where status = 'rejected'").fetchall())
        counted = con.execute("select id, shout_count from documents where stage is distinct from 'read'").fetchall()
    assert kept == KEPT and rejected == REJECTED
    assert dict(counted)["toy/docs.lines#L6"] == 2  # the stage's signal column reached the audit database


def test_plugin_stage_and_reader_validate_run_in_process_and_explain(installed: Path, tmp_path: Path) -> None:
    pipeline = _toy_pipeline(tmp_path)
    valid = _cli([installed], "validate", str(pipeline))
    assert valid.returncode == 0, valid.stderr[-2000:]
    assert "format lines" in valid.stdout and "stage 0: shout" in valid.stdout  # the format inferred from .lines

    out = tmp_path / "out"
    run = _cli([installed], "run", str(pipeline), "--output", str(out), "--in-process", "--no-progress")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "in this process (no Ray)" in run.stderr
    _check_run(out)

    explained = _cli([installed], "explain", str(out), "toy/docs.lines#L2")
    assert explained.returncode == 0, explained.stderr[-2000:]
    assert "stage: shout" in explained.stdout and "reason: shouted" in explained.stdout
    assert "'forbidden' x1" in explained.stdout

    # Without the plugin installed the same file names an unknown stage type, listing the known ones.
    bare = _cli([], "validate", str(pipeline))
    assert bare.returncode == 2 and "unknown stage type 'shout'" in bare.stderr


@pytest.mark.slow
def test_plugin_stage_and_reader_run_in_ray_workers(installed: Path, tmp_path: Path) -> None:
    pipeline = _toy_pipeline(tmp_path)
    out = tmp_path / "out"
    run = _cli([installed], "run", str(pipeline), "--output", str(out), "--ray", "--num-cpus", "2", "--no-progress")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "in this process" not in run.stderr
    _check_run(out)
    explained = _cli([installed], "explain", str(out), "toy/docs.lines#L6")
    assert explained.returncode == 0 and "reason: shouted" in explained.stdout and "'forbidden' x2" in explained.stdout


def _fake_distribution(site: Path, entry_points: str, modules: dict[str, str] | None = None) -> None:
    """An installed distribution as importlib.metadata sees one: its dist-info folder and modules."""
    info = site / "broken_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    for name, text in (modules or {}).items():
        (site / f"{name}.py").write_text(text)


SUFFIX_THIEF = (
    "from datapipe.readers.spec import ReaderSpec\n"
    "SPEC = ReaderSpec('tables', lambda file, batch_size: iter(()), suffixes=('.jsonl',))\n"
)


@pytest.mark.parametrize(
    "entry_points,modules,stage,expected",
    [
        (
            "[datapipe.stages]\nshout2 = no_such_module:Shout\n",
            None,
            "shout2",
            "stages[0].shout2: entry point 'shout2' = 'no_such_module:Shout' in group 'datapipe.stages' of distribution "
            "broken-plugin 1.0 failed to load: ModuleNotFoundError: No module named 'no_such_module'",
        ),
        (
            "[datapipe.stages]\nlength = no_such_module:Length\n",
            None,
            "length",
            "entry point 'length' = 'no_such_module:Length' in group 'datapipe.stages' of distribution broken-plugin 1.0 "
            "clashes with the built-in stage 'length'",
        ),
        (
            "[datapipe.readers]\njsonl = no_such_module:SPEC\nwet2 = no_such_module:SPEC\n",
            None,
            "length",
            "entry point 'jsonl' = 'no_such_module:SPEC' in group 'datapipe.readers' of distribution broken-plugin 1.0 "
            "clashes with the built-in format 'jsonl'",
        ),
        (
            "[datapipe.readers]\ntables = suffix_thief:SPEC\n",
            {"suffix_thief": SUFFIX_THIEF},
            "length",
            "reader 'tables' (entry point 'tables' = 'suffix_thief:SPEC' in group 'datapipe.readers' of distribution "
            "broken-plugin 1.0) and built-in reader 'jsonl' both claim the suffix '.jsonl'",
        ),
    ],
    ids=["import_fails", "stage_clash", "format_clash", "suffix_clash"],
)
def test_unusable_plugins_are_errors_naming_the_entry_point(
    tmp_path: Path, entry_points: str, modules: dict[str, str] | None, stage: str, expected: str
) -> None:
    site = tmp_path / "site"
    _fake_distribution(site, entry_points, modules)
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    pipeline = write_pipeline(tmp_path, {"name": "t", "sources": [{"name": "s", "paths": ["a.jsonl"]}], "stages": [{stage: {}}]})
    proc = _cli([site], "validate", str(pipeline))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    if "wet2" in entry_points:  # every problem at once, not the first only
        assert "entry point 'wet2' = 'no_such_module:SPEC'" in proc.stderr


def test_the_plugin_page_example_runs_as_a_plugin(tmp_path: Path) -> None:
    """docs/plugins.md's example stage, installed as the page says (its module and one entry point),
    validates, runs and drops the shouted document with its reason and signal."""
    site = tmp_path / "site"
    ex = plugin_example
    _fake_distribution(site, f"[datapipe.stages]\n{ex.NAME} = {ex.MODULE}:{ex.CLASS}\n", {ex.MODULE: ex.example_code()})
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in ex.DOCS))
    pipeline = write_pipeline(
        tmp_path,
        {"name": "ex", "sources": [{"name": "s", "paths": ["docs.jsonl"]}], "stages": [{ex.NAME: {"max_upper": 0.6}}]},
    )
    valid = _cli([site], "validate", str(pipeline))
    assert valid.returncode == 0 and f"stage 0: {ex.NAME}" in valid.stdout, valid.stderr[-2000:]
    out = tmp_path / "out"
    run = _cli([site], "run", str(pipeline), "--output", str(out), "--in-process", "--no-progress")
    assert run.returncode == 0, run.stderr[-2000:]
    with connect_stats(out) as con:
        rows = con.execute("select id, status, stage, reason, upper_frac from documents order by id").fetchall()
    line = {d["id"]: f"s/docs.jsonl#L{i}" for i, d in enumerate(ex.DOCS, start=1)}  # ids name the input line
    got = {r[0]: r[1:] for r in rows}
    assert got[line["loud"]][:3] == ("rejected", ex.NAME, "shouting") and got[line["loud"]][3] > 0.9, rows
    assert got[line["calm"]][0] == got[line["mixed"]][0] == "kept" and got[line["mixed"]][3] < 0.6, rows
