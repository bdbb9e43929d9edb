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


def test_naming_a_pack_tasks_inputs_downloads_no_token_file(s3, demo_project: Path, tmp_path: Path) -> None:
    """The driver hands each pack task the names of its token files (``Phase.inputs``): naming them must not
    download them into the driver's mirror (it did: every token file of the run crossed the store to the
    driver, 972 B per document in bench/scaling/store_nodes.py's one-node run, as much as the tokens)."""
    demo = demo_project / "pipelines" / "demo.yaml"
    cfg = yaml.safe_load(demo.read_text(encoding="utf-8"))
    cfg["stages"] = []  # read and tokenize: token files and a pack phase, in seconds
    demo.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    uri = "s3://prune/tokens"
    pipeline = load_pipeline(demo)
    result = run_pipeline(pipeline, output=uri, in_process=True, show_progress=False, log=lambda m: None)
    assert result.run["counts"]["kept"] > 0

    mirror = RunFolder(uri).root
    tokens = mirror / "_work" / "tokens"
    assert not any(tokens.rglob("*.arrow")) if tokens.is_dir() else True  # pruned after packing
    spec = make_spec(pipeline, mirror, tmp_path / "cache")
    pack = next(p for p in plan_phases(spec) if p.name == "pack")
    folder = RunFolder(uri)
    tasks = pack.task_list(folder)
    assert tasks and pack.inputs is not None
    before = s3.snapshot()
    named = [f for t in tasks for f in pack.inputs(t)[0]]
    assert named and all(f.startswith("_work/tokens/") for f in named)
    assert not any(tokens.rglob("*.arrow")) if tokens.is_dir() else True  # named, not fetched
    assert s3.since(before)["GET"] == 0
