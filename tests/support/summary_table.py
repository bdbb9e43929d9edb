"""The cells of the run summary's stage table (datapipe/cli/summary.py), read back from its text."""

from __future__ import annotations

COLUMNS = ("#", "stage", "in", "skipped", "kept", "dropped", "by reason", "changed")


def stage_rows(text: str) -> dict[str, dict[str, str]]:
    """Stage name -> column -> cell. A cell folded over lines is joined, and its spaces are left out:
    where a line breaks is the table's business, not the test's."""
    rows: dict[str, list[str]] = {}
    last: list[str] = []
    for line in text.splitlines():
        cells = [c.replace(" ", "") for c in line.split("│")[1:-1]]
        if len(cells) != len(COLUMNS):  # borders, titles, the per-source table
            continue
        if cells[0]:
            last = rows.setdefault(cells[1], cells)
        else:
            for i, c in enumerate(cells):
                last[i] += c
    return {name: dict(zip(COLUMNS, cells)) for name, cells in rows.items()}
