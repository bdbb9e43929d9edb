"""The stored ``documents`` view names a run's files by folder and name ending (``folder_globs``), so its
text stays O(sources x stages) at any number of files, and names a file by its path wherever a pattern
would match anything but exactly one group's files (a stray file, two layouts in one folder)."""

from __future__ import annotations

from pathlib import Path

from datapipe.audit.documents import folder_globs


def _touch(root: Path, *paths: str) -> None:
    for rel in paths:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"")


def test_a_source_and_a_stage_of_it_are_one_pattern_each(tmp_path: Path) -> None:
    kept = [f"docs/web/{i:05d}.parquet" for i in range(50)] + ["docs/web/00050.part0001.parquet"]
    rejected = [f"rejected/web/{i:05d}.03-minhash.parquet" for i in range(40)]
    short = [f"rejected/web/{i:05d}.04-length.parquet" for i in range(7)]
    _touch(tmp_path, *kept, *rejected, *short, "docs/web/00001.parquet.tmp-12-abcdef01")  # a temporary file: no match
    got = folder_globs(tmp_path, {(0, "kept"): kept, (1, "rejected"): rejected, (2, "rejected"): short})
    assert got == {
        (0, "kept"): ["docs/web/*.parquet"],
        (1, "rejected"): ["rejected/web/*.03-minhash.parquet"],
        (2, "rejected"): ["rejected/web/*.04-length.parquet"],
    }


def test_files_a_pattern_would_mix_up_are_listed(tmp_path: Path) -> None:
    kept = [f"docs/web/{i:05d}.parquet" for i in range(5)]
    other_layout = ["docs/web/00005.parquet"]  # same folder and ending, other columns
    code = [f"docs/code/{i:05d}.parquet" for i in range(3)]
    _touch(tmp_path, *kept, *other_layout, *code, "docs/code/99999.parquet")  # a file no marker names
    got = folder_globs(tmp_path, {(0, "kept"): kept + code, (1, "kept"): other_layout})
    assert got == {(0, "kept"): kept + code, (1, "kept"): other_layout}
    code_only = folder_globs(tmp_path, {(0, "kept"): code[:2]})  # one of the folder's files is not in the group
    assert code_only == {(0, "kept"): code[:2]}
