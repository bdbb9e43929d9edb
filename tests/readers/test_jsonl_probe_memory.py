"""``datapipe validate`` probes the first records of a JSONL for the text field; on a small gzip
holding one enormous line it must stay within ``limits.max_record_bytes`` as the reader does
(issue 37, item 6: a 1.5 MB gzip of one 1.5 GiB line took validate to 3.5 GiB)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.shared_data import PROJECT_ROOT, shared_path

LINE_MIB = 400

# The peak is VmHWM, this process's own high-water mark: ru_maxrss survives fork and exec on Linux,
# so a child of a large pytest process would report the parent's size.
PROBE = """
import sys
from datapipe.cli import main
try:
    main.main(["validate", sys.argv[1]])
except SystemExit as e:
    print("RC", e.code)
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print("PEAK_MIB", int(hwm.split()[1]) // 1024)
"""


def _huge_line_gzip(path: Path) -> None:
    """Real Wikipedia text repeated into one JSON line of LINE_MIB MiB, then ordinary real records."""
    with shared_path("corpus", "en_wikipedia.jsonl").open(encoding="utf-8") as f:
        records = [json.loads(next(f)) for _ in range(5)]
    text = " ".join(r["text"] for r in records).encode("utf-8")
    block = (text * (-(-(1 << 20) // len(text))))[: 1 << 20].replace(b'"', b"'").replace(b"\\", b"/")
    block = block.decode("utf-8", "ignore").encode("utf-8")
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(b'{"text": "')
        for _ in range(LINE_MIB):
            out.write(block)
        out.write(b'", "source": "repeated"}\n')
        for r in records:
            out.write(json.dumps(r, ensure_ascii=False).encode("utf-8") + b"\n")


@pytest.mark.slow  # writes and decompresses hundreds of MiB: tens of seconds on a loaded machine
def test_validate_probe_of_a_gzip_with_one_huge_line_stays_bounded(tmp_path: Path) -> None:
    data = tmp_path / "huge.jsonl.gz"
    _huge_line_gzip(data)
    assert data.stat().st_size < 64 << 20  # small on disk, LINE_MIB MiB decompressed
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(
        yaml.safe_dump(
            {
                "name": "probe",
                "sources": [{"name": "en", "kind": "web", "paths": [str(data)], "text_field": "body"}],
                "stages": [{"length": {"min_chars": 10}}],
                "limits": {"max_record_bytes": 16 << 20},
            }
        ),
        encoding="utf-8",
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", PROBE, str(pipeline)], capture_output=True, text=True, env=env, timeout=600)
    assert "PEAK_MIB" in proc.stdout, proc.stderr[-3000:]
    peak = int(proc.stdout.split("PEAK_MIB")[-1])
    assert peak < 400, f"validate peaked at {peak} MiB for a {LINE_MIB} MiB line"
    # The probe reads at most 256 MiB: the huge line is skipped within that, so it cannot
    # tell whether "body" is a field and leaves it to the reader (each record then a reject).
    assert "RC 0" in proc.stdout and "is valid" in proc.stdout, proc.stdout + proc.stderr


def test_probe_skips_a_long_first_line_and_reads_the_records_after_it(tmp_path: Path) -> None:
    from datapipe.readers.jsonl import first_fields

    data = tmp_path / "long-first.jsonl.gz"
    with shared_path("corpus", "zh_wikipedia.jsonl").open("rb") as f:
        lines = [next(f) for _ in range(3)]
    with gzip.open(data, "wb") as out:
        out.write(b'{"body": "' + b"x" * (3 << 20) + b'"}\n' + b"".join(lines))
    assert first_fields(data, 1 << 20) == set(json.loads(lines[0]))  # the 3 MiB line is over the cap
    assert first_fields(data, 4 << 20) == set(json.loads(lines[0])) | {"body"}
