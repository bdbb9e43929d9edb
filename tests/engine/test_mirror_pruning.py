"""A remote run folder's mirror keeps only what later phases still read (issue 48 item 9): each
``_work/`` folder that ``prune_after`` names is deleted from the node's mirror once the phase after
which nothing reads it is done, while the store keeps it (a resumed run reads it there). On a
loopback S3 server (moto).

If a later phase did read a pruned folder, the mirror would fetch it again and it would be there at
the end: the test sees that too."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from datapipe.engine.phases import plan_phases, prune_after
from datapipe.engine.plan import make_spec
from datapipe.engine.runner import run_pipeline
from datapipe.pipeline.load import load_pipeline
from datapipe.run_folder.layout import RunFolder
from datapipe.storage import uri as storage
from tests.support.counting_s3 import serve_for_test

pytest.importorskip("boto3")
pytest.importorskip("moto.server", reason="needs moto[server] (the test extras)")


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from datapipe.assets.models import lid_model_path

    monkeypatch.setenv("DATAPIPE_LID_MODEL", str(lid_model_path()))  # before the cache moves
    server = serve_for_test(monkeypatch, tmp_path / "cache", "prune")
    yield server
    server.stop()


def test_the_mirror_drops_work_folders_no_later_phase_reads(s3, demo_project: Path, tmp_path: Path) -> None:
    demo = demo_project / "pipelines" / "demo.yaml"
    cfg = yaml.safe_load(demo.read_text(encoding="utf-8"))
    # Exact dedup alone, over several partitions: a shuffle's every kind of scratch folder, in seconds.
    cfg["stages"] = [{"dedup": {"exact": True, "partitions": 4}}]
    cfg.pop("tokenize", None)
    demo.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    uri = "s3://prune/run"
    pipeline = load_pipeline(demo)
    result = run_pipeline(pipeline, output=uri, in_process=True, show_progress=False, log=lambda m: None)
    assert result.run["counts"]["documents"] > 0

    mirror = RunFolder(uri).root
    spec = make_spec(pipeline, mirror, tmp_path / "cache")
    dead = {rel for rels in prune_after(spec).values() for rel in rels}
    prefix = storage.child(uri, "")
    on_store = {"/".join(f.uri[len(prefix) :].split("/")[:2]) for f in storage.list_files(storage.child(uri, "_work"))}
    # The map outputs, the shuffle's runs and its partitions' outputs are named.
    assert {"_work/map0", "_work/shuffle0", "_work/reduce0-parts"} <= dead & on_store
    left = {p.relative_to(mirror).as_posix() for p in (mirror / "_work").iterdir()} if (mirror / "_work").is_dir() else set()
    assert not left & dead, sorted(left & dead)  # deleted, and never fetched back by a later phase
    assert (dead & on_store) - left  # the store keeps them
    phases = {p.name for p in plan_phases(spec)}
    assert set(prune_after(spec)) <= phases  # each pruned after a phase the run has
