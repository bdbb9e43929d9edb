"""A run read as a log (stdout and stderr to files, as on a cluster, in CI or under nohup): every line
fits a log (at most 200 characters, however many drop reasons the quality stage has), a long phase
prints progress lines at a steady interval, and the summary says what the stages that change
documents did (pii's replacements, boilerplate's lines), in the numbers the audit database has.

Real data: TiDB docs (emails, IP addresses, a template repeated across pages), Chinese Wikipedia and
the Data-Juicer English samples (many quality rules fire) from ../shared/data."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from datapipe.audit.sql import connect as connect_stats
from tests.support.shared_data import shared_path
from tests.support.summary_table import stage_rows

ROOT = Path(__file__).resolve().parents[2]
MAX_LINE = 200
INTERVAL_S = 0.5  # DATAPIPE_PROGRESS_INTERVAL for the run: short, so the test is fast


def _pipeline(tmp_path: Path) -> Path:
    corpus, en = shared_path("corpus"), shared_path("en")
    data = tmp_path / "data"
    data.mkdir()
    # TiDB pages 80-139 hold an email address (page 118) and IP addresses.
    for name, start, stop in (("zh_pingcap_docs.jsonl", 80, 140), ("zh_wikipedia.jsonl", 0, 30)):
        with (corpus / name).open(encoding="utf-8") as f:
            (data / name).write_text("".join(itertools.islice(f, start, stop)), encoding="utf-8")
    english = [str(p) for p in sorted(en.glob("datajuicer_*.jsonl"))]
    pipeline = tmp_path / "logs.yaml"
    pipeline.write_text(
        f"""name: logs
sources:
  - {{name: tidb, kind: web, paths: ["data/zh_pingcap_docs.jsonl"]}}
  - {{name: zh_wiki, kind: web, paths: ["data/zh_wikipedia.jsonl"]}}
  - {{name: en_web, kind: web, paths: {english!r}}}
stages:
  - langid: {{keep: [zh, en], min_score: 0.3}}
  - length: {{min_chars: 50}}
  - quality: {{rules: auto}}
  - pii: {{}}
  - dedup: {{exact: true}}
  - boilerplate: {{min_docs: 5}}
""",
        encoding="utf-8",
    )
    return pipeline


def test_a_run_logged_to_files_has_short_lines_progress_and_what_stages_changed(tmp_path: Path) -> None:
    pipeline, out, pause = _pipeline(tmp_path), tmp_path / "out", tmp_path / "pause"
    stdout, stderr = tmp_path / "stdout.log", tmp_path / "stderr.log"
    env = {
        **os.environ,
        "DATAPIPE_PROGRESS_INTERVAL": str(INTERVAL_S),
        # The driver waits after the first map task until `pause` exists: a phase as long as the test
        # wants, without a timed phase that load could shorten or lengthen.
        "DATAPIPE_FAULT_PAUSE_AT": "map0:1",
        "DATAPIPE_FAULT_PAUSE_FILE": str(pause),
    }
    cmd = [sys.executable, "-m", "datapipe.cli", "run", str(pipeline), "-o", str(out), "--in-process"]
    with stdout.open("w") as o, stderr.open("w") as e:
        proc = subprocess.Popen(cmd, stdout=o, stderr=e, cwd=ROOT, env=env)
        try:
            deadline = time.time() + 300
            while not Path(f"{pause}.paused").exists():
                assert proc.poll() is None and time.time() < deadline, stderr.read_text()
                time.sleep(0.05)
            # While the phase is held, lines keep coming: three of them take ~1.5 s at 0.5 s apart.
            held = re.compile(r"^map: langid, length, quality, pii, dedup: 1/\d+ shards, .*\d+s elapsed")
            deadline = time.time() + 60
            while sum(bool(held.match(line)) for line in stderr.read_text().splitlines()) < 3:
                assert proc.poll() is None, stderr.read_text()
                assert time.time() < deadline, f"no progress lines while map0 ran:\n{stderr.read_text()}"
                time.sleep(0.1)
        finally:
            pause.touch()
            proc.wait(timeout=600)
    log, err = stdout.read_text(encoding="utf-8"), stderr.read_text(encoding="utf-8")
    assert proc.returncode == 0, err

    long_lines = [line for line in (log + err).splitlines() if len(line) > MAX_LINE]
    assert not long_lines, f"{len(long_lines)} lines longer than {MAX_LINE} characters, the longest {max(map(len, long_lines))}"

    # The progress line says what it knows: tasks done of all, documents so far, elapsed time, ETA.
    line = next(line for line in err.splitlines() if held.match(line))
    assert re.match(r"map: [a-z, ]+: 1/(\d+) shards, [\d,]+ docs \([\d,]+ docs/s\), \d+s elapsed, ETA \d+", line), line
    # Every phase is named by its stage and step (issue 50 item 2), and ends with a line saying so.
    assert re.search(r"^dedup: exact copies by text: \d+/\d+ partitions in ", err, re.M), err
    assert re.search(r"^boilerplate: counting repeated lines: \d+/\d+ partitions in ", err, re.M), err
    assert not re.search(r"^(map|shuffle|reduce)\d", err, re.M), err

    rows = stage_rows(log)
    with connect_stats(out) as con:
        reasons = con.execute("SELECT count(*) FROM funnel WHERE stage = 'quality'").fetchone()[0]
        pii = con.execute(
            "SELECT sum(pii_email), sum(pii_ip), count(*) FILTER (WHERE pii_email + pii_phone + pii_id_card + pii_ip > 0) "
            "FROM documents"  # pii drops nothing: every document with its counts passed it
        ).fetchone()
        lines, chars, docs = con.execute(
            "SELECT sum(lines_removed), sum(chars_removed), count(*) FILTER (WHERE lines_removed > 0 OR chars_removed > 0) "
            "FROM documents WHERE stage IS DISTINCT FROM 'boilerplate'"  # those it dropped kept their text
        ).fetchone()
    # Many drop reasons: the top three, and how many more (the funnel view has them all).
    assert reasons > 4, "the sample should trip many quality rules"
    assert rows["quality"]["by reason"].endswith(f"…{reasons - 3}more")
    emails, ips, changed = pii
    assert emails > 0 and ips > 0 and lines > 0, "the TiDB docs have addresses and a shared template"
    assert (
        rows["pii"]["changed"].startswith(f"{changed:,}docs:{emails:,}emailsreplaced,")
        and f"{ips:,}IPsreplaced" in rows["pii"]["changed"]
    )
    assert rows["boilerplate"]["changed"] == f"{docs:,}docs:{lines:,}linesremoved,{chars:,}charsremoved"
    assert rows["dedup"]["changed"] == "-"  # a stage that changes no document says nothing there
    assert "select * from stage_edits" in log
