"""The run summary as a log shows it (stdout not a terminal): tables fitted to a log's width with the
top drop reasons and how many more, and what the stages that change documents did; the counts come
from the run record (engine/finish.py's collect_counts), never from the corpus."""

from __future__ import annotations

from pathlib import Path

import pytest

from datapipe.cli.summary import TOP_REASONS, print_summary
from datapipe.engine.runner import RunResult
from tests.support.summary_table import stage_rows


def _counts() -> dict:
    # The quality stage of a real run drops for dozens of rules (3,231 characters on one row before).
    reasons = {f"gopher_repetition:dup_{n}gram_char_frac_over_the_threshold": 1000 - n for n in range(40)}
    return {
        "documents": 100_000,
        "kept": 60_000,
        "rejected": 40_000,
        "stages": [
            {"position": 0, "stage": "read", "in": 100_000, "rejected": {}},
            {"position": 1, "stage": "quality", "in": 100_000, "rejected": reasons},
            {
                "position": 2,
                "stage": "pii",
                "in": 80_000,
                "rejected": {},
                "changed": 1_234,
                "edits": [
                    {"signal": "pii_email", "what": "emails replaced", "total": 2_345},
                    {"signal": "pii_phone", "what": "phones replaced", "total": 0},
                    {"signal": "pii_ip", "what": "IPs replaced", "total": 17},
                ],
            },
            {
                "position": 3,
                "stage": "boilerplate",
                "in": 80_000,
                "rejected": {"boilerplate_only": 12},
                "changed": 4_321,
                "edits": [
                    {"signal": "lines_removed", "what": "lines removed", "total": 43_210},
                    {"signal": "chars_removed", "what": "chars removed", "total": 2_310_455},
                ],
            },
        ],
        "sources": {"web": {"documents": 100_000, "kept": 60_000, "tokens": 123_456_789}},
    }


def test_summary_in_a_log_fits_and_says_what_stages_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    print_summary(RunResult(tmp_path / "run", {"counts": _counts()}))  # stdout captured: not a terminal
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines()) <= 200
    rows = stage_rows(text)
    quality = rows["quality"]["by reason"]
    assert quality.startswith("gopher_repetition:dup_0gram_char_frac_over_the_threshold1,000,")  # most frequent first
    assert "dup_3gram" not in quality and quality.endswith(f"…{40 - TOP_REASONS}more")
    assert rows["pii"]["changed"] == "1,234docs:2,345emailsreplaced,17IPsreplaced"  # nothing said of 0 phones
    assert rows["boilerplate"]["changed"] == "4,321docs:43,210linesremoved,2,310,455charsremoved"
    assert rows["quality"]["changed"] == "-"
    assert 'funnel"' in text and '"select * from stage_edits"' in text and "123,456,789" in text


def test_a_run_recorded_before_stages_counted_edits_still_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    counts = _counts()
    for stage in counts["stages"]:
        stage.pop("changed", None), stage.pop("edits", None)
    print_summary(RunResult(tmp_path / "run", {"counts": counts}))
    text = capsys.readouterr().out
    assert stage_rows(text)["pii"]["changed"] == "-" and "stage_edits" not in text
