"""Object storage end to end, on a real S3 server on loopback (moto's ThreadedMotoServer).

Inputs and the run folder on S3 give the same outputs as the same pipeline run locally; a driver
killed mid-run resumes from the store alone (its local mirror deleted) with byte-identical shards
and the same documents table; `datapipe sql`, `datapipe export` and the loader read the run
folder on S3.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest
import yaml

from datapipe.engine import aggregate_tree
from tests.e2e.test_resume import fingerprint
from tests.support.counting_s3 import CountingS3
from tests.support.shared_data import PROJECT_ROOT

pytestmark = pytest.mark.slow

moto_server = pytest.importorskip("moto.server", reason="needs moto[server] (the test extras)")
boto3 = pytest.importorskip("boto3")

BUCKET = "datapipe-test"
DEMO = PROJECT_ROOT / "pipelines" / "demo.yaml"
DATA = PROJECT_ROOT / "pipelines" / "demo" / "data"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A loopback S3 server with the demo inputs in s3://BUCKET/data/, and the environment to reach it."""
    from datapipe.assets.models import lid_model_path

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    lid = lid_model_path()  # before the cache moves: the mirrors go to a temporary cache, the model stays
    server = CountingS3()  # moto's S3 on loopback, counting what it answers (test_partition_reads_...)
    env = {
        "AWS_ENDPOINT_URL": server.url,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "DATAPIPE_CACHE_DIR": str(tmp_path_factory.mktemp("cache")),
        "DATAPIPE_LID_MODEL": str(lid),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        for f in sorted(DATA.glob("*.jsonl")):
            client.upload_file(str(f), BUCKET, f"data/{f.name}")
        client.counting = server  # type: ignore[attr-defined]
        yield client
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


def pipeline_file(folder: Path, data: str, output: str, partitions: int | None = None, partition_rows: int | None = None) -> Path:
    """The demo pipeline with its inputs under ``data`` (a folder or a URI) and its run folder at
    ``output``; ``partitions``: of its dedup and minhash stages (default auto: one per map task);
    ``partition_rows``: ``split.partition_rows`` (rows a partition task holds)."""
    cfg = yaml.safe_load(DEMO.read_text(encoding="utf-8"))
    if partition_rows is not None:
        cfg.setdefault("split", {})["partition_rows"] = partition_rows
    for stage in cfg["stages"]:
        for kind in ("dedup", "minhash"):
            if kind in stage and partitions is not None:
                stage[kind]["partitions"] = partitions
    cfg["sources"][0]["paths"] = [f"{data}/web_zh-*.jsonl"]
    cfg["sources"][1]["paths"] = [f"{data}/web_en-*.jsonl"]
    cfg["tokenize"]["tokenizer"] = str(PROJECT_ROOT / "tokenizer" / "demo.json")
    cfg["output"] = output
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    return path


def datapipe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "datapipe.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def download_run(client, prefix: str, to: Path) -> Path:
    """Every object of a run folder on S3, copied to ``to`` (to compare it with a local run)."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            if obj["Key"].endswith("/"):
                continue  # a folder marker pyarrow leaves when it deletes a folder's last object
            target = to / obj["Key"][len(prefix) + 1 :]
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(BUCKET, obj["Key"], str(target))
    return to


@pytest.fixture(scope="module")
def runs(s3, tmp_path_factory):
    """The demo pipeline in process: once all local, once with inputs and run folder on S3."""
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    tmp = tmp_path_factory.mktemp("runs")
    local = run_pipeline(
        load_pipeline(pipeline_file(tmp / "local", str(DATA), str(tmp / "local-out"))),
        in_process=True,
        show_progress=False,
        log=lambda m: None,
    )
    with pytest.MonkeyPatch.context() as mp:  # its aggregate files merged by a tree of tasks through the store
        mp.setattr(aggregate_tree, "FAN_IN", 2)
        remote = run_pipeline(
            load_pipeline(pipeline_file(tmp / "s3", f"s3://{BUCKET}/data", f"s3://{BUCKET}/runs/full")),
            in_process=True,
            show_progress=False,
            log=lambda m: None,
        )
    return local, remote, tmp


def test_pipeline_with_every_path_on_s3_equals_the_local_run(s3, runs) -> None:
    local, remote, tmp = runs
    assert remote.run["counts"]["documents"] == sum(len(f.read_text().splitlines()) for f in DATA.glob("*.jsonl"))
    counts = remote.run["counts"]
    assert counts["documents"] == counts["kept"] + counts["rejected"] > 0  # conservation
    on_s3 = download_run(s3, "runs/full", tmp / "from-s3")
    assert json.loads((on_s3 / "run.json").read_text())["status"] == "complete"
    expected = fingerprint(local.root)
    assert fingerprint(on_s3) == expected  # shard bytes, docs, rejects, documents table, manifest
    assert expected["shards"] and expected["documents"]
    # the aggregate tables, merged on the store by a tree of tasks (a fan-in of 2), equal the local run's
    assert (on_s3 / "_work" / "markers" / "aggregates2").is_dir() and list((on_s3 / "_work" / "aggregates" / "l1").iterdir())
    assert _agg_tables(on_s3) == _agg_tables(local.root) != {}


def test_an_aggregate_merge_task_on_another_node_fetches_its_inputs_from_the_store(runs, monkeypatch) -> None:
    """A merge task of the aggregate tree on a node that wrote none of its input files: the worker holds
    only what the driver hands it (``Phase.inputs``), so its inputs must be named there to be fetched.
    Simulated in this process: the mirror loses the files, the task's handed entries are installed as a
    worker's, and the task runs again (it failed with "No such file" before the phase named its inputs)."""
    from datapipe.engine.phases import plan_phases
    from datapipe.engine.plan import make_spec
    from datapipe.engine.runner import _handed
    from datapipe.pipeline.load import load_pipeline
    from datapipe.run_folder import remote
    from datapipe.run_folder.layout import RunFolder

    _, result, tmp = runs
    monkeypatch.setattr(aggregate_tree, "FAN_IN", 2)  # as the run had it: its tree's levels and tasks
    uri = f"s3://{BUCKET}/runs/full"
    folder = RunFolder(uri)
    spec = make_spec(load_pipeline(tmp / "s3" / "pipeline.yaml"), folder.root, tmp / "cache")
    phase = next(p for p in plan_phases(spec) if p.name == "aggregates1")
    task = phase.task_list(folder)[0]
    inputs = task.args[3]
    assert len(inputs) == 2
    for rel in inputs:  # another node's mirror: none of them
        (folder.root / rel).unlink()
    held = {name: dict(getattr(remote, name)) for name in ("_named", "_footers", "_given", "_installed")}
    remote.install(uri, [_handed(folder, phase, task)])
    try:
        marker = phase.fn(spec, *task.args)
    finally:
        for name, table in held.items():  # the driver's view back, for the module's other tests
            getattr(remote, name).clear()
            getattr(remote, name).update(table)
    assert marker["inputs"] == 2 and marker["rows"] > 0
    assert all((folder.root / rel).is_file() for rel in inputs)  # fetched from the store


def _agg_tables(root: Path) -> dict[str, list[tuple]]:
    with duckdb.connect(str(root / "stats.duckdb"), read_only=True) as con:
        names = [
            r[0] for r in con.execute("select table_name from duckdb_tables() where starts_with(table_name, 'agg_')").fetchall()
        ]
        return {n: sorted(con.execute(f'select * from "{n}"').fetchall(), key=repr) for n in sorted(names)}


def test_partition_tasks_on_another_node_read_only_their_row_groups_from_the_store(s3, tmp_path, monkeypatch) -> None:
    """A node that wrote none of a shuffle's files (an empty cache folder: another machine's mirror)
    runs one partition of each shuffle of the finished S3 run: it reads its row groups of the round's
    files and the map outputs' rows it needs in place, so far fewer bytes than those files hold cross
    the store, nothing of them lands in its mirror, and its output is the run's own."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from datapipe.engine.plan import build_stage, make_spec
    from datapipe.engine.runner import run_pipeline
    from datapipe.engine.shuffles import StepShuffle
    from datapipe.engine.tasks import runs
    from datapipe.engine.tasks.reduce import reduce_partition
    from datapipe.engine.work_files import WorkFiles
    from datapipe.pipeline.load import load_pipeline
    from datapipe.run_folder.layout import RunFolder
    from datapipe.stages.global_stage import PartitionStep, step_of
    from datapipe.storage.cache import cache_dir

    # Six partitions (the demo's two map tasks would give two with auto): a partition's share of
    # a round's files is then small enough to tell from the whole files.
    # Runs of many small row groups (a crawl's hold ~1 MiB each; the demo's runs are a few kB): a range of
    # parts is then a part of each run, as it is at crawl scale.
    monkeypatch.setattr(runs, "RUN_GROUP_BYTES", 256)
    monkeypatch.setattr(runs, "MIN_GROUP_ROWS", 8)
    uri = f"s3://{BUCKET}/runs/parts6"
    pipeline = load_pipeline(pipeline_file(tmp_path / "p", f"s3://{BUCKET}/data", uri, partitions=6, partition_rows=30))
    remote = run_pipeline(pipeline, in_process=True, show_progress=False, log=lambda m: None)
    monkeypatch.setenv("DATAPIPE_CACHE_DIR", str(tmp_path / "other-node"))
    folder = RunFolder(uri)
    folder.pull(full=True)  # its markers, as the driver plans the tasks from them (a task is handed its inputs)
    spec = make_spec(pipeline, folder.root, cache_dir(), remote.run["split"]["target_bytes"])
    sizes = {  # every object's size, as the store lists it
        o["Key"][len("runs/parts6/") :]: o["Size"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="runs/parts6/")
        for o in page.get("Contents", [])
    }
    counting = s3.counting
    shuffled = 0
    for segment in spec.segments:
        step = step_of(build_stage(spec, segment.compute_global), PartitionStep) if segment.compute_global else None
        if step is None:
            continue
        shuffle = StepShuffle(spec, segment, step)
        tasks = shuffle.readers(folder, 0)  # as the driver lists them, from the markers
        assert tasks is not None and len(tasks) > 2
        task = tasks[0]
        inputs = [folder.root / f.path for f in task.inputs]
        whole = sum(sizes[f.path] for f in task.inputs)
        owned = shuffle.map_outputs(folder, shuffle.owned(task)) if step.owner_reads else None
        # What reading its parts takes: each run's footer and the row groups that may hold them.
        needed = 0
        for f in task.inputs:
            run = pq.ParquetFile(pa.BufferReader(s3.get_object(Bucket=BUCKET, Key=f"runs/parts6/{f.path}")["Body"].read()))
            groups = runs.groups_in(run, "part", task.lo, task.hi)
            meta = run.metadata
            needed += f.footer + 8
            needed += sum(meta.row_group(g).column(c).total_compressed_size for g in groups for c in range(meta.num_columns))
        before = counting.snapshot()
        marker = reduce_partition(spec, segment, 0, task, owned)
        used = counting.since(before)
        assert marker["rows_in"] > 0
        # Its row groups of the round's runs (one of several parts each), their footers, and a few
        # map-output rows (MinHash's owner answers none in round 0): under the runs' whole size, which a
        # download of each would have moved.
        assert 0 < used["bytes_read"] <= needed * 1.1 < whole, (used, needed, whole)
        assert not [p for p in inputs if p.exists()]  # read in place, not mirrored
        out = WorkFiles(folder).partition_output(segment.index, 0, 0, fetch=False)
        key = f"runs/parts6/{out.relative_to(folder.root).as_posix()}"
        if out.exists():  # the same rows as the run's own task wrote (a partition with none writes no file)
            theirs = pq.read_table(pa.BufferReader(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()))
            assert pq.read_table(out).equals(theirs)
        else:
            assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix=key)
        shuffled += 1
    assert shuffled == 2  # dedup and minhash


def test_sql_and_loader_read_the_run_folder_on_s3(s3, runs) -> None:
    from datapipe.loader import PackedDataset

    local, _, tmp = runs
    query = "select status, stage, reason, count(*) as n from documents group by all order by all"
    on_s3 = datapipe("sql", f"s3://{BUCKET}/runs/full", query, "--format", "csv")
    assert on_s3.returncode == 0, on_s3.stderr
    assert on_s3.stdout == datapipe("sql", str(local.root), query, "--format", "csv").stdout
    text = datapipe("sql", f"s3://{BUCKET}/runs/full", "select count(*) from kept_docs where length(text) > 0", "--format", "csv")
    assert text.returncode == 0, text.stderr  # the text views read the Parquet files on S3 in place
    assert int(text.stdout.split()[-1]) == local.run["counts"]["kept"]
    mixture = datapipe("stats", f"s3://{BUCKET}/runs/full")
    assert mixture.returncode == 0 and "web_zh" in mixture.stdout, mixture.stderr
    doc = datapipe(
        "sql", str(local.root), "select id from documents where status = 'kept' order by id limit 1", "--format", "csv"
    ).stdout.split()[-1]
    explained = datapipe("explain", f"s3://{BUCKET}/runs/full", doc)
    assert explained.returncode == 0 and doc in explained.stdout, explained.stderr
    assert explained.stdout == datapipe("explain", str(local.root), doc).stdout
    report = datapipe("report", f"s3://{BUCKET}/runs/full", "--html", str(tmp / "report.html"))
    assert report.returncode == 0 and "web_zh" in (tmp / "report.html").read_text(encoding="utf-8"), report.stderr

    def rows(source: str) -> list[np.ndarray]:  # remote shards are copied to cache_dir (verified by sha256)
        ds = PackedDataset(source, backend="numpy", batch_size=4, cache_dir=str(tmp / "shard-cache"))
        return [b["input_ids"].copy() for _, b in zip(range(6), ds)]

    got, want = rows(f"s3://{BUCKET}/runs/full"), rows(str(local.root))
    assert len(got) == len(want) == 6
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("kill_at", ["map1:1", "pack:1"])
def test_kill_and_resume_on_s3_from_the_store_alone(s3, runs, tmp_path: Path, kill_at: str) -> None:
    from datapipe.storage.uri import mirror_of

    _, remote, tmp = runs
    uri = f"s3://{BUCKET}/runs/kill-{kill_at.replace(':', '-')}"
    pipe = pipeline_file(tmp_path, f"s3://{BUCKET}/data", uri)
    killed = datapipe("run", str(pipe), "--in-process", "--no-progress", env={"DATAPIPE_FAULT_KILL_AT": kill_at})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    key = uri.split("/", 3)[3]
    assert b'"status": "running"' in s3.get_object(Bucket=BUCKET, Key=f"{key}/run.json")["Body"].read()
    # Resume on "another machine": no local mirror at all, only what the store holds. An object that
    # no marker names (an upload of a killed attempt) must be neither trusted nor kept.
    shutil.rmtree(mirror_of(uri))
    s3.put_object(Bucket=BUCKET, Key=f"{key}/docs/web_zh/zz-orphan.parquet", Body=b"not a committed output")
    resumed = datapipe("run", str(pipe), "--in-process", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    assert "taking over the lock of a driver that is gone" in resumed.stderr
    on_s3 = download_run(s3, key, tmp_path / "from-s3")
    assert not (on_s3 / "docs" / "web_zh" / "zz-orphan.parquet").exists()
    want = download_run(s3, "runs/full", tmp_path / "full")
    assert fingerprint(on_s3) == fingerprint(want)
    run = json.loads((on_s3 / "run.json").read_text())
    assert run["status"] == "complete" and run["attempts"] == 2
    assert run["counts"] == remote.run["counts"]
    if kill_at == "pack:1":  # a complete run started again from an empty mirror: no task redone
        shutil.rmtree(mirror_of(uri))
        again = datapipe("run", str(pipe), "--in-process", "--no-progress")
        assert again.returncode == 0 and "already done" in again.stderr, again.stderr
        assert fingerprint(download_run(s3, key, tmp_path / "again")) == fingerprint(want)


@pytest.mark.ray
def test_ray_run_on_s3_equals_the_in_process_run(s3, runs, tmp_path: Path) -> None:
    """Tasks in Ray workers commit to the store themselves (their own uploads and markers)."""
    _, remote, _ = runs
    pipe = pipeline_file(tmp_path, f"s3://{BUCKET}/data", f"s3://{BUCKET}/runs/ray")
    proc = datapipe("run", str(pipe), "--num-cpus", "2", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    run = json.loads(s3.get_object(Bucket=BUCKET, Key="runs/ray/run.json")["Body"].read())
    assert run["counts"] == remote.run["counts"]
    assert {i["path"] for i in run["inputs"]} == {f"s3://{BUCKET}/data/{f.name}" for f in DATA.glob("*.jsonl")}
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="runs/ray/_work/markers/map0/")["Contents"]
    markers = [json.loads(s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()) for o in listed]
    assert markers and all(m["node"] != "local" and m["files"] for m in markers)  # committed by Ray workers
    assert fingerprint(download_run(s3, "runs/ray", tmp_path / "ray")) == fingerprint(
        download_run(s3, "runs/full", tmp_path / "full")
    )


def test_export_reads_the_run_folder_on_s3(s3, runs, tmp_path: Path) -> None:
    """`datapipe export s3://...` on a machine that never saw the run (an empty cache, so no mirror)
    writes the same files as the export of the same run made locally, and records it on the store."""
    local, _, _ = runs
    uri = f"s3://{BUCKET}/runs/full"

    def files(folder: Path) -> dict[str, bytes]:  # data_path strings name the folder: compare without it
        return {
            p.relative_to(folder).as_posix(): p.read_bytes().replace(str(folder).encode(), b"OUT")
            for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "export-manifest.json"
        }

    for fmt, opts in (("jsonl", ["--columns", "id,text,input_ids"]), ("megatron", [])):
        out = tmp_path / f"from-s3-{fmt}"
        got = datapipe(
            "export",
            uri,
            "--format",
            fmt,
            *opts,
            "--output",
            str(out),
            env={"DATAPIPE_CACHE_DIR": str(tmp_path / f"cache-{fmt}")},
        )
        assert got.returncode == 0, got.stderr
        want = datapipe("export", str(local.root), "--format", fmt, *opts, "--output", str(tmp_path / f"local-{fmt}"))
        assert want.returncode == 0, want.stderr
        assert files(out) == files(tmp_path / f"local-{fmt}") and files(out)
    # Documents and token lists were streamed from the store: the mirror holds the run's own small
    # files, the markers (each file read is checked against the size and sha256 its task recorded)
    # and the one shard read for the tokenizer's facts.
    mirrored = sorted(p.as_posix().split("/runs/full/", 1)[1] for p in (tmp_path / "cache-jsonl").rglob("*") if p.is_file())
    assert [m for m in mirrored if not m.startswith(("shards/", "_work/markers/"))] == ["exports/jsonl.json", "run.json"]
    assert all(m.endswith(".json") for m in mirrored if m.startswith("_work/"))
    assert len([m for m in mirrored if m.endswith(".arrow")]) == 1, mirrored
    record = json.loads(s3.get_object(Bucket=BUCKET, Key="runs/full/exports/jsonl.json")["Body"].read())
    assert record["output"] == str(tmp_path / "from-s3-jsonl") and record["documents"] == local.run["counts"]["kept"]
    missing = datapipe("export", f"s3://{BUCKET}/runs/never", "--format", "jsonl", "--output", str(tmp_path / "m"))
    assert missing.returncode == 2 and "no run.json there" in missing.stderr and "Traceback" not in missing.stderr
    # The same run with _work/ deleted from the store (markers and token lists): documents come from
    # docs/ as listed, tokens are cut back out of the packed shards.
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="runs/full/"):
        for obj in page.get("Contents", []):
            if not obj["Key"].startswith("runs/full/_work/"):
                s3.copy_object(
                    Bucket=BUCKET,
                    Key=obj["Key"].replace("runs/full/", "runs/no-work/", 1),
                    CopySource={"Bucket": BUCKET, "Key": obj["Key"]},
                )
    out = tmp_path / "no-work"
    got = datapipe(
        "export",
        f"s3://{BUCKET}/runs/no-work",
        "--format",
        "jsonl",
        "--columns",
        "id,text,input_ids",
        "--output",
        str(out),
        env={"DATAPIPE_CACHE_DIR": str(tmp_path / "cache-no-work")},
    )
    assert got.returncode == 0, got.stderr
    assert files(out) == files(tmp_path / "local-jsonl")


def _objects(client, prefix: str) -> dict[str, bytes]:
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            if not obj["Key"].endswith("/"):  # folder markers pyarrow leaves when it deletes a folder's last object
                out[obj["Key"][len(prefix) + 1 :]] = client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
    return out


@pytest.mark.parametrize("fmt", ["jsonl", "mds", "megatron"])
def test_export_to_s3_resumes_from_the_store_alone(s3, runs, tmp_path: Path, fmt: str) -> None:
    """`--output s3://...`: the objects equal a local export's files, byte for byte. Killed after two
    parts, the export resumes on a machine with an empty cache (no staging folder) from the store's
    manifest, skips the committed parts and ends with the same objects."""
    local, _, _ = runs
    opts = {"jsonl": ["--docs-per-file", "40"], "mds": ["--mds-size-limit", "20000"], "megatron": []}[fmt]
    want_dir = tmp_path / "local"
    assert datapipe("export", str(local.root), "--format", fmt, *opts, "-o", str(want_dir)).returncode == 0
    want = {
        p.relative_to(want_dir).as_posix(): p.read_bytes().replace(str(want_dir).encode(), b"OUT")
        for p in want_dir.rglob("*")
        if p.is_file() and p.name not in ("export-manifest.json", ".datapipe.lock")
    }
    prefix = f"exports/{fmt}"

    def export(cache: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return datapipe(
            "export",
            str(local.root),
            "--format",
            fmt,
            *opts,
            "-o",
            f"s3://{BUCKET}/{prefix}",
            env={"DATAPIPE_CACHE_DIR": str(tmp_path / cache), **(env or {})},
        )

    if fmt != "megatron":  # megatron writes one part per source and split: kill after the second
        killed = export("cache-a", {"DATAPIPE_FAULT_KILL_AT": "export:2"})
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert len(json.loads(_objects(s3, prefix)["export-manifest.json"])["parts"]) == 2
    done = export("cache-b")
    assert done.returncode == 0, done.stderr
    if fmt != "megatron":
        assert "2 already done)" in done.stdout
    got = {
        k: v.replace(f"s3://{BUCKET}/{prefix}".encode(), b"OUT")
        for k, v in _objects(s3, prefix).items()
        if k != "export-manifest.json"
    }
    assert got == want and len(want) > 2
    staged = [
        p
        for p in (tmp_path / "cache-b").rglob("*")  # but for the manifest and the export's lock file
        if p.is_file() and p.name not in ("export-manifest.json", ".datapipe.lock")
    ]
    assert staged == []  # every file was uploaded and its local copy removed
    again = export("cache-c")  # everything committed: nothing is written again
    assert again.returncode == 0 and "0 files written" in again.stdout, again.stderr
    redo = datapipe("export", str(local.root), "--format", fmt, *opts, "-o", f"s3://{BUCKET}/{prefix}", "--fresh")
    assert redo.returncode == 0 and " 0 already done)" in redo.stdout, redo.stderr  # --fresh on the store
    assert {
        k: v.replace(f"s3://{BUCKET}/{prefix}".encode(), b"OUT")
        for k, v in _objects(s3, prefix).items()
        if k != "export-manifest.json"
    } == want
    other = datapipe("export", str(local.root), "--format", "jsonl", "-o", f"s3://{BUCKET}/{prefix}")
    assert other.returncode == 2 and "other settings" in other.stderr  # other options for the same folder
    if fmt == "jsonl":  # where the export may write is checked before any format's code (export/target.py)
        inputs = _objects(s3, "data")
        occupied = datapipe("export", str(local.root), "--format", fmt, "-o", f"s3://{BUCKET}/data")
        assert occupied.returncode == 2 and "is not empty and holds no export-manifest.json" in occupied.stderr
        assert _objects(s3, "data") == inputs  # someone else's folder: nothing written there
        nobucket = datapipe("export", str(local.root), "--format", fmt, "-o", "s3://no-such-bucket/x")
        assert nobucket.returncode == 2 and "does not exist" in nobucket.stderr and "Traceback" not in nobucket.stderr
    if fmt == "megatron":  # Megatron-Core's own reader, streaming the .bin from S3 (the .idx cached locally)
        indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
        storage_cfg = pytest.importorskip("megatron.core.datasets.object_storage_utils").ObjectStorageConfig(
            path_to_idx_cache=str(tmp_path / "idx-cache"), bin_chunk_nbytes=4096
        )
        data_path = _objects(s3, prefix)["data_path.train.txt"].decode().split()
        assert data_path and all(p.startswith(f"s3://{BUCKET}/{prefix}/") for p in data_path[1::2])
        for remote in data_path[1::2]:
            on_s3 = indexed.IndexedDataset(remote, mmap=False, object_storage_config=storage_cfg)
            here = indexed.IndexedDataset(remote.replace(f"s3://{BUCKET}/{prefix}", str(want_dir)))
            assert len(on_s3) == len(here) > 0
            assert all(np.array_equal(on_s3[i], here[i]) for i in range(len(here)))


def test_clear_errors_for_unusable_remote_paths(s3, tmp_path: Path) -> None:
    scheme = datapipe("validate", str(pipeline_file(tmp_path / "a", "nosuch://bucket/data", "out")))
    assert scheme.returncode == 2 and "Traceback" not in scheme.stderr
    assert "nosuch://bucket/data/web_zh-*.jsonl" in scheme.stderr and "unknown storage scheme 'nosuch'" in scheme.stderr
    bucket = datapipe(
        "run",
        str(pipeline_file(tmp_path / "b", f"s3://{BUCKET}/data", "s3://no-such-bucket/run")),
        "--in-process",
        "--no-progress",
    )
    assert bucket.returncode == 1 and "Traceback" not in bucket.stderr
    assert "s3://no-such-bucket/run: bucket 'no-such-bucket' does not exist" in bucket.stderr
    missing = datapipe("sql", f"s3://{BUCKET}/runs/never", "select 1")
    assert missing.returncode == 2 and "no run.json there" in missing.stderr and "Traceback" not in missing.stderr


def test_lock_record_on_s3_refuses_a_second_driver_and_fresh_wipes_the_store(s3, tmp_path: Path, monkeypatch) -> None:
    from datapipe.run_folder.layout import RunFolder
    from datapipe.run_folder.lock import RunLock, RunLockedError

    keys = ["lk/run.json", "lk/docs/web/a.parquet", "lk/_work/markers/map0/a.json", "lk/stats.duckdb", "lk/notes.txt"]
    for key in keys:
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"{}")
    first = RunFolder(f"s3://{BUCKET}/lk")
    with RunLock(first.root, log=lambda m: None):
        # A driver elsewhere has its own mirror (no shared flock): only the conditional put refuses it.
        monkeypatch.setenv("DATAPIPE_CACHE_DIR", str(tmp_path / "other-machine"))
        second = RunFolder(f"s3://{BUCKET}/lk")
        assert second.root != first.root
        with pytest.raises(RunLockedError, match=f"s3://{BUCKET}/lk is in use by another datapipe driver"):
            RunLock(second.root, log=lambda m: None).acquire()
        monkeypatch.undo()
        first.wipe()  # --fresh: the names datapipe manages go, the user's file stays
    left = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="lk/")["Contents"])
    assert [k for k in left if not k.endswith("/")] == ["lk/notes.txt"]  # the lock record is gone too


# --- inputs read in place: the driver plans from the listing, tasks read their ranges ----------


def _mirror_files(uri: str) -> list[Path]:
    from datapipe.storage.uri import mirror_of

    root = mirror_of(uri)
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


@pytest.mark.parametrize(
    "name,fmt,target",
    [
        ("big.jsonl", "jsonl", 16 << 10),
        ("docs.parquet", "parquet", 64 << 10),
        ("whirlwind_whirlwind.warc.gz", "warc", 64 << 10),
        ("warcio_example-iana.org-chunked.warc", "warc", 128 << 10),
    ],
)
def test_split_planning_and_range_reads_on_s3_equal_the_local_file(s3, tmp_path: Path, name: str, fmt: str, target: int) -> None:
    """Bounds planned through ranged reads of the object equal the local file's; each range read
    from the store gives, in order, exactly the whole local file's records; nothing is downloaded."""
    from datapipe.engine.splits import plan_file
    from datapipe.pipeline.load import SourceConfig
    from datapipe.storage.uri import FETCHED, mirror_of
    from tests.engine.test_split_inputs import _read_all, _real_jsonl
    from tests.support.shared_data import shared_path

    if fmt == "jsonl":
        local = _real_jsonl(tmp_path)
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        texts = [json.loads(line)["text"] for line in shared_path("corpus", "zh_wikipedia.jsonl").read_text().splitlines()[:300]]
        local = tmp_path / name
        pq.write_table(pa.table({"text": texts}), local, row_group_size=25)
    else:
        local = tmp_path / name
        data = shared_path("web", "warc", name).read_bytes()
        local.write_bytes(data * (600_000 // len(data)))  # copies: several ranges of the target size
    key = f"split-{fmt}/{name}"
    s3.upload_file(str(local), BUCKET, key)
    remote = mirror_of(f"s3://{BUCKET}/{key}")
    size = local.stat().st_size

    before = (FETCHED.bytes, FETCHED.downloads)
    ranges = plan_file(str(remote), name, fmt, 0, target)
    planned = FETCHED.bytes - before[0]
    assert [(r.start, r.end) for r in ranges] == [(r.start, r.end) for r in plan_file(str(local), name, fmt, 0, target)]
    assert len(ranges) >= 3
    if fmt == "jsonl":
        assert planned == 0  # cut evenly: the listing's size is all it takes
    else:
        assert 0 < planned < size / 2  # a footer, or a window after each cut
    print(f"\n{name}: {size:,} bytes, {len(ranges)} ranges, planning read {planned:,} bytes")
    src = SourceConfig(name="s", kind="web" if fmt == "warc" else "text", paths=["x"])
    assert _read_all(fmt, remote, src, ranges) == _read_all(fmt, local, src)
    assert FETCHED.downloads == before[1] and not remote.exists()


def test_driver_plans_a_split_s3_input_without_downloading_it(s3, tmp_path: Path) -> None:
    """`datapipe validate` and planning read no input whole (sizes from the listing, the text_field
    check from the first bytes); the run's tasks read their byte ranges in place; a JSONL split into
    ranges on S3 gives the outputs of the same file unsplit on local disk."""
    from click.testing import CliRunner

    from datapipe.cli import main
    from datapipe.engine.plan import make_spec
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline
    from datapipe.storage.uri import FETCHED, PROBE_BUFFER

    local_data = tmp_path / "data"
    local_data.mkdir()
    big = local_data / "web_zh-0.jsonl"  # every demo document, three times: ~670 KB
    big.write_bytes(b"".join(f.read_bytes() for f in sorted(DATA.glob("*.jsonl"))) * 3)
    s3.upload_file(str(big), BUCKET, f"bigdata/{big.name}")

    def config(data: str, output: str, split: dict) -> Path:
        folder = tmp_path / f"pipeline-{output.rsplit('/', 1)[-1]}"
        # Two partitions: the ranges make ~10 map tasks, and auto would give as many partitions a round.
        cfg = yaml.safe_load(pipeline_file(folder, data, output, partitions=2).read_text())
        cfg["sources"] = cfg["sources"][:1]
        cfg.pop("mixture", None)
        cfg["split"] = split
        return pipeline_file_from(cfg, folder)

    remote_pipe = config(f"s3://{BUCKET}/bigdata", f"s3://{BUCKET}/runs/split", {"target_bytes": 65536, "min_bytes": 4096})
    before = (FETCHED.bytes, FETCHED.requests, FETCHED.downloads)
    validated = CliRunner().invoke(main, ["validate", str(remote_pipe)])
    assert validated.exit_code == 0, validated.output
    pipeline = load_pipeline(remote_pipe)
    spec = make_spec(pipeline, tmp_path / "unused", tmp_path / "cache", 65536)
    driver = FETCHED.bytes - before[0]
    assert len([s for s in spec.shards if not s.inputs[0].whole]) >= 8  # split into ranges
    assert FETCHED.downloads == before[2] and _mirror_files(f"s3://{BUCKET}/bigdata") == []
    assert driver <= 2 * PROBE_BUFFER < big.stat().st_size / 5  # the first records, twice (validate, load)
    print(
        f"\ndriver: {driver:,} bytes in {FETCHED.requests - before[1]} requests for a "
        f"{big.stat().st_size:,}-byte input split in {len(spec.shards)} ranges"
    )

    run_before = (FETCHED.bytes, FETCHED.requests)
    remote = run_pipeline(pipeline, in_process=True, show_progress=False, log=lambda m: None)
    read = FETCHED.bytes - run_before[0]
    print(f"run (lines pre-pass + map tasks): {read:,} bytes read in place in {FETCHED.requests - run_before[1]} requests")
    assert read <= 2 * big.stat().st_size + len(spec.shards) * (64 << 10)  # each range twice, and a tail
    assert FETCHED.downloads == before[2] and _mirror_files(f"s3://{BUCKET}/bigdata") == []
    local = run_pipeline(
        load_pipeline(config(str(local_data), str(tmp_path / "local-out"), {})),
        in_process=True,
        show_progress=False,
        log=lambda m: None,
    )
    assert local.run["split"]["map_tasks"] == 1 and remote.run["split"]["map_tasks"] == len(spec.shards)
    assert remote.run["counts"] == local.run["counts"]
    assert fingerprint(download_run(s3, "runs/split", tmp_path / "from-s3")) == fingerprint(local.root)


def pipeline_file_from(cfg: dict, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    return path


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_compressed_jsonl_on_s3_is_streamed_and_equals_the_local_file(s3, tmp_path: Path, suffix: str) -> None:
    """A compressed JSONL (one task: no ranges) is decompressed from the object stream, not a download."""
    import pyarrow as pa

    from datapipe.pipeline.load import SourceConfig
    from datapipe.readers import reader_path
    from datapipe.storage.uri import FETCHED, mirror_of
    from tests.engine.test_split_inputs import _read_all, _real_jsonl

    raw = _real_jsonl(tmp_path).read_bytes()
    local = tmp_path / f"big{suffix}"
    with pa.output_stream(str(local), compression="gzip" if suffix.endswith(".gz") else "zstd") as out:
        out.write(raw)
    s3.upload_file(str(local), BUCKET, f"compressed/{local.name}")
    remote = reader_path(mirror_of(f"s3://{BUCKET}/compressed/{local.name}"), "jsonl")
    before = (FETCHED.bytes, FETCHED.downloads)
    src = SourceConfig(name="s", paths=["x"])
    whole = _read_all("jsonl", local, src)
    assert _read_all("jsonl", remote, src) == whole and len(whole[0]) > 200
    assert FETCHED.downloads == before[1] and FETCHED.bytes - before[0] == local.stat().st_size
    assert not remote.exists()
