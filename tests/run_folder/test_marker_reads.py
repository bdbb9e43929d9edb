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


def test_cached_markers_share_equal_column_lists_and_keep_the_others(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    a = [["id", "string"], ["text", "string"]]
    b = [["id", "string"], ["score", "double"]]  # the same length, another layout

    def marker(*layouts: list[list[str]]) -> dict:
        return {"docs_in": 1, "audit_files": [{"path": f"docs/{i}.parquet", "columns": c} for i, c in enumerate(layouts)]}

    _write(folder, "map0", "src/00000", json.dumps(marker(a, b)))
    read = folder.markers.read_all("map0")["src/00000"]["audit_files"]
    adopted = folder.markers.adopt("map0", "src/00001", json.dumps(marker(b, a), sort_keys=True).encode())
    given = folder.markers.adopt("map0", "src/00002", marker(a))  # a dict, as an executor may hand it over
    assert adopted is not None and given is not None
    assert [f["columns"] for f in adopted["audit_files"]] == [b, a] and given["audit_files"][0]["columns"] == a
    assert adopted["audit_files"][0]["columns"] is read[1]["columns"]  # one list per layout in the cache
    assert adopted["audit_files"][1]["columns"] is read[0]["columns"] is given["audit_files"][0]["columns"]
    assert folder.markers.read("map0", "src/00001") is adopted  # cached: never read back
