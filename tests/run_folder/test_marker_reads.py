"""The driver's marker reads: one listing per phase, nested task keys, cached once read, forgotten
when their work is discarded."""

from __future__ import annotations

import json
from pathlib import Path

from datapipe.run_folder.integrity import Damage, discard
from datapipe.run_folder.layout import RunFolder


def _write(folder: RunFolder, phase: str, key: str, body: str) -> Path:
    path = folder.markers.path(phase, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    return path


def test_read_markers_lists_a_phase_once_and_keeps_what_it_read(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    keys = [f"src/{i:05d}" for i in range(40)] + ["other/a.jsonl.part0001"]
    for i, key in enumerate(keys):
        _write(folder, "map0", key, json.dumps({"docs_in": i}))
    _write(folder, "map0", "src/broken", "{not json")  # unreadable: its task is redone
    _write(folder, "map0", "src/00001.tmp-123-0a1b2c3d.json", "{}")  # a killed writer's temporary file
    _write(folder, "map1", "src/00000", json.dumps({"docs_in": 99}))

    markers = folder.markers.read_all("map0")
    assert sorted(markers) == sorted(keys)
    assert [markers[k]["docs_in"] for k in keys] == list(range(len(keys)))
    assert folder.markers.read_all("map9") == {}

    _write(folder, "map0", keys[0], json.dumps({"docs_in": -1}))  # markers never change once written
    assert folder.markers.read_all("map0")[keys[0]]["docs_in"] == 0
    assert folder.markers.read("map0", keys[0]) == {"docs_in": 0}
    _write(folder, "map0", "src/late", json.dumps({"docs_in": 7}))  # a task finished meanwhile
    assert folder.markers.read_all("map0")["src/late"] == {"docs_in": 7}

    discard(folder, [Damage("map0", keys[0], "docs/src/00000.parquet", "missing")], log=lambda _: None)
    assert keys[0] not in folder.markers.read_all("map0") and folder.markers.read("map0", keys[0]) is None
    _write(folder, "map0", keys[0], json.dumps({"docs_in": 5}))  # the task redone
    assert folder.markers.read_all("map0")[keys[0]] == {"docs_in": 5}


def test_the_driver_keeps_what_planning_reads_and_reads_the_rest_back_at_the_end(tmp_path: Path) -> None:
    """A marker's audit index, input reads and counts per stage are read once, at the end of the run
    (``read_all(full=True)``): the driver keeps counts, files and node per task (issue 48 item 6)."""
    folder = RunFolder(tmp_path)
    a = [["id", "string"], ["text", "string"]]

    def marker(i: int) -> dict:
        return {
            "docs_in": i,
            "files": [{"path": f"_work/map0/{i}.parquet", "bytes": 10}],
            "node": "n1",
            "audit_files": [{"path": f"docs/{i}.parquet", "columns": a}],
            "reads": [{"path": "in.jsonl", "size": 3}],
            "stage_in": {"0": i},
            "rejected": {"0": {"short": 1}},
            "cpu_seconds": 0.5,
        }

    _write(folder, "map0", "src/00000", json.dumps(marker(0)))
    _write(folder, "map0", "src/00001", json.dumps(marker(1), sort_keys=True))  # as its task wrote it, then handed it back
    adopted = folder.markers.adopt("map0", "src/00001", json.dumps(marker(1), sort_keys=True).encode())
    assert adopted is not None and adopted["audit_files"][0]["columns"] == a  # the caller gets it whole
    held = folder.markers.read_all("map0")
    assert held == {
        k: {"docs_in": i, "files": marker(i)["files"], "node": "n1"} for i, k in enumerate(("src/00000", "src/00001"))
    }
    assert folder.markers.read("map0", "src/00001") is held["src/00001"]  # cached: never read back
    whole = folder.markers.read_all("map0", full=True)
    assert whole == {"src/00000": marker(0), "src/00001": marker(1)}
    assert folder.markers.read_all("map0") == held  # the full read is not kept


def test_a_sealed_phase_is_read_from_what_is_held_without_listing_until_its_work_is_discarded(tmp_path: Path) -> None:
    """Once a phase ran without failures the driver holds every marker of it (listed at its start, the rest
    adopted): planning the next phases reads it without listing its folder again (issue 48: a listing is
    O(the phase's tasks), and planning asks many times); discarding work lists it again."""
    folder = RunFolder(tmp_path)
    _write(folder, "map0", "src/00000", json.dumps({"docs_in": 1}))
    assert sorted(folder.markers.read_all("map0")) == ["src/00000"]  # the phase starts: one listing
    for key, n in (("src/00002", 3), ("src/00001", 2)):  # each task writes its marker, the driver adopts it
        folder.markers.adopt("map0", key, _write(folder, "map0", key, json.dumps({"docs_in": n})).read_bytes())
    folder.markers.seal("map0")
    _write(folder, "map0", "src/00009", json.dumps({"docs_in": 9}))  # behind the driver's back: not listed
    assert list(folder.markers.read_all("map0")) == ["src/00000", "src/00001", "src/00002"]  # in listing order
    assert "src/00009" in folder.markers.read_all("map0", full=True)  # the end of the run reads the folder

    discard(folder, [Damage("map0", "src/00000", "docs/src/00000.parquet", "missing")], log=lambda _: None)
    assert sorted(folder.markers.read_all("map0")) == ["src/00001", "src/00002", "src/00009"]  # listed again
