"""`datapipe sql` cannot eat the machine (issue 36): a memory limit, a time limit, bounded output.

Each runaway query runs in its own `datapipe sql` process, on a small run over real en
Wikipedia articles, and must end with one line naming the limit, in bounded time, with the
process's peak resident size (its VmHWM) under the limit
plus the size of the same process running a trivial query (the interpreter, DuckDB, pyarrow,
click, rich: about 110 MB here) plus MARGIN. Without the limits the same processes grew by
gigabytes (the cross join reached 4 GB in 13 to 47 s) or ran for half an hour: a watchdog kills
a child as soon as it passes the bound, so a failing test does not take the machine down.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from datapipe.audit import limits
from datapipe.audit.sql import connect
from datapipe.cli import main
from datapipe.engine.runner import run_pipeline
from datapipe.pipeline.load import load_pipeline
from tests.conftest import write_pipeline
from tests.support.shared_data import shared_path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 300 * 10**6
# Past the limit the guard thread (10 ms period) interrupts the query and DuckDB's threads stop
# at their next vector; runs here went at most 10 MB past limit + overhead. 50 MB leaves room
# for a slower machine without letting a query that ignores the limit through.
MARGIN = 50 * 10**6
MEMORY_ERROR = f"the query used more than the 300 MB memory limit (--memory-limit or {limits.MEMORY_ENV} to raise it)"
CROSS4 = "from documents a, documents b, documents c, documents d"  # 40**4 = 2.56M rows

pytestmark = pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="measures RSS through /proc")


@pytest.fixture(scope="module")
def run40(ray_local, tmp_path_factory) -> Path:
    """A run folder over 40 real articles (documents has 40 rows, with every stats column)."""
    base = tmp_path_factory.mktemp("sqllimits")
    with shared_path("corpus", "en_wikipedia.jsonl").open(encoding="utf-8") as f:
        docs = [json.loads(line) for _, line in zip(range(40), f)]
    (base / "data").mkdir()
    (base / "data" / "wiki.jsonl").write_text(
        "".join(json.dumps({"text": d["text"], "url": d["source"]}, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8"
    )
    pipeline = write_pipeline(
        base,
        {
            "name": "sqllimits",
            "sources": [{"name": "wiki", "kind": "web", "paths": ["data/wiki.jsonl"]}],
            "stages": [{"length": {"min_chars": 1}}],
        },
    )
    run_pipeline(load_pipeline(pipeline), output=base / "out", show_progress=False, log=lambda m: None)
    return base / "out"


# The child's peak RSS is VmHWM, the high-water mark of its own memory map, read by an exit
# handler (and polled, for a child that gets killed). Not ru_maxrss: Linux carries into it the
# RSS of the process that forked the child (this test session's, with Ray: ~260 MB).
PEAK_AT_EXIT = (
    "import atexit, os\natexit.register(lambda: open(os.environ['PEAK_FILE'], 'w').write(open('/proc/self/status').read()))\n"
)


def _hwm(status: str) -> int:
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _child(
    code: str,
    argv: list[str],
    tmp_path: Path,
    env: dict[str, str] | None = None,
    kill_above: int | None = None,
    timeout: float = 120,
) -> tuple[int, str, str, int, float]:
    """Run ``python -c code *argv`` to its end: (exit code, stdout, stderr, peak RSS in bytes, seconds).

    The child is killed past ``timeout`` seconds or once its peak RSS passes ``kill_above``
    bytes (the caller's assertion on the peak then fails).
    """
    out, err, peak_file = tmp_path / "stdout", tmp_path / "stderr", tmp_path / "peak"
    start = time.monotonic()
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(
            [sys.executable, "-c", PEAK_AT_EXIT + code, *argv],
            stdout=o,
            stderr=e,
            cwd=ROOT,
            env={**os.environ, **(env or {}), "PEAK_FILE": str(peak_file)},
        )
    peak = 0

    def watch() -> None:
        nonlocal peak
        while proc.poll() is None:
            try:
                with open(f"/proc/{proc.pid}/status", encoding="ascii") as f:
                    peak = max(peak, _hwm(f.read()))
            except OSError:
                pass
            if time.monotonic() - start > timeout or (kill_above is not None and peak > kill_above):
                proc.kill()
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    watcher.join()
    if peak_file.exists():
        peak = max(peak, _hwm(peak_file.read_text(encoding="ascii")))
    return (proc.returncode, out.read_text(encoding="utf-8"), err.read_text(encoding="utf-8"), peak, time.monotonic() - start)


CLI = "from datapipe.cli import main\nmain()\n"


def _sql(run: Path, *args: str) -> list[str]:
    return ["sql", str(run), *args]


@pytest.fixture(scope="module")
def overhead(run40: Path, tmp_path_factory) -> int:
    """Peak RSS of `datapipe sql` running a trivial query: what the process needs besides the query."""
    code, out, err, peak, _ = _child(CLI, _sql(run40, "select count(*) as n from documents"), tmp_path_factory.mktemp("o"))
    assert code == 0 and "40" in out, err
    assert peak < 250 * 10**6, peak  # about 110 MB; a bound far above it would make the tests below toothless
    return peak


@pytest.mark.parametrize(
    "query, how",
    [
        (f"select * {CROSS4} order by all", "flag"),  # a sort of 2.56M wide rows: GBs
        ("select x % 1000000007 as k, count(*) as n from range(3000000000) t(x) group by all", "env"),  # 1e9 groups
    ],
)
def test_a_runaway_query_ends_at_the_memory_limit(run40: Path, overhead: int, tmp_path: Path, query: str, how: str) -> None:
    bound = LIMIT + overhead + MARGIN
    args, env = (["--memory-limit", "300MB"], None) if how == "flag" else ([], {limits.MEMORY_ENV: "300MB"})
    code, out, err, peak, seconds = _child(CLI, _sql(run40, query, *args), tmp_path, env=env, kill_above=bound)
    assert peak <= bound, f"peak RSS {peak / 1e6:.0f} MB > {bound / 1e6:.0f} MB (killed: rc {code}, {seconds:.1f} s)"
    assert code == 2 and out == "", (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(MEMORY_ERROR) and "Traceback" not in err, err
    assert seconds < 120


def test_run_query_in_a_python_process_stops_at_the_memory_limit(run40: Path, overhead: int, tmp_path: Path) -> None:
    """The library call materialises the result in Python, outside DuckDB's buffer manager: DuckDB's
    memory_limit alone let this process grow past 3 GB with a 1 GB limit; the RSS guard stops it."""
    code = (
        "import sys\nfrom datapipe.audit.sql import AuditError, run_query\n"
        f"try:\n    run_query(sys.argv[1], 'select * {CROSS4}', memory_limit='300MB')\n"
        "except AuditError as exc:\n    print(exc, file=sys.stderr)\n    sys.exit(3)\n"
    )
    bound = LIMIT + overhead + MARGIN
    rc, _, err, peak, seconds = _child(code, [str(run40)], tmp_path, kill_above=bound)
    assert peak <= bound, f"peak RSS {peak / 1e6:.0f} MB > {bound / 1e6:.0f} MB (killed: rc {rc}, {seconds:.1f} s)"
    assert rc == 3 and err.strip() == MEMORY_ERROR, (rc, err)


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_query_that_runs_for_ever_ends_at_the_time_limit(run40: Path, tmp_path: Path, how: str) -> None:
    query = "SELECT * FROM range(10000000000) t(x) ORDER BY x DESC LIMIT 1"  # a top-N: little memory, ~30 min
    args, env = (["--timeout", "5"], None) if how == "flag" else ([], {limits.TIMEOUT_ENV: "5"})
    code, out, err, _, seconds = _child(CLI, _sql(run40, query, *args), tmp_path, env=env, timeout=60)
    assert code == 2 and out == "", (code, out, err, seconds)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].endswith(
        f"the query ran longer than the 5 s time limit (--timeout or {limits.TIMEOUT_ENV} to raise it; 0 for none)"
    ), err
    assert 5 <= seconds < 60


def test_a_result_too_large_to_print_is_cut_with_a_message(run40: Path, overhead: int, tmp_path: Path) -> None:
    query = f"select a.id as a, b.id as b, c.id as c, d.id as d {CROSS4}"  # 2.56M rows, ~1 GB in Python objects
    bound = LIMIT + overhead + MARGIN
    code, out, err, peak, _ = _child(CLI, _sql(run40, query, "--memory-limit", "300MB"), tmp_path, kill_above=bound)
    assert peak <= bound and code == 0, (peak, code, err)
    assert out.rstrip().endswith(
        "(first 200 rows: there are more; --max-rows to show more, --format csv or json to stream them all)"
    ), out[-300:]
    code, out, err, peak, _ = _child(
        CLI, _sql(run40, query, "--memory-limit", "300MB", "--format", "json", "--max-rows", "1000"), tmp_path, kill_above=bound
    )
    assert peak <= bound and code == 0, (peak, code, err)
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 1000 and set(rows[0]) == {"a", "b", "c", "d"}
    assert err.strip() == "note: printed the first 1000 rows only (--max-rows 1000); there are more", err


def test_limits_are_set_before_the_configuration_is_locked(run40: Path) -> None:
    con = connect(run40, memory_limit="300MB")
    try:
        setting = dict(
            con.sql(
                "select name, value from duckdb_settings() where name in ('memory_limit', 'threads', 'enable_progress_bar')"
            ).fetchall()
        )
        assert setting == {"memory_limit": "286.1 MiB", "threads": str(limits.threads()), "enable_progress_bar": "false"}
        for sql in ("SET memory_limit = '100GB'", "SET threads = 64", "RESET memory_limit"):
            with pytest.raises(Exception, match="locked"):
                con.execute(sql)
    finally:
        con.close()


def test_sizes_defaults_and_bad_values() -> None:
    assert [limits.parse_size(s) for s in ("300MB", "2GB", " 1.5 GiB ", "500mb", "1000000")] == [
        300 * 10**6,
        2 * 10**9,
        3 * 2**29,
        500 * 10**6,
        10**6,
    ]
    assert [limits.format_size(n) for n in (300 * 10**6, 2 * 10**9)] == ["300 MB", "2.0 GB"]
    for bad in ("lots", "2 GBs", "-1GB", "10KB", ""):
        with pytest.raises(limits.LimitError):
            limits.parse_size(bad)
    default = limits.default_memory_limit()
    assert 0 < default <= min(limits.MEMORY_CAP, limits.physical_memory() // 4 + 1)
    assert limits.timeout("0") is None and limits.timeout(2.5) == 2.5 and 1 <= limits.threads() <= 4


def test_bad_limits_give_one_line(run40: Path, monkeypatch) -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["sql", str(run40), "select 1", "--memory-limit", "lots"])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].endswith("memory limit 'lots' is not a size such as 500MB, 2GB or 1.5GiB"), res.output
    monkeypatch.setenv(limits.TIMEOUT_ENV, "soon")
    res = runner.invoke(main, ["sql", str(run40), "select 1"])
    assert res.exit_code == 2 and res.output.strip().endswith(": timeout 'soon' is not a number of seconds"), res.output
    monkeypatch.delenv(limits.TIMEOUT_ENV)
    res = runner.invoke(main, ["sql", str(run40), "select 42 as answer", "--memory-limit", "50MB", "--timeout", "30"])
    assert res.exit_code == 0 and "42" in res.output and "(1 row)" in res.output, res.output


def test_ctrl_c_interrupts_the_query_and_exits_130(run40: Path, tmp_path: Path) -> None:
    """SIGINT while DuckDB runs a long join: the query stops within seconds, one line, exit 130
    (before, the process went on 25-36 s after the signal, as long as the query itself)."""
    query = "select count(*) from range(100000000) a(x), range(100000) b(y) where a.x * b.y = -1"  # hours
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    env = {**os.environ, "DATAPIPE_PROGRESS_INTERVAL": "0.5"}  # "sql: query running" lines once the query runs
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen([sys.executable, "-c", CLI, *_sql(run40, query)], stdout=o, stderr=e, cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 120
        while err.read_text(encoding="utf-8").count("query running") < 6:  # 3 s on: past the start-up, the join runs
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.1)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=20)
        waited = time.monotonic() - sent
    finally:
        proc.kill()
    lines = [line for line in err.read_text(encoding="utf-8").splitlines() if "query running" not in line]
    assert code == 130, (code, lines)
    assert lines == ["error: interrupted: the query was stopped (Ctrl-C); nothing was changed"], lines
    assert waited < 5, waited


def test_queries_have_a_time_limit_by_default(monkeypatch) -> None:
    monkeypatch.delenv(limits.TIMEOUT_ENV, raising=False)
    assert limits.timeout() == limits.DEFAULT_TIMEOUT_S == 3600
    assert limits.timeout("0") is None and limits.timeout(0) is None
